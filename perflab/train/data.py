"""Fashion-MNIST through torchvision's real ``FashionMNIST`` class, or a synthetic *learnable*
set of the same shapes; batches in a resume-safe order, optionally kept on the device.

The order of epoch e is a permutation seeded by (seed, e), cut into global batches; with
several data-parallel ranks, rank r takes the r-th slice of every global batch. So one
device and N devices see exactly the same global batches (what the equivalence tests use).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sized, cast

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from perflab.errors import ConfigError, first_line
from perflab.schema import DataConfig

SHAPE = (1, 28, 28)
CLASSES = 10


@dataclass
class Splits:
    train: Dataset
    test: Dataset
    note: str = ""


TRAIN_SIZE, TEST_SIZE = 60_000, 10_000  # Fashion-MNIST's, and the synthetic set's by default
FASHION_ALLOWED = (
    "a folder with FashionMNIST/raw/*-ubyte files (torchvision's layout), "
    "data.download=true (needs internet), or data=synthetic"
)


def load(cfg: DataConfig, seed: int) -> Splits:
    if cfg.name == "synthetic":
        return Splits(
            synthetic(cfg.train_size or TRAIN_SIZE, seed, cfg.noise, split=0),
            synthetic(cfg.test_size or TEST_SIZE, seed, cfg.noise, split=1),
            note=f"synthetic learnable data (noise {cfg.noise})",
        )
    train, test = fashion_mnist(cfg, train=True), fashion_mnist(cfg, train=False)
    return Splits(_first(train, cfg.train_size), _first(test, cfg.test_size))


def check(cfg: DataConfig, batch_size: int, global_batch: int) -> None:
    """What can be refuted without loading the data: the Fashion-MNIST files are there, a
    training set at least one global batch large, DataLoader workers the machine can run."""
    cpus = os.cpu_count() or 1
    if cfg.workers > cpus:
        raise ConfigError("data.workers", cfg.workers, f"0 to {cpus} (this machine's CPUs)")
    if cfg.name == "fashion_mnist" and (not cfg.download or fashion_files_there(cfg.root)):
        if not fashion_files_there(cfg.root):
            raise ConfigError(
                "data.root", str(Path(cfg.root).resolve()), FASHION_ALLOWED, problem="no Fashion-MNIST files there"
            )
        check_fashion_files(cfg.root)
    train_size = cfg.train_size or TRAIN_SIZE  # a smaller file is still caught once loaded
    if global_batch > train_size:
        raise ConfigError(
            "trainer.batch_size", batch_size, f"a global batch ({global_batch} here) <= the training set ({train_size})"
        )


# torchvision's FashionMNIST.resources, unzipped: (file, idx dimensions)
FASHION_FILES = {
    "train-images-idx3-ubyte": 3,
    "train-labels-idx1-ubyte": 1,
    "t10k-images-idx3-ubyte": 3,
    "t10k-labels-idx1-ubyte": 1,
}


def fashion_files_there(root: str) -> bool:
    return all((Path(root) / "FashionMNIST" / "raw" / name).is_file() for name in FASHION_FILES)


def check_fashion_files(root: str) -> None:
    """Each Fashion-MNIST file can be read and is what its name says: the idx header (unsigned
    bytes, 3 dimensions of N x 28 x 28 for images, 1 for labels), a size that matches it, as many
    labels as images. Reads the headers only: cheap enough to run before the job. A bad file is
    one line naming it (torchvision answers with a bare AssertionError)."""
    raw = Path(root) / "FashionMNIST" / "raw"
    counts: dict[str, int] = {}
    for name, dims in FASHION_FILES.items():
        path = raw / name
        try:
            with open(path, "rb") as f:
                head = f.read(4 + 4 * dims)
                size = os.fstat(f.fileno()).st_size
        except OSError as err:
            raise ConfigError(
                "data.root", str(Path(root).resolve()), FASHION_ALLOWED, problem=f"cannot read {path} ({err.strerror})"
            ) from None
        shape = (
            [int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
            if len(head) == 4 + 4 * dims
            else []
        )
        want = (shape[0], 28, 28) if dims == 3 and shape else tuple(shape[:1])
        problem = ""
        if len(head) < 4 + 4 * dims or head[:4] != bytes([0, 0, 8, dims]):
            problem = f"not an idx{dims} file of unsigned bytes (its header: {head[:4].hex() or 'empty'})"
        elif tuple(shape) != want:
            problem = f"holds {'x'.join(map(str, shape))} items, not N x 28 x 28 images"
        elif size != 4 + 4 * dims + math.prod(shape):
            problem = f"{size} bytes where its header needs {4 + 4 * dims + math.prod(shape)} (cut short or padded)"
        if problem:
            raise ConfigError("data.root", str(Path(root).resolve()), FASHION_ALLOWED, problem=f"{path}: {problem}")
        counts[name] = shape[0]
    for split in ("train", "t10k"):
        images, labels = counts[f"{split}-images-idx3-ubyte"], counts[f"{split}-labels-idx1-ubyte"]
        if images != labels:
            raise ConfigError(
                "data.root",
                str(Path(root).resolve()),
                FASHION_ALLOWED,
                problem=f"{raw / (split + '-images-idx3-ubyte')}: {images} images but {labels} labels",
            )


def fashion_mnist(cfg: DataConfig, train: bool) -> Dataset:
    """torchvision's FashionMNIST; a missing, unreadable or damaged file is one clear line."""
    import torchvision
    from torchvision.transforms import ToTensor

    if fashion_files_there(cfg.root):  # else torchvision says they are missing (or downloads them)
        check_fashion_files(cfg.root)
    try:
        return torchvision.datasets.FashionMNIST(cfg.root, train=train, download=cfg.download, transform=ToTensor())
    except (RuntimeError, OSError, AssertionError, ValueError) as err:
        problem = "no Fashion-MNIST files there" if "not found" in str(err) else f"cannot read it ({first_line(err)})"
        if cfg.download and "not found" not in str(err):
            problem = f"download failed ({type(err).__name__}: {first_line(err)})"
        raise ConfigError("data.root", str(Path(cfg.root).resolve()), FASHION_ALLOWED, problem=problem) from None


def _first(ds: Dataset, n: int | None) -> Dataset:
    return torch.utils.data.Subset(ds, range(min(n, size(ds)))) if n else ds


def size(ds: Dataset) -> int:
    """How many items a map-style dataset holds (every dataset here has a length)."""
    return len(cast(Sized, ds))


def synthetic(n: int, seed: int, noise: float, split: int) -> TensorDataset:
    """Ten smooth random 28x28 templates plus Gaussian noise: learnable, but not trivially.

    The templates depend only on ``seed``; the samples on (seed, split), so train and test
    share classes but not images.
    """
    coarse = torch.rand(CLASSES, *SHAPE[:1], 7, 7, generator=torch.Generator().manual_seed(seed))
    templates = F.interpolate(coarse, size=SHAPE[1:], mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(seed * 1000 + 1 + split)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    images = templates[labels] + noise * torch.randn(n, *SHAPE, generator=g)
    return TensorDataset(images, labels)


def as_tensors(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as (images float32 Nx1x28x28 in [0,1]-ish, labels int64)."""
    if isinstance(ds, TensorDataset):
        return ds.tensors[0], ds.tensors[1]
    base, index = (ds.dataset, list(ds.indices)) if isinstance(ds, torch.utils.data.Subset) else (ds, None)
    if hasattr(base, "data") and hasattr(base, "targets"):  # torchvision MNIST-style: read the arrays
        images = base.data.unsqueeze(1).float().div_(255)
        labels = torch.as_tensor(base.targets, dtype=torch.long)
        return (images[index], labels[index]) if index is not None else (images, labels)
    xs, ys = zip(*(ds[i] for i in range(size(ds))))
    return torch.stack(xs), torch.as_tensor(ys)


class Batches:
    """One rank's batches for an epoch: deterministic order, optional on-device data."""

    def __init__(
        self,
        ds: Dataset,
        global_batch: int,
        *,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        device: torch.device | None = None,
        on_device: bool = False,
        workers: int = 0,
        pin_memory: bool = False,
        drop_last: bool = True,
    ) -> None:
        self.ds, self.global_batch, self.rank, self.world = ds, global_batch, rank, world
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.device, self.workers, self.pin_memory = device, workers, pin_memory
        self.tensors = tuple(t.to(device) for t in as_tensors(ds)) if on_device else None
        self._loader: DataLoader | None = None

    def __len__(self) -> int:
        n = size(self.ds)
        return n // self.global_batch if self.drop_last else -(-n // self.global_batch)

    def index_batches(self, epoch: int) -> list[torch.Tensor]:
        n = size(self.ds)
        order = (
            torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
            if self.shuffle
            else torch.arange(n)
        )
        batches = (
            list(order[: len(self) * self.global_batch].split(self.global_batch))
            if self.drop_last
            else list(order.split(self.global_batch))
        )
        return [b.tensor_split(self.world)[self.rank] for b in batches]

    def epoch(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.tensors is not None:
            images, labels = self.tensors
            for idx in self.index_batches(epoch):
                idx = idx.to(images.device)
                yield images[idx], labels[idx]
            return
        if self._loader is None:  # built once, so worker processes persist across epochs
            self._sampler = _EpochBatches(self)
            self._loader = DataLoader(
                self.ds,
                batch_sampler=self._sampler,
                num_workers=self.workers,
                pin_memory=self.pin_memory and self.device is not None and self.device.type == "cuda",
                persistent_workers=self.workers > 0,
            )
        self._sampler.epoch = epoch
        for x, y in self._loader:
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            yield x, y


class _EpochBatches:
    """A batch sampler whose order is that of ``Batches.index_batches(epoch)``."""

    def __init__(self, batches: Batches) -> None:
        self.batches, self.epoch = batches, 0

    def __iter__(self) -> Iterator[list[int]]:
        return (b.tolist() for b in self.batches.index_batches(self.epoch))

    def __len__(self) -> int:
        return len(self.batches)
