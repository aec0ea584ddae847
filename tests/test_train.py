"""Training parts: models, data (real torchvision loader on tiny IDX files), lr rules,
checkpoints, and the strategies' equivalence with a single device."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from torch import nn

from perflab import models
from perflab.config.schema import DataConfig, ModelConfig, TrainerConfig, config_hash
from perflab.errors import ConfigError
from perflab.measure.devices import Device
from perflab.train import checkpoint, data
from perflab.train.loop import lr_at, plan
from perflab.train.strategies import DataParallel, Scratch, Single

CPU = Device("cpu", "cpu", threads=1)
WORKERS = [Device("cpu#0", "cpu", threads=1), Device("cpu#1", "cpu", threads=1)]
FASHION = data.Spec(data.SHAPE, data.CLASSES)


def build(name: str, init: str = "default") -> nn.Module:
    return models.build(ModelConfig(f"perflab.models.{name}", init=init), FASHION)


def write_idx_fashion_mnist(root: Path, n_train: int = 64, n_test: int = 32) -> None:
    """Tiny files in torchvision's FashionMNIST layout and IDX format (big-endian header)."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = torch.arange(n) % 10
        images = (labels.view(-1, 1, 1) * 25 + torch.randint(0, 5, (n, 28, 28), generator=g)).to(torch.uint8)
        files = {
            f"{prefix}-images-idx3-ubyte": struct.pack(">IIII", 0x803, n, 28, 28) + images.numpy().tobytes(),
            f"{prefix}-labels-idx1-ubyte": struct.pack(">II", 0x801, n) + labels.to(torch.uint8).numpy().tobytes(),
        }
        for name, payload in files.items():
            (raw / name).write_bytes(payload)


@pytest.mark.parametrize("name", ["lenet", "resnet18", "resnet18_tv"])
def test_models_map_fashion_mnist_to_ten_classes(name):
    net = models.build(ModelConfig(f"perflab.models.{name}"), FASHION)
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_book_resnet18_keeps_28x28_resolution_in_the_stem():
    net = models.resnet18()
    stem = net[0]
    assert (stem.kernel_size, stem.stride, stem.padding) == ((3, 3), (1, 1), (1, 1))
    assert not any(isinstance(m, nn.MaxPool2d) for m in net.modules())
    widths = [m.out_channels for m in net.modules() if isinstance(m, models.Residual) for m in [m.conv2]]
    assert widths == [64, 64, 128, 128, 256, 256, 512, 512]


def test_book_init_is_normal_with_std_001():
    torch.manual_seed(0)
    net = build("lenet", "book_normal")
    w = torch.cat([m.weight.flatten() for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))])
    assert w.std().item() == pytest.approx(0.01, rel=0.05)
    assert all(m.bias.abs().sum() == 0 for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))


def test_strip_prefix_handles_wrappers():
    assert models.strip_prefix("module._orig_mod.0.weight") == "0.weight"


def test_fashion_mnist_goes_through_torchvisions_loader(tmp_path):
    write_idx_fashion_mnist(tmp_path)
    splits = data.load(DataConfig(name="fashion_mnist", root=str(tmp_path)), seed=0)
    assert type(splits.train).__name__ == "FashionMNIST"
    x, y = splits.train[3]
    assert x.shape == (1, 28, 28) and y == 3
    assert len(splits.train) == 64 and len(splits.test) == 32
    images, labels = data.as_tensors(splits.train)
    assert images.shape == (64, 1, 28, 28) and torch.equal(labels, torch.arange(64) % 10)
    assert torch.allclose(images[3], x)  # the on-device path reads the same pixels as the transform


def test_fashion_mnist_missing_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        data.load(DataConfig(name="fashion_mnist", root=str(tmp_path / "none")), seed=0)
    line = err.value.line()
    assert line.startswith(f"data.root={tmp_path / 'none'}: no Fashion-MNIST files there; allowed: ")
    assert "data=synthetic" in line and "data.download=true" in line


def test_synthetic_data_shares_classes_not_images():
    train, test = data.synthetic(200, 0, 0.6, split=0), data.synthetic(200, 0, 0.6, split=1)
    assert train.tensors[0].shape == (200, 1, 28, 28)
    assert not torch.equal(train.tensors[0], test.tensors[0])
    class_means = torch.stack([train.tensors[0][train.tensors[1] == c].mean(0) for c in range(10)])
    nearest = ((test.tensors[0].unsqueeze(1) - class_means) ** 2).flatten(2).sum(-1).argmin(1)
    assert (nearest == test.tensors[1]).float().mean() > 0.9  # learnable: templates tell classes apart


def test_batches_split_global_batches_across_ranks_and_resume_safely():
    ds = data.synthetic(100, 0, 0.6, split=0)
    whole = data.Batches(ds, 20, seed=3)
    ranks = [data.Batches(ds, 20, rank=r, world=2, seed=3) for r in range(2)]
    for a, b0, b1 in zip(whole.index_batches(1), ranks[0].index_batches(1), ranks[1].index_batches(1)):
        assert torch.equal(a, torch.cat([b0, b1]))
    assert all(torch.equal(a, b) for a, b in zip(whole.index_batches(2), data.Batches(ds, 20, seed=3).index_batches(2)))
    assert not torch.equal(whole.index_batches(1)[0], whole.index_batches(2)[0])
    on_device = data.Batches(ds, 20, seed=3, on_device=True, device=torch.device("cpu"))
    loader = data.Batches(ds, 20, seed=3, workers=0)
    for (x1, y1), (x2, y2) in zip(on_device.epoch(0), loader.epoch(0)):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)


@pytest.mark.parametrize(
    "rule, scaling, devices, batch, global_batch, lr",
    [
        ("none", "strong", 2, 256, 256, 0.1),
        ("linear", "weak", 2, 256, 512, 0.2),
        ("sqrt", "weak", 4, 256, 1024, 0.2),
        ("linear", "strong", 4, 1024, 1024, 0.4),
    ],
)
def test_lr_scaling_rules(rule, scaling, devices, batch, global_batch, lr):
    p = plan(TrainerConfig(batch_size=batch, scaling=scaling, lr=0.1, base_batch=256, lr_rule=rule), devices)
    assert (p.global_batch, p.per_device_batch) == (global_batch, global_batch // devices)
    assert p.lr == pytest.approx(lr)


def test_goyal_warmup_ramps_linearly_to_the_scaled_lr():
    t = TrainerConfig(batch_size=2048, lr=0.1, base_batch=256, lr_rule="linear", warmup_epochs=5)
    p = plan(t, 8)
    assert p.lr == pytest.approx(0.8)  # 0.1 * kn / 256
    steps = 10
    lrs = [lr_at(s, steps, t, p) for s in range(60)]
    assert lrs[0] == pytest.approx(0.1 + 0.7 / 50) and lrs[49] == pytest.approx(0.8) and lrs[59] == 0.8
    assert all(b > a for a, b in zip(lrs[:49], lrs[1:50]))


def test_strong_scaling_needs_a_divisible_batch():
    with pytest.raises(ConfigError) as err:
        plan(TrainerConfig(batch_size=250), 3)
    assert err.value.line().startswith(
        "trainer.batch_size=250: scaling=strong splits the global batch evenly; "
        "allowed: a multiple of the device count (3)"
    )


def _train_steps(strategy_cls, devices, steps=4, batch=32):
    torch.manual_seed(0)
    model = build("lenet")
    s = strategy_cls(model, devices, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4))
    ds = data.synthetic(steps * batch, 0, 0.6, split=0)
    for x, y in data.Batches(ds, batch, seed=0).epoch(0):
        s.step(x, y)
    return {models.strip_prefix(k): v for k, v in s.bare.state_dict().items()}


@pytest.mark.parametrize("strategy_cls", [Scratch, DataParallel])
def test_in_process_strategies_match_single_device_training(strategy_cls):
    reference = _train_steps(Single, [CPU])
    other = _train_steps(strategy_cls, WORKERS if strategy_cls is Scratch else [CPU])
    assert reference.keys() == other.keys()
    for k in reference:
        torch.testing.assert_close(other[k], reference[k], rtol=1e-4, atol=1e-5)


def test_scratch_allreduce_sums_and_broadcasts():
    from perflab.train.strategies import allreduce

    ts = [torch.full((3,), float(i)) for i in range(1, 4)]
    allreduce(ts)
    assert all(torch.equal(t, torch.full((3,), 6.0)) for t in ts)


def test_a_model_hashes_where_runs_before_the_move_hashed_it():
    hashed = [config_hash({"model": {"_target_": t}}) for t in ("perflab.train.models.lenet", "perflab.models.lenet")]
    assert hashed[0] == hashed[1] != config_hash({"model": {"_target_": "perflab.models.mlp"}})


def test_checkpoint_loads_into_bare_and_wrapped_models(tmp_path):
    torch.manual_seed(0)
    wrapped = nn.DataParallel(build("lenet"))  # a pass-through wrapper without CUDA
    assert all(k.startswith("module.") for k in wrapped.state_dict())
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    info = checkpoint.Info("run1", "hash", epoch=3, epochs=5, complete=False)
    path = checkpoint.save(tmp_path, info, wrapped, opt)
    assert path == tmp_path / "run1.pt" and checkpoint.candidates(tmp_path)[0] == (path, info)
    state = checkpoint.load(path)  # weights_only=True inside
    assert state["epoch"] == 3 and not any(k.startswith("module.") for k in state["model"])
    bare = build("lenet")
    checkpoint.load_weights(bare, state["model"])
    rewrapped = nn.DataParallel(build("lenet"))
    checkpoint.load_weights(rewrapped, {f"module.{k}": v for k, v in state["model"].items()})
    for k, v in wrapped.module.state_dict().items():
        assert torch.equal(bare.state_dict()[k], v) and torch.equal(rewrapped.module.state_dict()[k], v)
    assert not list(tmp_path.glob(".*.tmp"))


def test_config_key_ignores_what_may_change_on_resume():
    a = {"trainer": {"epochs": 2, "resume": False, "lr": 0.1}, "model": {"name": "lenet"}}
    b = {"trainer": {"epochs": 4, "resume": True, "lr": 0.1}, "model": {"name": "lenet"}}
    c = {"trainer": {"epochs": 2, "resume": False, "lr": 0.2}, "model": {"name": "lenet"}}
    assert checkpoint.key(a) == checkpoint.key(b) != checkpoint.key(c)


def test_the_most_advanced_checkpoint_wins_and_a_sweep_resumes_only_interrupted_ones(tmp_path):
    net, opt = build("lenet"), None
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    checkpoint.save(tmp_path, checkpoint.Info("a", "h", 3, 10, False), net, opt)
    checkpoint.save(tmp_path, checkpoint.Info("b", "h", 10, 10, True), net, opt)
    checkpoint.save(tmp_path, checkpoint.Info("c", "other", 5, 20, False), net, opt)
    assert checkpoint.candidates(tmp_path)[0][1].run_id == "b"
    assert checkpoint.candidates(tmp_path, interrupted_of="h")[0][1].run_id == "a"
    assert checkpoint.candidates(tmp_path, interrupted_of="nope") == []
