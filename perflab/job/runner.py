"""The part of a job that touches torch: resolve devices, run the experiment, and turn whatever
stops it into a row: a crash (``error``, traceback in ``error.txt``), an out-of-memory
(``oom``), a stop signal (``cancelled`` / ``timeout``), Ctrl-C (``cancelled``, then the
interrupt goes on). ``run.json`` says what came of it; only an ``ok`` run is marked done.

Three steps, each a method of :class:`GuardedJob`: ``open`` (the writer, the machine's identity,
the devices: a refusal ends the job there), ``run`` (the experiment under the stop signals) and
``close`` (run.json, the done marker, the job's table).
"""

from __future__ import annotations

import errno
import logging
import os
import traceback
from pathlib import Path
from typing import Any

from perflab.analysis.table import job_table
from perflab.config.registry import Experiment
from perflab.config.schema import PerflabConfig
from perflab.errors import ConfigError, MissingDevice, first_line
from perflab.job import sharing
from perflab.job.context import Context
from perflab.job.ending import Place, Result, discard, record_time, refuse, save_record
from perflab.job.stop import Stopped, on_stop_signals, raise_if_stopped, stop_of, stop_signals_held
from perflab.measure import memory
from perflab.measure.devices import Device, cpu_threads, resolve, use_threads
from perflab.measure.environment import environment, model_contents, subject
from perflab.measure.instruments.machine import Machine
from perflab.measure.peaks import Peaks
from perflab.store import done_marks, files
from perflab.store.point_claims import HeldClaim, TakenOver
from perflab.store.rows import RESULTS
from perflab.store.rundir import RunRecord, RunWriter

log = logging.getLogger("perflab")


class GuardedJob:
    """One job between its checks and its record: what it ran on, what came of it, and what
    stopped it (an interrupt re-raised once the job is recorded)."""

    def __init__(
        self,
        settings: PerflabConfig,
        experiment: Experiment,
        peaks: Peaks,
        place: Place,
        record: RunRecord,
        identity: dict[str, Any],
        claim: HeldClaim | None = None,
    ) -> None:
        self.settings, self.experiment, self.peaks = settings, experiment, peaks
        self.place, self.record, self.identity = place, record, identity
        r = settings.results
        fence = claim.fence if claim is not None else None  # a sweep point's claim, checked around each record
        self.fence = fence or _unfenced
        self.writer = RunWriter(
            place.run_dir, ledger=Path(r.ledger) if r.ledger else None, samples=r.samples, fence=fence
        )
        self.devices: list[Device] = []
        self.skip_reason = ""  # a device this machine lacks, in a sweep: the job is one skipped row
        self.ctx: Context | None = None
        self.outcome = "ok"
        self.interrupted: BaseException | None = None
        self.said: list[str] = []  # what the job's own row says (kept here too, in case it cannot be written)

    def go(self) -> Result:
        """One job's torch half: open, run, close (a refusal at open or run ends it there)."""
        with cpu_threads(None):  # the caller's intra-op threads again after the job (open sets the job's)
            refused = self.open()
            if refused is None:
                refused = self.run()
            return refused if refused is not None else self.close()

    # --- open ------------------------------------------------------------------------------------

    def open(self) -> Result | None:
        """The machine's identity in every row, the devices resolved, the experiment's context;
        a device that cannot be had (outside a sweep) or a launcher that cannot share it is refused."""
        began = (os.getpid(), Machine().__enter__())  # the job's window: others' CPU share from here on
        quiet_library_logs()
        place, record = self.place, self.record
        # the contents a sweep's claim read (claim_point) are the ones its rows and done mark name
        contents = {"model_digest": record.model_digest} if record.model_digest else model_contents(self.settings.model)
        what = {**subject(self.settings.results.subject), **contents}
        self.identity = identity = {**self.identity, **environment(), **what}
        record.subject, record.perflab_version = str(identity["subject"]), str(identity["perflab_version"])
        record.model_digest = str(identity.get("model_digest", ""))
        record.where = {k: str(v) for k, v in identity.items() if k.startswith("slurm_") or k == "log"}
        on_missing = self.settings.devices.on_missing
        fallback = beside = ""
        try:
            use_threads(self.settings.devices.threads)  # before any work; each row's num_threads says it
            resolved = resolve(self.settings.devices)
            self.devices, fallback = resolved.devices, resolved.fallback
            beside = sharing.beside(place, self.devices)
        except MissingDevice as missing:
            if not (on_missing == "skip" or (on_missing == "auto" and place.in_sweep)):
                return refuse(missing, place, record, identity)
            self.skip_reason = missing.line()
        except ConfigError as err:
            return refuse(err, place, record, identity)
        self.ctx = Context(
            self.settings,
            self.devices,
            self.writer,
            {**identity, "fallback": fallback, "beside": beside},
            self.peaks,
            progress=self.experiment.progress,
            metric=self.experiment.metric,
            began=began,
        )
        return None

    # --- run -------------------------------------------------------------------------------------

    def run(self) -> Result | None:
        """The experiment (or the skipped row), under the stop signals: a crash, an out-of-memory,
        a stop signal or Ctrl-C becomes the job's own row. A ConfigError (the experiment's check,
        or one only its run can make) refuses the job."""
        ctx, place = self.ctx, self.place
        assert ctx is not None, "open() first"
        with on_stop_signals():
            try:
                if not self.skip_reason:
                    self.experiment.check(self.settings, self.devices)  # refused here: nothing recorded yet
                if not place.helper:
                    self.record.save(place.run_dir)  # "running": a job killed without a word is never taken as done
                names = ", ".join(d.name for d in self.devices) or "-"
                log.info("perflab %s on %s -> %s", place.experiment, names, place.run_dir)
                if self.skip_reason:
                    ctx.skip("job", self.skip_reason)
                    self.outcome = "skipped"
                else:
                    seed_everything(self.settings.seed)
                    self.experiment.run(ctx)
                    raise_if_stopped()  # a stop whose own raise Python swallowed is still a stop
                    if not (self.rows() or place.helper or ctx.recorded_elsewhere):  # a silent pass is no result
                        self.outcome = "error"
                        self.job_row("error", f"{self.experiment.name} recorded no rows")
            except ConfigError as err:
                return refuse(err, place, self.record, ctx.identity, self.writer)
            except (Stopped, KeyboardInterrupt) as stop:
                self.stopped(stop)
            except (Exception, SystemExit) as exc:  # a crash (sys.exit too) is a row, not a lost job
                signalled = stop_of(exc)  # a signal that a library's own handler turned into its exception
                if signalled is not None:
                    self.stopped(signalled)
                else:
                    self.crashed(exc)
        return None

    def stopped(self, stop: BaseException) -> None:
        """A stop signal (``cancelled`` / ``timeout``) or Ctrl-C as the job's row; the whole
        command stops too, but for a stop signal to a SLURM job of its own."""
        if isinstance(stop, Stopped):
            self.outcome = stop.status
            self.job_row(stop.status, stop.why)
            if not os.environ.get("SUBMITIT_EXECUTOR"):
                self.interrupted = KeyboardInterrupt()
        else:
            self.outcome, self.interrupted = "cancelled", stop
            self.job_row("cancelled", "interrupted (Ctrl-C)")

    def crashed(self, exc: Exception | SystemExit) -> None:
        """A crash as the job's row: ``oom`` or ``error`` with one line, its traceback in error.txt."""
        place = self.place
        self.outcome = "oom" if memory.is_oom(exc) else "error"
        line = (
            files.os_line(exc)
            if isinstance(exc, OSError) and _write_failed(exc)
            else f"{type(exc).__name__}: {first_line(exc)}"
        )
        columns: dict[str, Any] = {}
        if isinstance(exc, memory.WillNotFit):  # predicted: nothing was allocated, no traceback to keep
            line = f"out of memory: {exc}"
            columns = {"predicted_bytes": exc.needed, "available_bytes": exc.available}
        if place.helper:
            log.error("".join(traceback.format_exception(exc)))
        elif not columns and not _write_failed(exc):  # on a full disk, no room for a traceback
            where = place.run_dir / "error.txt"
            try:
                where.write_text("".join(traceback.format_exception(exc)))
            except OSError:
                where = place.run_dir / "perflab.log"
                log.debug("".join(traceback.format_exception(exc)))
            log.error("%s (traceback: %s)", line, where)
        self.job_row(self.outcome, line, **columns)

    def job_row(self, status: str, error: str, **columns: Any) -> None:
        """The job's own row, which a further stop signal does not cut short. A helper node (no
        rank 0) writes nothing in the job dir it shares with the node that has rank 0: what
        stopped it is in its own log."""
        assert self.ctx is not None
        self.said.append(error)
        with stop_signals_held():
            if self.place.helper:
                log.error("helper node %s: %s: %s", self.identity.get("hostname", ""), status, error)
                return
            try:
                self.ctx.record("job", status=status, error=error, **columns)
            except OSError as err:  # the disk that failed the job fails its row too: say it here
                also = "" if files.os_line(err) == error else f" (its row could not be written: {files.os_line(err)})"
                log.error("perflab: %s: %s%s", status, error, also)

    # --- close -----------------------------------------------------------------------------------

    def close(self) -> Result:
        """run.json says what came of the job; a complete one is marked done; the job's table;
        then an interrupt goes on."""
        place, record = self.place, self.record
        rows = self.rows()
        assert self.ctx is not None, "open() first"
        if place.helper or (self.ctx.recorded_elsewhere and not rows):
            # A node of a multi-node run whose workers hold no rank 0: the node with it records the
            # point (under SLURM, in this same job dir, which stays).
            if not place.helper:
                discard(place.run_dir, also_record=True)
            self.go_on()
            return Result(self.outcome, place.run_dir)
        if self.outcome == "ok" and any(row.get("status") in ("error", "oom") for row in rows):
            self.outcome = "error"  # a part failed (a wrong compiled answer, a diverged run): not done
        record.outcome, record.complete, record.rows = self.outcome, self.outcome == "ok", len(rows)
        record.finished = record_time()
        record.error = next((str(row["error"]) for row in rows if row.get("status") not in ("ok", "skipped")), "")
        record.error = record.error or next(iter(self.said), "")  # what stopped it, when its row could not be written
        self.fence()  # a point taken over while we were paused: no record says we measured it
        save_record(record, place)
        if record.complete:
            store = Path(self.settings.results.store)
            try:
                done_marks.mark_done(store, record, place.run_dir)
            except OSError as err:
                log.error("perflab: %s; a re-run of this sweep measures this point again", files.os_line(err))
            try:
                self.fence()
            except TakenOver:
                done_marks.unmark(store, record)
                raise
        if rows and self.settings.results.table:
            e = self.experiment
            headline = [e.work(rows), *e.headline(rows), *e.beside_reference(rows)]
            table = job_table(rows, headline, e.metric, e.label)
            log.info("\n%s\n\nrows: %s", table, place.run_dir / RESULTS)
        self.go_on()
        return Result(self.outcome, place.run_dir, rows, record.error)

    def rows(self) -> list[dict[str, Any]]:
        """This run's rows: not another writer's in the same dir (the sweep's own row for a job that
        it thought lost, the rows of a stalled earlier run of a requeued SLURM job)."""
        return [row for row in self.writer.rows if row.get("run_id") == self.record.run_id]

    def go_on(self) -> None:
        """A stop that ends the whole command (Ctrl-C, a stop signal outside SLURM) goes on."""
        if self.interrupted is not None:
            raise self.interrupted


def _unfenced() -> None:
    """No claim to check (a single run, ``results.redo=true``)."""


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _write_failed(exc: BaseException) -> bool:
    """Raised by one of perflab's own writes for want of room or by the device (a full disk, an
    I/O error): a line naming the file says it all; there is no room for a traceback file."""
    return isinstance(exc, OSError) and exc.errno in (*files.FULL, errno.EIO, errno.EROFS)


# Library log lines that say nothing to a user (e.g. "No CUDA runtime is found" on every CPU-only
# compile): kept in the job's log file, off the terminal.
QUIET_LOGGERS = ("torch.utils.cpp_extension",)


def quiet_library_logs() -> None:
    files: list[logging.Handler] = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = files, False
