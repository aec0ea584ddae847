"""The training loop shared by every strategy, as steps a reader can follow:

  Trainer(ctx)    data, model, strategy, FLOPs per item, and where it resumes from
  fit()           the data-only pass, then epochs, then the summary row
  run_epoch()     the timed training pass: it only queues work (each step's loss goes into a
                  buffer on the device, the correct count adds up there: two small ops per
                  step), waits for the devices once at the end, then evaluates
  reduce()        the epoch's one read-back, summed over ranks (DDP)
  record_*()      one row per epoch, a ``compile`` row, a ``train`` row with epoch-time stats

The host never waits on a device mid-epoch; a loss that turns NaN/inf is found in the epoch's
buffer of losses after its timed pass and reported at the epoch's read-back as an error row.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator

import torch
from omegaconf import OmegaConf

from perflab import models
from perflab.config.schema import TrainerConfig
from perflab.errors import ConfigError
from perflab.job import logs
from perflab.job.context import Context
from perflab.measure import bench, flops
from perflab.measure import precision as precisions
from perflab.measure.devices import Device
from perflab.measure.instruments import Machine, Memory
from perflab.measure.instruments.machine import worst
from perflab.train import checkpoint, data, objectives, optim
from perflab.train.strategies import STRATEGIES, Knobs

log = logging.getLogger("perflab")
DATA_PASS_BATCHES = 20  # batches per sample of the data-only pass
INPUT_BOUND = 0.5  # an epoch that waits for data this share of its time is input-bound


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
            raise ConfigError(
                "trainer.batch_size",
                t.batch_size,
                f"a multiple of the device count ({n_devices})",
                problem="scaling=strong splits the global batch evenly",
            )
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


@dataclass
class Epoch:
    """One epoch's figures, summed over ranks."""

    epoch: int
    train_s: float
    eval_s: float
    items: float  # images, tokens ...: what the data's Spec counts
    loss: float
    train_acc: float
    test_acc: float
    lr: float
    data_wait_s: float
    first_bad_step: int | None  # the first step whose loss was NaN/inf
    rss_peak_mb: float
    machine: dict[str, Any]  # the epoch's machine columns (instruments.Machine), others' CPU net of every rank's
    cpu_s: float  # CPU seconds of the timed pass: this process and its children, summed over ranks
    phases: dict[str, float] = field(default_factory=dict)  # forward/backward/optimizer s per step (rank 0's)


class Trainer:
    """Train as configured on ``ctx.devices`` (for DDP: this rank's device); rank 0 records."""

    def __init__(self, ctx: Context, rank: int = 0, world: int = 1, local_rank: int = 0) -> None:
        s = ctx.settings
        assert s.trainer is not None and s.model is not None and s.data is not None and s.strategy is not None
        self.ctx, self.rank, self.world, self.t = ctx, rank, world, s.trainer
        self.n_devices = len(ctx.devices) if world == 1 else world
        self.plan = plan(self.t, self.n_devices)
        self.devices: list[Device] = ctx.devices if world == 1 else [ctx.devices[local_rank]]
        self.main = self.devices[0].torch
        d = models.fitted_data(s.model, s.data)  # the keys left null: the model's, else perflab's
        splits = data.load(d, s.seed)
        self.spec = data.spec(d)
        torch.manual_seed(s.seed)
        model = models.build(s.model, self.spec)
        self.objective = objectives.of(model, self.spec)  # what it trains to do: the targets, the loss
        splits.train = objectives.prepared(splits.train, self.objective, s.seed, 0)
        splits.test = objectives.prepared(splits.test, self.objective, s.seed, 1)
        self.spec = replace(self.spec, also=self.objective.also)

        def batches(ds: Any, size: int, **how: Any) -> data.Batches:
            return data.Batches(
                ds,
                size,
                rank=rank,
                world=world,
                device=self.main,
                on_device=d.on_device,
                workers=d.workers,
                pin_memory=d.pin_memory,
                **how,
            )

        self.train_batches = batches(splits.train, self.plan.global_batch, seed=s.seed)
        self.test_batches = batches(splits.test, self.t.eval_batch, shuffle=False, drop_last=False)
        if len(self.train_batches) == 0:
            raise ConfigError(
                "trainer.batch_size",
                self.t.batch_size,
                f"a global batch <= the training set ({data.size(splits.train)})",
            )
        self.flops_per_item, flops_note = flops.estimated(
            "FLOPs", lambda: training_flops_per_item(model, self.spec, self.objective)
        )
        self.intensity, bytes_note = flops.estimated("arithmetic intensity", lambda: self.estimate_intensity(model))
        self.knobs = Knobs(
            self.t.precision, s.model.channels_last, self.t.compile, self.t.compile_mode, self.t.compile_backend
        )

        self.strategy = STRATEGIES[s.strategy.name](
            model, self.devices, optim.factory(self.t, self.plan.lr), self.knobs, self.objective
        )
        resolved = OmegaConf.to_container(OmegaConf.structured(s), resolve=True)
        self.folder = Path(self.t.checkpoint_dir).resolve() / checkpoint.key(resolved)  # type: ignore[arg-type]
        self.start, self.source = self.resume()
        self.notes = "; ".join(n for n in (splits.note, self.strategy.note, flops_note, bytes_note) if n)
        self.fixed: dict[str, Any] = {
            "strategy": s.strategy.name,
            "model": s.model.label,
            "global_batch": self.plan.global_batch,
            "per_device_batch": self.plan.per_device_batch,
            "n_devices": self.n_devices,
            "world_size": world,
            "precision": self.t.precision,
            "channels_last": s.model.channels_last,
            "compiled": self.t.compile,
            "optimizer": optim.described(self.t),
            "flops_per_item": self.flops_per_item,
            "intensity": self.intensity,
            "input": self.spec.describe(),
            "objective": self.objective.name,
            "classes": self.spec.classes,  # what chance is 1 in (the vocabulary for tokens)
            "items_unit": self.spec.unit,
            "batch_unit": self.spec.batch_unit,
            "checkpoint": str(self.folder / f"{ctx.run_id}.pt"),
            "resumed_from_epoch": self.start,
        }
        self.compile_info: dict[str, Any] = {}

    def estimate_intensity(self, model: torch.nn.Module) -> float:
        """FLOP/byte of one training step on one device, *estimated* (perflab.measure.flops.bytes_moved)."""
        fixed, per_sample = flops.bytes_moved(model, self.spec.example(2, "meta"), self.t.precision)
        samples = self.plan.per_device_batch
        if self.flops_per_item is None:
            raise ValueError("no FLOP count")
        return self.flops_per_item * samples * self.spec.items_per_sample / (fixed + per_sample * samples)

    # --- resume -------------------------------------------------------------------------

    def resume(self) -> tuple[int, Path | None]:
        """(first epoch to run, the checkpoint it continues) under ``trainer.resume``:
        true: the most advanced checkpoint of this training; null (auto): in a sweep re-run,
        the checkpoint of an interrupted run of this very point; false: start fresh."""
        want = self.t.resume
        if want is False or (want is None and not self.ctx.identity.get("sweep_id")):
            return 0, None
        only = None if want else str(self.ctx.identity["config_hash"])
        found = checkpoint.load_most_advanced(self.folder, interrupted_of=only) if self.folder.is_dir() else None
        if found is None:
            if want:
                log.info("trainer.resume: no checkpoint in %s yet; starting at epoch 1", self.folder)
            return 0, None
        path, info, state = found
        for replica in getattr(self.strategy, "replicas", [self.strategy.bare]):
            checkpoint.load_weights(replica, state["model"])
        self.strategy.load_optimizer(state["optimizer"])
        if state.get("scaler"):
            self.strategy.scaler.load_state_dict(state["scaler"])
        checkpoint.restore_rng(state)
        if self.rank == 0:
            log.info("resumed from %s after epoch %d", path, info.epoch)
        return info.epoch, path

    # --- the run ------------------------------------------------------------------------

    def fit(self) -> None:
        """Train, then end the data loaders' worker processes (whatever stopped the training)."""
        try:
            self.run_epochs()
        finally:
            self.train_batches.close()
            self.test_batches.close()

    def run_epochs(self) -> None:
        if self.start >= self.t.epochs:
            if self.rank == 0:
                self.ctx.record(
                    "train",
                    status="skipped",
                    devices=self.ctx.devices,
                    **self.fixed,
                    error=f"nothing to do: the checkpoint is at epoch {self.start} of {self.t.epochs}",
                )
            return
        if self.rank == 0:
            self.record_data_pass()
        epochs: list[Epoch] = []
        for e in range(self.start, self.t.epochs):
            result = self.run_epoch(e)
            epochs.append(result)
            if self.rank == 0:  # the row first: stopped before the checkpoint, the resumed run redoes the epoch
                self.record_epoch(result)
            self.save_checkpoint(e + 1)
            if result.first_bad_step is not None:
                return  # diverged: the epoch's error row says where; no summary of a broken run
        profiled = self.profiled_steps() if self.ctx.settings.bench.profile else None
        if self.rank == 0:
            if self.knobs.compile:
                self.record_compile()
            self.record_summary(epochs, profiled)

    def profiled_steps(self) -> tuple[str, Any]:
        """``bench.profile``: steps under torch.profiler after the timed epochs, never inside
        them, on one batch, the phases as ranges (``optim.Ranges``); every rank runs them (a DDP
        step's collectives need all), rank 0 keeps the trace. (trace path, operators.Profiled)."""
        from perflab.measure import operators, profile

        s = self.strategy
        x, y = next(iter(self.train_batches.epoch(self.t.epochs)))
        s.train(True)
        s.phases = optim.Ranges() if s.splits_step else optim.NoPhases()

        def step() -> None:
            s.step(x, y)

        try:
            if self.rank == 0:
                return profile.traced(self.ctx.run_dir, "train", step, self.devices)
            return "", operators.profiled(step, self.devices)
        finally:
            s.phases = optim.NoPhases()

    def run_epoch(self, epoch: int) -> Epoch:
        s = self.strategy
        steps = len(self.train_batches)
        s.train(True)
        losses = torch.zeros(steps, device=self.main)  # each step's summed loss, read after the epoch
        correct = torch.zeros((), device=self.main, dtype=torch.long)
        scored = torch.zeros((), device=self.main, dtype=torch.long)  # the targets the objective scored
        seen, wait, lr = 0, 0.0, self.plan.lr
        memory = Memory(self.devices)
        s.phases = optim.Phases(self.main) if s.splits_step else optim.NoPhases()
        with memory.sample(), Machine() as machine:
            s.sync()
            t0 = time.perf_counter()
            batches = iter(self.progress(self.train_batches.epoch(epoch), steps, f"epoch {epoch + 1}"))
            for i in range(steps):
                w0 = time.perf_counter()
                x, y = next(batches)
                wait += time.perf_counter() - w0
                step = epoch * steps + i
                lr = lr_at(step, steps, self.t, self.plan)
                s.set_lr(lr)
                if self.knobs.compile and epoch == self.start and i == 0:
                    loss, right = self.first_compiled_step(x, y)
                else:
                    loss, right = s.step(x, y)
                losses[i] = loss
                correct += right
                scored += self.objective.count(y)
                seen += len(y) * self.spec.items_per_sample  # what throughput counts: images, tokens ...
            s.sync()
            train_s = time.perf_counter() - t0
        bad = ~torch.isfinite(losses)  # the first NaN/inf step of the run, or -1
        first_bad = torch.where(bad.any(), bad.int().argmax() + epoch * steps + 1, -1)
        split = s.phases.totals()
        done = s.phases.complete
        s.phases = optim.NoPhases()
        test_right, test_scored, eval_s = self.evaluate()
        result = self.reduce(
            epoch,
            losses.sum(),
            correct,
            scored,
            first_bad,
            seen,
            test_right,
            test_scored,
            train_s,
            eval_s,
            lr,
            wait,
            memory.columns()["rss_peak_mb"],
            machine,
        )
        result.phases = {f"{p}_s": split[p] / done for p in optim.PHASES} if done else {}
        return result

    def first_compiled_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step that compiles, timed on its own (two syncs, once per run)."""
        from perflab.measure.dynamo import unique_graphs

        self.strategy.sync()
        graphs, t0 = unique_graphs(), time.perf_counter()
        out = self.strategy.step(x, y)
        self.strategy.sync()
        self.compile_info = {
            "first_step_s": time.perf_counter() - t0,
            "graphs": unique_graphs() - graphs,
            "graphs_after_first_step": unique_graphs(),
        }
        return out

    @torch.no_grad()
    def evaluate(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """How many of the test set's targets the model gets right, of how many scored."""
        s = self.strategy
        s.train(False)
        right = torch.zeros((), device=self.main, dtype=torch.long)
        scored = torch.zeros((), device=self.main, dtype=torch.long)
        t0 = time.perf_counter()
        with precisions.applied(self.knobs.precision, self.main.type):
            for x, y in self.test_batches.epoch(0):
                right += self.objective.right(s.eval_model, s.inputs(x), y)
                scored += self.objective.count(y)
        s.sync()
        return right, scored, time.perf_counter() - t0

    def reduce(
        self,
        epoch: int,
        loss_sum: torch.Tensor,
        correct: torch.Tensor,
        scored: torch.Tensor,
        first_bad: torch.Tensor,
        seen: int,
        test_right: torch.Tensor,
        test_scored: torch.Tensor,
        train_s: float,
        eval_s: float,
        lr: float,
        wait: float,
        rss_mb: float,
        machine: Machine,
    ) -> Epoch:
        """The epoch's one read-back: sums over ranks of what accumulated on the device, and
        the slowest rank's times (an epoch ends when its slowest rank does). Loss and accuracy
        are over the targets scored; throughput over the items seen."""
        big = float(2**62)
        bad = torch.where(first_bad >= 0, first_bad.double(), torch.tensor(big, device=self.main, dtype=torch.float64))
        sums = torch.cat(
            [
                torch.stack([loss_sum.double(), correct.double(), scored.double()]),
                torch.stack([test_right.double(), test_scored.double()]),
                torch.tensor([seen, rss_mb, machine.own_s], device=self.main, dtype=torch.float64),
            ]
        )
        loss, right, n, test_ok, test_n, items, rss, own_cpu = self.strategy.all_reduce(sums).tolist()
        highs = torch.tensor([train_s, eval_s, wait], device=self.main, dtype=torch.float64)
        train_s, eval_s, wait = self.strategy.all_reduce(highs, op="max").tolist()
        first = -self.strategy.all_reduce(-bad.reshape(1), op="max").item()
        return Epoch(
            epoch + 1,
            train_s,
            eval_s,
            items,
            loss / n if n else math.nan,
            right / n if n else math.nan,
            test_ok / test_n if test_n else math.nan,
            lr,
            wait,
            None if first >= big else int(first),
            rss,
            machine.columns(own_cpu),
            own_cpu,
        )

    def save_checkpoint(self, epoch: int) -> None:
        every, last = self.t.checkpoint_every, epoch == self.t.epochs
        if self.rank != 0 or not (last or (every and epoch % every == 0)):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        info = checkpoint.Info(self.ctx.run_id, str(self.ctx.identity["config_hash"]), epoch, self.t.epochs, last)
        checkpoint.save(self.folder, info, self.strategy.bare, self.strategy.optimizer, self.strategy.scaler)
        if self.source is not None and self.source.stem != self.ctx.run_id:
            checkpoint.remove(self.source)  # ours now holds everything it held, and more
            log.info("checkpoint %s continued in %s", self.source.name, self.folder / f"{self.ctx.run_id}.pt")
            self.source = None

    # --- rows ---------------------------------------------------------------------------

    def record_data_pass(self) -> None:
        """The input pipeline alone: batches drawn and moved to the device, no compute."""
        n = min(DATA_PASS_BATCHES, len(self.train_batches))

        def draw() -> None:
            batches = self.train_batches.epoch(0)
            for _ in zip(range(n), batches):
                pass
            self.strategy.sync()

        with torch.random.fork_rng(devices=[]):  # loader workers draw seeds: keep training's RNG as it was
            self.ctx.measure(
                "data loader",
                draw,
                self.ctx.devices,
                items=n * self.plan.per_device_batch * self.spec.items_per_sample,
                items_unit=self.spec.unit,
                note=f"{n} batch{'es' if n != 1 else ''} drawn and moved to the device, no compute",
            )

    def record_epoch(self, e: Epoch) -> None:
        per_step = self.achieved(e.items / e.train_s)
        row = dict(
            epoch=e.epoch,
            train_s=e.train_s,
            train_cpu_s=e.cpu_s,
            eval_s=e.eval_s,
            items_per_s=e.items / e.train_s,
            per_device_items_per_s=e.items / e.train_s / self.n_devices,
            train_loss=e.loss,
            train_acc=e.train_acc,
            test_acc=e.test_acc,
            lr=e.lr,
            data_wait_s=e.data_wait_s,
            data_wait_frac=e.data_wait_s / e.train_s,
            input_bound=e.data_wait_s / e.train_s >= INPUT_BOUND,
            rss_peak_mb=e.rss_peak_mb,
            **e.machine,
            **e.phases,
            **per_step,
            note=self.notes,
            **self.fixed,
        )
        if e.first_bad_step is not None:
            self.ctx.record(
                "epoch",
                status="error",
                devices=self.ctx.devices,
                **row,
                error=f"diverged at step {e.first_bad_step}: the loss became NaN/inf (lr {e.lr:.3g}); "
                f"the epoch's {e.items / e.train_s:,.0f} {self.spec.unit}/s stand, its loss and accuracy do not; "
                f"try trainer.lr={self.t.lr / 10:.3g}",
            )
            return
        self.ctx.record("epoch", devices=self.ctx.devices, **row)

    def record_compile(self) -> None:
        from perflab.measure.dynamo import graph_breaks, unique_graphs

        info = self.compile_info
        if not info:
            return
        breaks = graph_breaks()
        self.ctx.record(
            "compile",
            devices=self.ctx.devices,
            first_step_s=info["first_step_s"],
            graphs=info["graphs"],
            recompiles=unique_graphs() - info["graphs_after_first_step"],
            graph_breaks=breaks,
            note=f"torch.compile(mode={self.knobs.compile_mode}, backend={self.knobs.compile_backend}): "
            "the first step's time includes compiling; evaluation runs the uncompiled module",
            **self.fixed,
        )

    def record_summary(self, epochs: list[Epoch], profiled: tuple[str, Any] | None = None) -> None:
        """One row for the whole run: epoch-time stats with its first epoch as warm-up; with
        ``profiled`` (``profiled_steps``) its trace and its operators per step."""
        times = [e.train_s for e in epochs]
        warm, timed = (times[:1], times[1:]) if len(times) > 1 else ([], times)
        stats = bench.stats_of(timed, warm, noise_threshold=self.ctx.settings.bench.noise_threshold)
        last = epochs[-1]
        rate = last.items / stats.median
        note = self.notes if warm else "; ".join(x for x in (self.notes, "one epoch: its time includes warm-up") if x)
        timed_epochs = epochs[1:] or epochs
        written = self.ctx.record(
            "train",
            stats,
            devices=self.ctx.devices,
            epochs=len(times),
            items_per_s=rate,
            per_device_items_per_s=rate / self.n_devices,
            train_loss=last.loss,
            train_acc=last.train_acc,
            test_acc=last.test_acc,
            lr=last.lr,
            **self.achieved(rate),
            data_wait_frac=sum(e.data_wait_s for e in timed_epochs) / sum(e.train_s for e in timed_epochs),
            rss_peak_mb=max(e.rss_peak_mb for e in epochs),
            **worst([e.machine for e in timed_epochs]),
            **step_split(timed_epochs),
            suspect=stats.suspect,
            note=note,
            **({"trace": profiled[0]} if profiled and profiled[0] else {}),
            **({"profile_s": profiled[1].pass_s} if profiled else {}),
            **self.fixed,
        )
        if profiled is not None:  # per step, beside the timed step (an epoch's median over its steps)
            from perflab.measure import operators

            step_s = stats.median / len(self.train_batches)
            operators.write(self.ctx.run_dir, {**written, "median_s": step_s}, profiled[1].table)

    def achieved(self, items_per_s: float) -> dict[str, Any]:
        """``tflops`` (and ``mfu`` / ``pct_of_peak`` where a peak is known) at this rate; none
        where the FLOPs could not be counted."""
        if self.flops_per_item is None:
            return {}
        tflops = self.flops_per_item * items_per_s / 1e12
        return {"tflops": tflops, **self.ctx.utilization(tflops, self.ctx.devices, self.t.precision)}

    def progress(self, it: Iterator[Any], total: int, desc: str) -> Iterator[Any]:
        """A per-epoch progress bar on a terminal (rank 0 only); plain iteration elsewhere."""
        if self.rank != 0 or not logs.live():
            return it
        from tqdm import tqdm

        return iter(tqdm(it, total=total, desc=desc, leave=False, unit="batch"))


def step_split(epochs: list[Epoch]) -> dict[str, Any]:
    """Forward, backward and optimizer seconds per step, the mean over these epochs (none where
    the strategy's step has no such split)."""
    split = [e.phases for e in epochs if e.phases]
    return {k: sum(p[k] for p in split) / len(split) for k in split[0]} if split else {}


def training_flops_per_item(
    model: torch.nn.Module, spec: data.Spec, objective: objectives.Objective = objectives.CLASSES
) -> float:
    """Forward + backward FLOPs per item (an image, a token ...), counted on a shape-only
    (meta) copy of the model with a batch of two of the data's real shape and dtype (BatchNorm
    in training mode needs more than one value per channel), so that nothing runs and no
    state (BatchNorm statistics) changes. A model that reads a value back while it runs (a
    ``.item()``: Hugging Face's masking code) cannot run on meta tensors: it is counted on a
    real copy with a real batch of two instead, the model itself still untouched."""
    import copy

    def counted(device: str) -> float:
        net = copy.deepcopy(model).to(device).train()
        x, y = (t.to(device) for t in objective.example(spec, 2))

        def step() -> None:
            objective.loss(net, x, y)[0].backward()

        return flops.count(step) / (2 * spec.items_per_sample)

    try:
        return counted("meta")
    except (RuntimeError, NotImplementedError) as e:  # a value read back on a meta tensor
        log.debug("training FLOPs: the meta count failed (%s); counting a real copy on the CPU", e)
        return counted("cpu")
