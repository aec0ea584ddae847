"""The training loop shared by every strategy: one row per epoch, a summary row at the end.

Per batch it only queues work: the loss sum and correct count accumulate on the device and
are read once per epoch (after the epoch's clock has stopped), so the host never waits on
the device mid-epoch. Epoch times are wall clock with every device synchronized.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from perflab.bench import Stats
from perflab.context import Context
from perflab.devices import Device
from perflab.errors import ConfigError
from perflab.schema import TrainerConfig
from perflab.train import checkpoint, data, models
from perflab.train.strategies import STRATEGIES

log = logging.getLogger("perflab")


@dataclass(frozen=True)
class Plan:
    """The numbers the config implies for this device count."""

    devices: int
    global_batch: int
    per_device_batch: int
    lr: float  # after the scaling rule (and after warm-up)


def plan(t: TrainerConfig, n_devices: int) -> Plan:
    if t.scaling == "strong":
        if t.batch_size % n_devices:
            raise ConfigError("trainer.batch_size", t.batch_size, f"a multiple of the device count ({n_devices})",
                              problem="scaling=strong splits the global batch evenly")
        global_batch = t.batch_size
    else:
        global_batch = t.batch_size * n_devices
    ratio = global_batch / t.base_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[t.lr_rule]
    return Plan(n_devices, global_batch, global_batch // n_devices, t.lr * factor)


def lr_at(step: int, steps_per_epoch: int, t: TrainerConfig, p: Plan) -> float:
    """Linear warm-up from the base lr to the scaled lr over ``warmup_epochs``, then constant."""
    warm = t.warmup_epochs * steps_per_epoch
    if step < warm:
        return t.lr + (p.lr - t.lr) * (step + 1) / warm
    return p.lr


def check_devices(strategy: str, devices: list[Device]) -> None:
    names = [d.name for d in devices]
    if strategy == "single" and len(devices) != 1:
        raise ConfigError("devices.count", len(devices), "1 for strategy=single (scratch, data_parallel or ddp for more)")
    if strategy in ("data_parallel", "ddp") and len({d.type for d in devices}) > 1:
        raise ConfigError("devices.spec", names, f"devices of one kind for strategy={strategy}")


def train(ctx: Context, rank: int = 0, world: int = 1, local_rank: int = 0) -> None:
    """Train as configured on ``ctx.devices`` (for DDP: this rank's device); rank 0 records."""
    s = ctx.settings
    t, total_devices = s.trainer, len(ctx.devices) if world == 1 else world
    p = plan(t, total_devices)
    my_devices = ctx.devices if world == 1 else [ctx.devices[local_rank]]
    splits = data.load(s.data, s.seed)
    main = my_devices[0].torch
    train_batches = data.Batches(splits.train, p.global_batch, rank=rank, world=world, seed=s.seed, device=main,
                                 on_device=s.data.on_device, workers=s.data.workers, pin_memory=s.data.pin_memory)
    test_batches = data.Batches(splits.test, t.eval_batch, rank=rank, world=world, shuffle=False, drop_last=False,
                                device=main, on_device=s.data.on_device, workers=s.data.workers,
                                pin_memory=s.data.pin_memory)
    if len(train_batches) == 0:
        raise ConfigError("trainer.batch_size", t.batch_size, f"a global batch <= the training set ({len(splits.train)})")

    torch.manual_seed(s.seed)
    model = models.build(s.model.name, s.model.init, s.model.num_classes)
    make_opt = lambda params: torch.optim.SGD(params, lr=p.lr, momentum=t.momentum, weight_decay=t.weight_decay)
    strategy = STRATEGIES[s.strategy.name](model, my_devices, make_opt)

    resolved = OmegaConf.to_container(OmegaConf.structured(s), resolve=True)
    ckpt_path = Path(t.checkpoint_dir).resolve() / checkpoint.config_key(resolved) / "last.pt"
    start = _resume(ckpt_path, strategy) if t.resume else 0
    if rank == 0 and start:
        log.info("resumed from %s after epoch %d", ckpt_path, start)

    notes = "; ".join(n for n in (splits.note, strategy.note) if n)
    fixed = {"strategy": s.strategy.name, "model": s.model.name, "global_batch": p.global_batch,
             "per_device_batch": p.per_device_batch, "n_devices": total_devices, "world_size": world,
             "checkpoint": str(ckpt_path)}
    epoch_times: list[float] = []
    last: dict[str, Any] = {}
    steps = len(train_batches)
    for epoch in range(start, t.epochs):
        strategy.train(True)
        loss_sum = torch.zeros((), device=main)
        correct = torch.zeros((), device=main, dtype=torch.long)
        seen = 0
        strategy.sync()
        t0 = time.perf_counter()
        for i, (x, y) in enumerate(_progress(train_batches.epoch(epoch), steps, f"epoch {epoch + 1}", rank)):
            lr = lr_at(epoch * steps + i, steps, t, p)
            strategy.set_lr(lr)
            loss, right = strategy.step(x, y)
            loss_sum += loss
            correct += right
            seen += y.shape[0]
        strategy.sync()
        train_s = time.perf_counter() - t0
        test_right, test_seen, eval_s = _evaluate(strategy, test_batches, main)
        # The epoch's one read-back: sums over ranks (DDP) of what accumulated on the device.
        counts = torch.tensor([seen, test_seen], device=main, dtype=torch.float64)
        sums = torch.cat([torch.stack([loss_sum.double(), correct.double(), test_right.double()]), counts])
        loss_total, right_total, test_total, seen_total, test_n = strategy.all_reduce(sums).tolist()
        times = torch.tensor([train_s, eval_s], device=main, dtype=torch.float64)
        train_s, eval_s = strategy.all_reduce(times, op="max").tolist()  # an epoch ends with its slowest rank
        epoch_times.append(train_s)
        if (t.checkpoint_every and (epoch + 1) % t.checkpoint_every == 0) or epoch + 1 == t.epochs:
            if rank == 0:
                checkpoint.save(ckpt_path, strategy.model, strategy.optimizer, epoch + 1)
        if rank == 0:
            last = ctx.record("epoch", devices=ctx.devices, epoch=epoch + 1, train_s=train_s, eval_s=eval_s,
                              items_per_s=seen_total / train_s,
                              per_device_items_per_s=seen_total / train_s / total_devices,
                              train_loss=loss_total / seen_total, train_acc=right_total / seen_total,
                              test_acc=test_total / test_n if test_n else math.nan, lr=lr, note=notes, **fixed)
    if rank == 0 and epoch_times:
        _summary(ctx, epoch_times, last, seen_total, notes, fixed)
    elif rank == 0:
        ctx.record("train", status="skipped", devices=ctx.devices, **fixed,
                   error=f"nothing to do: the checkpoint is at epoch {start} of {t.epochs}")


def _summary(ctx: Context, times: list[float], last: dict, images: float, notes: str, fixed: dict) -> None:
    """One row for the whole run: epoch-time stats with the first epoch as warm-up."""
    warm, timed = (times[:1], times[1:]) if len(times) > 1 else ([], times)
    stats = Stats(timed, "wall_sync", warm, torch.get_num_threads(), noise_threshold=ctx.settings.bench.noise_threshold)
    note = notes if warm else "; ".join(x for x in (notes, "one epoch: its time includes warm-up") if x)
    ctx.record("train", stats, devices=ctx.devices, epochs=len(times), items_per_s=images / stats.median,
               per_device_items_per_s=images / stats.median / fixed["n_devices"],
               train_loss=last["train_loss"], train_acc=last["train_acc"], test_acc=last["test_acc"],
               lr=last["lr"], note=note, **fixed)


@torch.no_grad()
def _evaluate(strategy, batches: data.Batches, main: torch.device) -> tuple[torch.Tensor, int, float]:
    strategy.train(False)
    model = strategy.eval_model
    right = torch.zeros((), device=main, dtype=torch.long)
    seen = 0
    t0 = time.perf_counter()
    for x, y in batches.epoch(0):
        right += (model(x).argmax(1) == y).sum()
        seen += y.shape[0]
    strategy.sync()
    return right, seen, time.perf_counter() - t0


def _resume(path: Path, strategy) -> int:
    if not path.is_file():
        log.info("trainer.resume: no checkpoint at %s yet; starting at epoch 1", path)
        return 0
    state = checkpoint.load(path)
    for m in getattr(strategy, "replicas", [strategy.model]):
        checkpoint.load_weights(m, state["model"])
    for opt in strategy.optimizers:
        opt.load_state_dict(state["optimizer"])
    checkpoint.restore_rng(state)
    return int(state["epoch"])


def _progress(it, total: int, desc: str, rank: int):
    """A per-epoch progress bar on a terminal (rank 0 only); plain iteration elsewhere."""
    if rank != 0 or not sys.stderr.isatty():
        return it
    from tqdm import tqdm

    return tqdm(it, total=total, desc=desc, leave=False, unit="batch")
