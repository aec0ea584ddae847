"""The user's own workloads: any model by ``_target_`` (and torchvision's / timm's by name), data
of any shape and token sequences, every metric for any model, and one clear line for each thing
a user's code can get wrong, before anything is timed. The broad matrix (every documented
model, data set, strategy and precision through the training experiment) is slow; one cheap
representative of each path stays in the fast set."""

from __future__ import annotations

import pickle
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import perflab
from perflab import models
from perflab.config.schema import DataConfig, ModelConfig
from perflab.errors import Refused
from perflab.measure import flops
from perflab.train import data
from perflab.train.loop import training_flops_per_item

from conftest import FAST, ROOT

USERPKG = ROOT / "examples" / "userpkg"
TINY = [
    "data.train_size=64",
    "data.test_size=32",
    "trainer.batch_size=16",
    "trainer.epochs=1",
    "results.table=false",
    *FAST,
]
TRANSFORMER = [
    "model._target_=userpkg.models.TinyTransformer",
    "+model.d_model=32",
    "data=tokens",
    "data.vocab_size=32",
    "data.seq_len=16",
]


@pytest.fixture
def userpkg(work, monkeypatch):
    """The example user package importable here and in the worker processes DDP starts."""
    monkeypatch.syspath_prepend(str(USERPKG))
    monkeypatch.setenv("PYTHONPATH", str(USERPKG))
    return work


# --- one line for each mistake, before anything is timed ----------------------------------


@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["model._target_=userpkg.models.SmalCNN"],
            "model._target_=userpkg.models.SmalCNN: userpkg.models has no SmalCNN; did you mean "
            "userpkg.models.SmallCNN?; allowed: a callable's dotted path",
        ),
        (
            ["model._target_=nopkg.models.Net"],
            "model._target_=nopkg.models.Net: no module named nopkg (is its package installed",
        ),
        (
            ["model._target_=userpkg.models.SmallCNN", "+model.widht=8", "data.shape=[3,8,8]"],
            "model.widht=8: userpkg.models.SmallCNN takes no argument widht; did you mean width?; "
            "allowed: the arguments userpkg.models.SmallCNN takes: num_classes, in_channels, width",
        ),
        (
            ["model._target_=userpkg.models.SmallCNN", "+model.num_classes=5"],
            "model.num_classes=5: the data decides num_classes (10 here); allowed: leave it out, "
            "and set data.num_classes instead",
        ),
        (
            ["model._target_=userpkg.models.TinyTransformer"],  # a language model on the default images
            "model._target_=userpkg.models.TinyTransformer: userpkg.models.TinyTransformer needs vocab_size, "
            "seq_len, which this data does not decide (it decides num_classes, in_channels); allowed: data=tokens, "
            "which decides vocab_size, seq_len; or each given by hand: +model.vocab_size=... +model.seq_len=...",
        ),
        (
            ["model._target_=os.system"],  # Hydra's own refusal, whole (its sentence spans lines)
            "model._target_=os.system: Hydra refuses it: Target 'os.system' is blocklisted because it allows "
            "config data to control executable behavior",
        ),
        (
            ["model._target_=torch.nn.Flatten", "data.shape=[12]"],
            "model=torch.nn.Flatten: its output (2, 12) does not fit the data (input (2, 12), output (2, 10))",
        ),
        (
            ["model=lenet", "data.shape=[3,16,16]"],
            "model=lenet: it fails on the data's input (2, 3, 16, 16): RuntimeError: ",
        ),
        (
            [*TRANSFORMER, "model.channels_last=true"],
            "model.channels_last=True: NHWC is a layout of images (C, H, W); the inputs here are "
            "(B, 16) token ids < 32; allowed: false with this data",
        ),
        (
            ["data=torchvision", "data.dataset=CIFAR11"],
            "data.dataset=CIFAR11: not one of torchvision's split datasets; ",
        ),
    ],
)
def test_a_users_mistake_is_one_line_before_anything_runs(userpkg, overrides, line):
    with pytest.raises(Refused) as refused:
        perflab.run("quick/train", [*TINY, *overrides])
    assert str(refused.value).startswith(line) and "\n" not in str(refused.value)
    assert not list((userpkg / "outputs").glob("runs/*/results.csv")), "nothing measured, nothing written"


def test_a_compile_experiment_refuses_the_same_way(userpkg):
    with pytest.raises(Refused, match=r"^model._target_=userpkg.models.TinyTransformr: userpkg.models has no"):
        perflab.run("quick/compile", ["model._target_=userpkg.models.TinyTransformr", "data=tokens"])
    with pytest.raises(Refused, match=r"^experiment.model=resnet18: allowed: model=resnet18 instead"):
        perflab.run("quick/compile", ["experiment.model=resnet18"])


# --- the user's models train, with every metric ---------------------------------------------


def test_a_users_transformer_trains_on_tokens_with_every_metric(userpkg):
    df = perflab.run("quick/train", [*TINY, *TRANSFORMER, "trainer.epochs=2", "trainer.lr=0.05"])
    assert (df["status"] == "ok").all(), df[["measurement", "error"]]
    epochs, summary = df[df["measurement"] == "epoch"], df[df["measurement"] == "train"].iloc[0]
    assert (df["items_unit"] == "tokens").all() and summary["batch_unit"] == "sequences"
    assert (epochs["items_per_s"] * epochs["train_s"]).round().eq(64 * 16).all(), "every token once per epoch"
    assert summary["model"] == "userpkg.models.TinyTransformer" and summary["cfg.model.d_model"] == 32
    net = models.build(ModelConfig("userpkg.models.TinyTransformer", args={"d_model": 32}), data.Spec((16,), 32, True))
    assert summary["flops_per_item"] == pytest.approx(training_flops_per_item(net, data.Spec((16,), 32, True)))
    assert summary["flops_per_item"] > 6 * sum(p.numel() for p in net.parameters() if p.dim() == 2) * 0.5
    assert summary["tflops"] == pytest.approx(summary["flops_per_item"] * summary["items_per_s"] / 1e12)
    assert summary["intensity"] > 0 and summary["rss_peak_mb"] > 50 and 0 <= summary["data_wait_frac"] < 1
    assert (epochs["train_cpu_s"] > 0).all(), "the CPU time of each timed pass"
    assert epochs["train_loss"].iloc[-1] < epochs["train_loss"].iloc[0]


def test_a_users_cnn_trains_on_images_of_its_own_shape(userpkg):
    df = perflab.run(
        "quick/train",
        [
            *TINY,
            "model._target_=userpkg.models.SmallCNN",
            "+model.width=8",
            "data.shape=[3,16,16]",
            "data.num_classes=5",
        ],
    )
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["items_unit"] == "images" and summary["flops_per_item"] > 0
    assert summary["cfg.model.width"] == 8 and summary["model"] == "userpkg.models.SmallCNN"


def test_the_report_counts_what_the_rows_count_tokens_and_sequences_never_images():
    """The training section's headline, its table and its batch-size figure take their units from
    the rows (items_unit: what throughput counts; batch_unit: what a batch counts); points that
    count different items say each its own; rows from before batch_unit read as they always did."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from perflab.analysis import frames
    from perflab.book import train

    def sweep(units: list[tuple[str, str | None]]) -> pd.DataFrame:
        n = len(units)
        return pd.DataFrame(
            {
                "experiment": ["train"] * n,
                "measurement": ["train"] * n,
                "status": ["ok"] * n,
                "run_id": [f"run{i}" for i in range(n)],
                "cfg.data.name": ["tokens" if u == "tokens" else "synthetic" for u, _ in units],
                "cfg.trainer.batch_size": [16 * 2 ** (i % 2) for i in range(n)],
                "items_per_s": [1000.0 * (i + 1) for i in range(n)],
                "test_acc": [0.5] * n,
                "items_unit": [u for u, _ in units],
                **({"batch_unit": [b for _, b in units]} if any(b for _, b in units) else {}),
            }
        )

    def drawn(section):
        fig = section.figures[1].plot(section.figures[1].rows)
        labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]
        plt.close(fig)
        return labels

    tokens = train.report(sweep([("tokens", "sequences")] * 2), {})
    assert tokens.headline == ["fastest: batch 32: 2000 tokens/s, test acc 0.500"]
    assert tokens.tables[0].header[2] == "tokens/s"
    assert drawn(tokens)[0] == ("global batch size (sequences)", "throughput (tokens/s)")
    before = train.report(sweep([("images", None)] * 2), {})  # a tree written before batch_unit
    assert drawn(before)[0] == ("global batch size (images)", "throughput (images/s)")
    mixed = train.report(sweep([("tokens", "sequences")] * 2 + [("images", "images")] * 2), {})
    assert mixed.tables[0].header[2] == "throughput"
    assert sorted(row[2].split()[-1] for row in mixed.tables[0].rows) == ["images/s"] * 2 + ["tokens/s"] * 2
    assert drawn(mixed)[0] == ("global batch size (items)", "throughput (items/s)")
    # runs over models are named by the model as rows call it, rows from before 0.4.0's move too
    targets = ("perflab.models.lenet", "perflab.train.models.lenet", "pkg.Net")
    assert [frames.words("cfg.model._target_", t) for t in targets] == ["lenet", "lenet", "pkg.Net"]


MODULES = '''
import torch
from torch import nn


class Breaks(nn.Module):
    """Runs in eval mode (the dry forward) and raises on its second training step."""

    def __init__(self, num_classes):
        super().__init__()
        self.head, self.steps = nn.Linear(12, num_classes), 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if self.steps == 2:
                raise ValueError("the user's bug")
        return self.head(x)


class ReadsBack(nn.Module):
    """Reads a value back in forward (.item()): fine on real tensors, impossible on meta ones."""

    def __init__(self, num_classes):
        super().__init__()
        self.head = nn.Linear(12, num_classes)

    def forward(self, x):
        return self.head(x) * (1.0 if x.sum().item() == x.sum().item() else 0.0)
'''


@pytest.fixture
def mymodels(userpkg, monkeypatch):
    (userpkg / "mymodels.py").write_text(textwrap.dedent(MODULES))
    monkeypatch.syspath_prepend(str(userpkg))
    return userpkg


def test_an_exception_inside_the_users_model_is_an_error_row_with_its_traceback(mymodels):
    df = perflab.run("quick/train", [*TINY, "model._target_=mymodels.Breaks", "data.shape=[12]"])
    assert df.attrs["outcome"] == "error"
    job = df[df["measurement"] == "job"].iloc[0]
    assert job["status"] == "error" and job["error"] == "ValueError: the user's bug"
    assert "mymodels.py" in (Path(df.attrs["run_dir"]) / "error.txt").read_text()


def test_an_estimate_that_fails_costs_its_columns_and_says_so_never_the_job(mymodels):
    """A .item() in forward: no meta run. The FLOPs are counted on a real copy instead (Hugging
    Face's decoders read values back so); the byte estimate, meta-only, is left out, saying so."""
    df = perflab.run("quick/train", [*TINY, "model._target_=mymodels.ReadsBack", "data.shape=[12]"])
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["status"] == "ok" and summary["items_per_s"] > 0
    assert summary["flops_per_item"] == 2 * (2 * 12 * 10), "forward, and the weight gradient (the input needs none)"
    assert "intensity" not in df or df["intensity"].isna().all()
    assert "arithmetic intensity not estimated" in summary["note"] and "FLOPs not estimated" not in summary["note"]


def test_a_headline_says_unknown_flops_never_0():
    from perflab.experiments import train

    row = {"measurement": "train", "status": "ok", "model": "m", "strategy": "single", "items_per_s": 10.0}
    said = train.headline([{**row, "note": "FLOPs not estimated: RuntimeError: no"}])
    assert said[1] == "model FLOPs: unknown (FLOPs not estimated: RuntimeError: no)"
    assert train.headline([{**row, "tflops": 0.5}])[1] == "model FLOPs: 0.5 TFLOP/s achieved"


def test_cpu_attention_counts_its_two_matmuls_forward_and_five_backward():
    q = torch.randn(2, 4, 128, 16, requires_grad=True)
    forward = 2 * 2 * (2 * 4 * 128 * 128 * 16)
    assert flops.count(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) == forward
    both = flops.count(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward())
    assert both == forward * 3.5


# --- estimates on any model: meta tensors of the data's real shape and dtype -------------------


@pytest.mark.parametrize(
    "target, spec",
    [
        ("perflab.models.resnet18_tv", data.Spec((1, 28, 28), 10)),  # BatchNorm: crashed at batch 1
        ("perflab.models.lenet", data.Spec((1, 28, 28), 10)),
        ("userpkg.models.SmallCNN", data.Spec((3, 16, 16), 5)),
        ("userpkg.models.TinyTransformer", data.Spec((16,), 32, tokens=True)),
    ],
)
def test_flop_and_byte_estimates_follow_the_datas_shape_and_dtype(userpkg, target, spec):
    net = models.build(ModelConfig(target), spec)
    per_item = training_flops_per_item(net, spec)
    fixed, per_sample = flops.bytes_moved(net, spec.example(2, "meta"))
    assert per_item > 0 and fixed == 8 * 4 * sum(p.numel() for p in net.parameters()) and per_sample > 0
    assert net.training and all(p.device.type == "cpu" for p in net.parameters()), "the model itself untouched"


def test_lenet_on_a_bigger_batch_counts_the_same_flops_per_item():
    spec = data.Spec((1, 28, 28), 10)
    net = models.lenet()
    assert training_flops_per_item(net, spec) == pytest.approx(training_flops_per_item(net, spec))
    forward = 2 * (20 * 26 * 26 * 9 + 50 * 81 * 500 + 800 * 128 + 1280)
    assert training_flops_per_item(net, spec) == pytest.approx(3 * forward - 243_360, rel=0.01)


# --- data of any shape, tokens, torchvision's datasets ---------------------------------------


def test_synthetic_images_take_any_shape_and_class_count_and_stay_learnable():
    train = data.synthetic(300, 0, 0.3, split=0, shape=(3, 16, 12), classes=5)
    test = data.synthetic(100, 0, 0.3, split=1, shape=(3, 16, 12), classes=5)
    assert train.tensors[0].shape == (300, 3, 16, 12) and int(train.tensors[1].max()) == 4
    means = torch.stack([train.tensors[0][train.tensors[1] == c].mean(0) for c in range(5)])
    nearest = ((test.tensors[0].unsqueeze(1) - means) ** 2).flatten(2).sum(-1).argmin(1)
    assert (nearest == test.tensors[1]).float().mean() > 0.9
    assert data.synthetic(10, 0, 0.3, split=0, shape=(512,), classes=2).tensors[0].shape == (10, 512)


def test_the_default_synthetic_set_is_the_one_perflab_always_used():
    """1x28x28, 10 classes: value for value what the fixed-shape generator made (templates
    from 7x7 noise, bilinear), so earlier results stay comparable."""
    from torch.nn import functional as F

    coarse = torch.rand(10, 1, 7, 7, generator=torch.Generator().manual_seed(3))
    templates = F.interpolate(coarse, size=(28, 28), mode="bilinear", align_corners=False)
    g = torch.Generator().manual_seed(3 * 1000 + 1)
    labels = torch.randint(0, 10, (50,), generator=g)
    images = templates[labels] + 2.0 * torch.randn(50, 1, 28, 28, generator=g)
    ds = data.synthetic(50, 3, 2.0, split=0)
    assert torch.equal(ds.tensors[1], labels) and torch.equal(ds.tensors[0], images)


def test_tokens_are_next_token_pairs_a_model_can_learn():
    ds = data.token_sequences(200, 16, 32, seed=0, split=0)
    x, y = ds.tensors
    assert x.shape == y.shape == (200, 16) and x.dtype == torch.long and int(x.max()) < 32
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    successor = torch.randint(0, 32, (32,), generator=torch.Generator().manual_seed(0))
    assert (successor[x] == y).float().mean() > 0.85, "mostly predictable from the previous token"
    spec = data.spec(DataConfig(name="tokens", vocab_size=32, seq_len=16))
    assert (spec.unit, spec.items_per_sample, spec.factory_args()) == ("tokens", 16, {"vocab_size": 32, "seq_len": 16})


def test_large_synthetic_items_default_to_a_set_that_fits_in_memory():
    train, test = data.sizes(DataConfig(name="synthetic", shape=[3, 224, 224], num_classes=1000))
    assert train * 3 * 224 * 224 * 4 <= 2**30 and 0 < test < train
    assert data.sizes(DataConfig(name="synthetic")) == (60_000, 10_000)


def write_mnist(root: Path, n_train: int = 40, n_test: int = 20) -> None:
    """Tiny files in torchvision's MNIST layout and IDX format."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (torch.arange(n) % 10).to(torch.uint8)
        images = (labels.view(-1, 1, 1) * 20 + torch.zeros(n, 28, 28, dtype=torch.uint8)).to(torch.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
            struct.pack(">IIII", 0x803, n, 28, 28) + images.numpy().tobytes()
        )
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x801, n) + labels.numpy().tobytes())


def write_cifar10(root: Path, per_batch: int = 8) -> None:
    """Tiny files in CIFAR-10's python layout: pickled batches of N x 3072 uint8 rows."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8), "labels": list(range(per_batch))}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))


def test_torchvisions_datasets_by_name_through_their_real_classes(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    cfg = DataConfig(name="torchvision", dataset="MNIST", root=str(tmp_path))
    splits = data.load(cfg, seed=0)
    assert type(splits.train).__name__ == "MNIST" and len(splits.train) == 40 and len(splits.test) == 20
    assert data.spec(cfg) == data.Spec((1, 28, 28), 10)
    images, labels = data.as_tensors(splits.train)
    assert images.shape == (40, 1, 28, 28) and torch.allclose(images[3], splits.train[3][0])

    write_cifar10(tmp_path)
    # torchvision checks the md5 sums of the real files; ours are tiny stand-ins in their format
    monkeypatch.setattr("torchvision.datasets.cifar.check_integrity", lambda *args, **kwargs: True)
    cfg = DataConfig(name="torchvision", dataset="CIFAR10", root=str(tmp_path))
    splits = data.load(cfg, seed=0)
    assert type(splits.train).__name__ == "CIFAR10" and len(splits.train) == 40 and len(splits.test) == 8
    assert data.spec(cfg) == data.Spec((3, 32, 32), 10)
    images, labels = data.as_tensors(splits.test)
    assert images.shape == (8, 3, 32, 32) and torch.allclose(images[5], splits.test[5][0])


def test_a_torchvision_dataset_that_is_not_there_names_the_root(tmp_path):
    with pytest.raises(Exception) as err:
        data.load(DataConfig(name="torchvision", dataset="MNIST", root=str(tmp_path / "none")), seed=0)
    assert str(err.value).startswith(f"data.root={tmp_path / 'none'}: cannot read MNIST there (")


# --- the broad matrix: every documented model, data set, strategy and precision ---------------

MATRIX = {
    "lenet": ["model=lenet"],
    "resnet18": ["model=resnet18", "data.train_size=32", "data.test_size=16", "trainer.batch_size=8"],
    "resnet18_tv": ["model=resnet18_tv"],
    "torchvision on 3x64x64": ["model=torchvision", "model.arch=mobilenet_v3_small", "data.shape=[3,64,64]"],
    "timm": ["model=timm", "model.arch=resnet18", "data.shape=[3,32,32]", "data.num_classes=5"],
    "user cnn 3x16x16": ["model._target_=userpkg.models.SmallCNN", "+model.width=8", "data.shape=[3,16,16]"],
    "user transformer": TRANSFORMER,
    "fashion_mnist": ["data=fashion_mnist", "data.root=files"],
    "torchvision MNIST": ["data=torchvision", "data.dataset=MNIST", "data.root=files"],
    "scratch": [*TRANSFORMER, "strategy=scratch", "devices.count=2"],
    "data_parallel": [*TRANSFORMER, "strategy=data_parallel", "devices.count=2"],
    "ddp bf16": [*TRANSFORMER, "strategy=ddp", "devices.count=2", "trainer.precision=bf16-mixed"],
    "fp16": [*TRANSFORMER, "trainer.precision=fp16-mixed"],
    "compile": [*TRANSFORMER, "trainer.compile=true", "trainer.compile_backend=eager"],
    "channels_last, on the device": [
        "model._target_=userpkg.models.SmallCNN",
        "data.shape=[3,16,16]",
        "model.channels_last=true",
        "data.on_device=true",
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MATRIX))
def test_every_documented_model_data_strategy_and_precision_trains(userpkg, name):
    if name == "timm":
        pytest.importorskip("timm")
    from test_train import write_idx_fashion_mnist

    write_idx_fashion_mnist(userpkg / "files")
    write_mnist(userpkg / "files")
    df = perflab.run("quick/train", [*TINY, *MATRIX[name]])
    assert df.attrs["outcome"] == "ok" and (df["status"] == "ok").all(), df[["measurement", "status", "error"]]
    summary = df[df["measurement"] == "train"].iloc[0]
    assert summary["items_per_s"] > 0 and summary["flops_per_item"] > 0 and summary["intensity"] > 0
    assert summary["items_unit"] == ("tokens" if "data=tokens" in MATRIX[name] else "images")
