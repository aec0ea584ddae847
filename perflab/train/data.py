"""The training data: synthetic images of any shape and class count, synthetic token
sequences for language models, Fashion-MNIST or any of torchvision's image datasets (the real
torchvision classes); batches in a resume-safe order, optionally kept on the device.

What the data decides about the model (one item's shape and dtype, the classes or vocabulary
its output scores, what an item is for throughput) is a :class:`Spec`, the one place that says
it. The order of epoch e is a permutation seeded by (seed, e), cut into global batches; with
several data-parallel ranks, rank r takes the r-th slice of every global batch. So one
device and N devices see exactly the same global batches (what the equivalence tests use).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sized, cast

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

from perflab.config.schema import DataConfig
from perflab.errors import ConfigError, did_you_mean, first_line
from perflab.store import files

SHAPE = (1, 28, 28)  # Fashion-MNIST's, and the synthetic set's where neither the user nor the model says
CLASSES = 10
VOCAB, SEQ_LEN = 256, 64  # data=tokens where neither the user nor the model says
TOKEN_NOISE = 0.1  # tokens: the share of tokens drawn at random instead of following their predecessor
SYNTHETIC_BUDGET = 2**30  # bytes: a synthetic set of unset size holds at most this much (large items)


@dataclass(frozen=True)
class Spec:
    """What the data decides about a model: one item's input ``shape`` (without the batch),
    the ``classes`` its output scores (the vocabulary for tokens), and whether items are token
    ids (``(B, T)`` in, ``(B, T, vocab)`` out, one target per token) or inputs with one label
    (``(B, *shape)`` in, ``(B, classes)`` out)."""

    shape: tuple[int, ...]
    classes: int
    tokens: bool = False
    also: str = ""  # other inputs the model gets beside this one (a two-tower model's text), as said

    @property
    def unit(self) -> str:
        """What throughput counts: ``tokens/s``, ``images/s`` (C x H x W items), ``samples/s``."""
        return "tokens" if self.tokens else "images" if len(self.shape) == 3 else "samples"

    @property
    def batch_unit(self) -> str:
        """What a batch counts (``trainer.batch_size``): ``sequences`` of tokens, else the items."""
        return "sequences" if self.tokens else self.unit

    @property
    def items_per_sample(self) -> int:
        """Items (what throughput counts) in one sample of a batch: a sequence holds T tokens."""
        return self.shape[0] if self.tokens else 1

    @property
    def images(self) -> bool:
        return not self.tokens and len(self.shape) == 3

    def factory_args(self) -> dict[str, int]:
        """What a model factory may take by name: the class count, the input channels, the
        vocabulary size and the sequence length."""
        if self.tokens:
            return {"vocab_size": self.classes, "seq_len": self.shape[0]}
        return {"num_classes": self.classes, **({"in_channels": self.shape[0]} if len(self.shape) >= 2 else {})}

    def example(self, batch: int, device: Any = "cpu") -> torch.Tensor:
        """A random input batch of the data's shape and dtype (``device="meta"``: shapes only)."""
        if self.tokens:
            if torch.device(device).type == "meta":
                return torch.empty(batch, *self.shape, dtype=torch.long, device=device)
            return torch.randint(0, self.classes, (batch, *self.shape), device=device)
        return torch.randn(batch, *self.shape, device=device)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, self.shape[0], self.classes) if self.tokens else (batch, self.classes)

    def describe(self) -> str:
        """The input as a user reads it: ``(B, 3, 16, 16) float32`` / ``(B, 64) token ids < 256``."""
        dims = ", ".join(map(str, self.shape))
        main = f"(B, {dims}) token ids < {self.classes}" if self.tokens else f"(B, {dims}) float32"
        return f"{main} + {self.also}" if self.also else main

    def check_channels_last(self, on: bool) -> None:
        """Refuse ``experiment.channels_last=true`` for inputs that are no images (before any work)."""
        if on and not self.images:
            raise ConfigError(
                "experiment.channels_last",
                True,
                "false with this data",
                problem=f"NHWC is a layout of images (C, H, W); the inputs here are {self.describe()}",
            )


@dataclass
class Splits:
    train: Dataset
    test: Dataset
    note: str = ""


TRAIN_SIZE, TEST_SIZE = 60_000, 10_000  # Fashion-MNIST's, and the synthetic sets' by default
FASHION_ALLOWED = (
    "a folder with FashionMNIST/raw/*-ubyte files (torchvision's layout), "
    "data.download=true (needs internet), or data=synthetic"
)


def fitted(cfg: DataConfig, model: Mapping[str, Any] | None = None) -> DataConfig:
    """The data config with each key the user left null filled: by the model where it says
    (``model``: perflab.models.expects -- its input size, its classes, its vocabulary, its
    ``positions``), else by perflab's defaults. What the user set stays as set."""
    said = dict(model or {})
    return replace(
        cfg,
        shape=list(cfg.shape or said.get("shape") or SHAPE),
        num_classes=cfg.num_classes or said.get("num_classes") or CLASSES,
        vocab_size=cfg.vocab_size or said.get("vocab_size") or VOCAB,
        seq_len=cfg.seq_len or min(SEQ_LEN, said.get("positions") or SEQ_LEN),
    )


def spec(cfg: DataConfig) -> Spec:
    """The data's :class:`Spec`, from the config alone except for torchvision's datasets
    (whose first item and class list are read); a key left null takes perflab's default
    (:func:`fitted` fills it from the model first)."""
    full = fitted(cfg)
    if cfg.name == "tokens":
        return Spec((full.seq_len or SEQ_LEN,), full.vocab_size or VOCAB, tokens=True)
    if cfg.name == "synthetic":
        return Spec(tuple(full.shape or SHAPE), full.num_classes or CLASSES)
    if cfg.name == "fashion_mnist":
        return Spec(SHAPE, CLASSES)
    ds = torchvision_dataset(cfg, train=True)
    return Spec(tuple(ds[0][0].shape), classes_of(ds))


def sizes(cfg: DataConfig) -> tuple[int, int]:
    """(train, test) items of a synthetic set: as configured, else 60000 / 10000, fewer where
    the items are large (at most SYNTHETIC_BUDGET bytes for both)."""
    item = 4 * math.prod(spec(cfg).shape) if cfg.name == "synthetic" else 8 * 2 * spec(cfg).shape[0]
    fit = max(1, SYNTHETIC_BUDGET // item * TRAIN_SIZE // (TRAIN_SIZE + TEST_SIZE))
    train = cfg.train_size or min(TRAIN_SIZE, fit)
    return train, cfg.test_size or max(1, min(TEST_SIZE, fit * TEST_SIZE // TRAIN_SIZE))


def load(cfg: DataConfig, seed: int) -> Splits:
    if cfg.name in ("synthetic", "tokens"):
        n_train, n_test = sizes(cfg)
        smaller = "" if cfg.train_size or n_train == TRAIN_SIZE else f", {n_train} / {n_test} items (1 GiB)"
        s = spec(cfg)
        if cfg.name == "tokens":
            make = lambda n, split: token_sequences(n, s.shape[0], s.classes, seed, split)  # noqa: E731
            note = f"synthetic token sequences (vocabulary {s.classes}, {s.shape[0]} tokens){smaller}"
        else:
            make = lambda n, split: synthetic(n, seed, cfg.noise, split, s.shape, s.classes)  # noqa: E731
            note = f"synthetic learnable data (noise {cfg.noise}){smaller}"
        return Splits(make(n_train, 0), make(n_test, 1), note=note)
    if cfg.name == "torchvision":
        train, test = torchvision_dataset(cfg, train=True), torchvision_dataset(cfg, train=False)
        return Splits(_first(train, cfg.train_size), _first(test, cfg.test_size), note=f"torchvision {cfg.dataset}")
    train, test = fashion_mnist(cfg, train=True), fashion_mnist(cfg, train=False)
    return Splits(_first(train, cfg.train_size), _first(test, cfg.test_size))


def check(cfg: DataConfig, batch_size: int, global_batch: int) -> None:
    """What can be refuted without loading the data: the Fashion-MNIST files are there, a
    torchvision dataset that exists, a training set at least one global batch large,
    DataLoader workers the machine can run."""
    cpus = os.cpu_count() or 1
    if cfg.workers > cpus:
        raise ConfigError("data.workers", cfg.workers, f"0 to {cpus} (this machine's CPUs)")
    unreadable = files.not_a_folder(Path(cfg.root)) if cfg.name in ("fashion_mnist", "torchvision") else None
    if unreadable is not None:  # a FIFO, a symlink loop, no permission: said here, not by the loader
        allowed = FASHION_ALLOWED if cfg.name == "fashion_mnist" else "a folder you can read"
        raise ConfigError("data.root", cfg.root, allowed, problem=unreadable)
    if cfg.name == "fashion_mnist" and (not cfg.download or fashion_files_there(cfg.root)):
        if not fashion_files_there(cfg.root):
            raise ConfigError(
                "data.root", str(Path(cfg.root).resolve()), FASHION_ALLOWED, problem="no Fashion-MNIST files there"
            )
        check_fashion_files(cfg.root)
    if cfg.name == "torchvision":
        dataset_class(cfg.dataset)
    train_size = sizes(cfg)[0] if cfg.name in ("synthetic", "tokens") else cfg.train_size or TRAIN_SIZE
    if global_batch > train_size:  # a smaller file is still caught once loaded
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
            with files.open_regular(path) as f:
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


def dataset_class(name: str | None) -> Any:
    """``torchvision.datasets.<name>``: one that takes ``train=`` or ``split=``, or one line."""
    import torchvision.datasets as tvd

    cls = getattr(tvd, str(name), None)
    if _split_argument(cls) is None:
        usable = sorted(n for n in tvd.__all__ if _split_argument(getattr(tvd, n, None)))
        hint = did_you_mean(name, usable)
        raise ConfigError(
            "data.dataset",
            name,
            "a dataset of torchvision.datasets with a train/test split: " + ", ".join(usable),
            problem=f"not one of torchvision's split datasets{hint}",
        )
    return cls


def _split_argument(cls: Any) -> str | None:
    """How a torchvision dataset class picks its split: ``train`` (True/False) or ``split``."""
    if not isinstance(cls, type):
        return None
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    return next((p for p in ("train", "split") if p in params), None)


def torchvision_dataset(cfg: DataConfig, train: bool) -> Dataset:
    """The real torchvision class; files missing or unreadable under data.root are one line."""
    from torchvision.transforms import ToTensor

    cls = dataset_class(cfg.dataset)
    how = {"train": train} if _split_argument(cls) == "train" else {"split": "train" if train else "test"}
    try:
        return cast(Dataset, cls(cfg.root, download=cfg.download, transform=ToTensor(), **how))
    except (RuntimeError, OSError, ValueError) as err:
        raise ConfigError(
            "data.root",
            str(Path(cfg.root).resolve()),
            f"a folder holding torchvision's {cfg.dataset} files in its layout, or data.download=true (needs internet)",
            problem=f"cannot read {cfg.dataset} there ({first_line(err)})",
        ) from None


def classes_of(ds: Dataset) -> int:
    """A torchvision dataset's class count: its class list, else its largest label + 1."""
    classes = getattr(ds, "classes", None)
    if classes:
        return len(classes)
    labels = getattr(ds, "targets", None) if getattr(ds, "targets", None) is not None else getattr(ds, "labels", None)
    if labels is not None:
        return int(torch.as_tensor(labels).max()) + 1
    return int(max(int(ds[i][1]) for i in range(size(ds)))) + 1


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


def synthetic(
    n: int, seed: int, noise: float, split: int, shape: tuple[int, ...] = SHAPE, classes: int = CLASSES
) -> TensorDataset:
    """``classes`` smooth random templates of ``shape`` plus Gaussian noise: learnable, but not
    trivially. The templates depend only on ``seed``; the samples on (seed, split), so train
    and test share classes but not images. (At 1x28x28 and 10 classes: the set perflab has
    always used, value for value.)"""
    spatial = shape[1:] if len(shape) >= 2 else shape
    coarse = torch.rand(
        classes,
        shape[0] if len(shape) >= 2 else 1,
        *(max(1, math.ceil(s / 4)) for s in spatial),
        generator=torch.Generator().manual_seed(seed),
    )
    g = torch.Generator().manual_seed(seed * 1000 + 1 + split)
    labels = torch.randint(0, classes, (n,), generator=g)
    images = noise * torch.randn(n, *shape, generator=g)
    for chunk in torch.arange(n).split(1024):  # templates per chunk: 1000 classes at 224x224 would not fit
        images[chunk] += _smooth(coarse[labels[chunk]], spatial).reshape(len(chunk), *shape)
    return TensorDataset(images, labels)


def _smooth(coarse: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """Coarse random templates interpolated up to ``size`` (1-D: linear, 2-D: bilinear)."""
    if len(size) == 1:
        return F.interpolate(coarse, size=size, mode="linear", align_corners=False)
    if len(size) == 2:
        return F.interpolate(coarse, size=size, mode="bilinear", align_corners=False)
    return F.interpolate(coarse, size=size, mode="nearest")


def token_sequences(n: int, seq_len: int, vocab: int, seed: int, split: int) -> TensorDataset:
    """``n`` sequences of ``seq_len`` + 1 token ids where each token follows from the one
    before it by a fixed random table, except a share TOKEN_NOISE drawn at random: a
    language model can learn it (best next-token accuracy ~0.9). Items are (inputs, targets),
    the targets being the inputs shifted by one."""
    successor = torch.randint(0, vocab, (vocab,), generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1000 + 1 + split)
    seq = torch.empty(n, seq_len + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    jump = torch.rand(n, seq_len, generator=g) < TOKEN_NOISE
    random = torch.randint(0, vocab, (n, seq_len), generator=g)
    for t in range(seq_len):
        seq[:, t + 1] = torch.where(jump[:, t], random[:, t], successor[seq[:, t]])
    return TensorDataset(seq[:, :-1].contiguous(), seq[:, 1:].contiguous())


def as_tensors(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole split as (inputs, labels): float32 images in [0, 1] read from a torchvision
    dataset's arrays (MNIST-style N x H x W, CIFAR-style N x H x W x C), else item by item."""
    if isinstance(ds, TensorDataset):
        return ds.tensors[0], ds.tensors[1]
    base, index = (ds.dataset, list(ds.indices)) if isinstance(ds, torch.utils.data.Subset) else (ds, None)
    data, targets = getattr(base, "data", None), getattr(base, "targets", None)
    if data is not None and targets is not None and getattr(data, "ndim", 0) in (3, 4):
        images = torch.as_tensor(data)
        images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)  # to N x C x H x W
        images = images.float().div_(255)
        labels = torch.as_tensor(targets, dtype=torch.long)
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

    def close(self) -> None:
        """End the loader's worker processes now. They persist across epochs, and the loader and
        its sampler refer to each other: left alone, they would outlive the job until a garbage
        collection, whose shutdown of them then stalls whoever triggered it (5 s per loader)."""
        self._loader = None  # the only reference to the loader: its iterator's workers end with it

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
