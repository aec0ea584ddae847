"""The part of a job that touches torch: resolve devices, run the experiment, and turn whatever
stops it into a row: a crash (``error``, traceback in ``error.txt``), an out-of-memory
(``oom``), a stop signal (``cancelled`` / ``timeout``), Ctrl-C (``cancelled``, then the
interrupt goes on). ``run.json`` says what came of it; only an ``ok`` run is marked done.
"""

from __future__ import annotations

import errno
import logging
import os
import traceback
from pathlib import Path
from typing import Any

from perflab import files, launchers, memory, store
from perflab.context import Context
from perflab.devices import resolve
from perflab.environment import environment, subject
from perflab.errors import ConfigError, MissingDevice, first_line
from perflab.job import Place, Result, discard, record_time, refuse, save_record, seed_everything
from perflab.peaks import Peaks
from perflab.registry import Experiment
from perflab.rows import RESULTS
from perflab.rundir import RunRecord, RunWriter
from perflab.schema import PerflabConfig
from perflab.stop import Stopped, on_stop_signals, raise_if_stopped, stop_signals_held
from perflab.table import job_table

log = logging.getLogger("perflab")


def run(
    settings: PerflabConfig,
    experiment: Experiment,
    peaks: Peaks,
    place: Place,
    record: RunRecord,
    identity: dict[str, Any],
) -> Result:
    quiet_library_logs()
    r = settings.results
    writer = RunWriter(place.run_dir, ledger=Path(r.ledger) if r.ledger else None, samples=r.samples)
    identity = {**identity, **environment(), **subject(r.subject)}
    record.subject, record.perflab_version = str(identity["subject"]), str(identity["perflab_version"])
    record.where = {k: str(v) for k, v in identity.items() if k.startswith("slurm_") or k == "log"}
    try:
        resolved = resolve(settings.devices)
        devices, fallback = resolved.devices, resolved.fallback
        beside = launchers.beside(place, devices)
    except MissingDevice as missing:
        skip = settings.devices.on_missing == "skip" or (settings.devices.on_missing == "auto" and place.in_sweep)
        if not skip:
            return refuse(missing, place, record, identity)
        devices, fallback, beside = [], "", ""
        skip_reason = missing.line()
    except ConfigError as err:
        return refuse(err, place, record, identity)
    else:
        skip_reason = ""
    ctx = Context(
        settings,
        devices,
        writer,
        {**identity, "fallback": fallback, "beside": beside},
        peaks,
        progress=experiment.progress,
        metric=experiment.metric,
    )
    outcome, interrupted = "ok", None
    said: list[str] = []  # what the job's own row says (kept here too, in case it cannot be written)

    def job_row(status: str, error: str, **columns: Any) -> None:
        """The job's own row, which a further stop signal does not cut short. A helper node (no
        rank 0) writes nothing in the job dir it shares with the node that has rank 0: what
        stopped it is in its own log."""
        said.append(error)
        with stop_signals_held():
            if place.helper:
                log.error("helper node %s: %s: %s", identity.get("hostname", ""), status, error)
                return
            try:
                ctx.record("job", status=status, error=error, **columns)
            except OSError as err:  # the disk that failed the job fails its row too: say it here
                also = "" if files.os_line(err) == error else f" (its row could not be written: {files.os_line(err)})"
                log.error("perflab: %s: %s%s", status, error, also)

    with on_stop_signals():
        try:
            if not skip_reason:
                experiment.check(settings, devices)  # refused here: nothing recorded yet
            if not place.helper:
                record.save(place.run_dir)  # "running": a job killed without a word is never taken as done
            log.info(
                "perflab %s on %s -> %s", place.experiment, ", ".join(d.name for d in devices) or "-", place.run_dir
            )
            if skip_reason:
                ctx.skip("job", skip_reason)
                outcome = "skipped"
            else:
                seed_everything(settings.seed)
                experiment.run(ctx)
                raise_if_stopped()  # a stop whose own raise Python swallowed is still a stop
        except ConfigError as err:  # the experiment's check, or one only its run can make (batch vs data)
            return refuse(err, place, record, ctx.identity, writer)
        except Stopped as stop:
            outcome = stop.status
            job_row(stop.status, stop.why)
            if not os.environ.get("SUBMITIT_EXECUTOR"):  # not a SLURM job of its own: the whole command stops
                interrupted = KeyboardInterrupt()
        except KeyboardInterrupt as stop:
            outcome, interrupted = "cancelled", stop
            job_row("cancelled", "interrupted (Ctrl-C)")
        except Exception as exc:  # a crash is a row, not a lost job
            outcome = "oom" if memory.is_oom(exc) else _stopped(exc) or "error"
            line = (
                files.os_line(exc)
                if isinstance(exc, OSError) and _write_failed(exc)
                else f"{type(exc).__name__}: {first_line(exc)}"
            )
            columns = {}
            if isinstance(exc, memory.WillNotFit):  # predicted: nothing was allocated, no traceback to keep
                line, columns = (
                    f"out of memory: {exc}",
                    {"predicted_bytes": exc.needed, "available_bytes": exc.available},
                )
            if place.helper:
                log.error("".join(traceback.format_exception(exc)))
            elif columns or _write_failed(exc):
                pass  # the job's row (or its line) says it all; on a full disk, no room for a traceback
            else:
                where = place.run_dir / "error.txt"
                try:
                    where.write_text("".join(traceback.format_exception(exc)))
                except OSError:
                    where = place.run_dir / "perflab.log"
                    log.debug("".join(traceback.format_exception(exc)))
                log.error("%s (traceback: %s)", line, where)
            job_row(outcome, line, **columns)
    # This run's rows: not another writer's in the same dir (the sweep's own row for a job that
    # it thought lost, the rows of a stalled earlier run of a requeued SLURM job).
    rows = [row for row in writer.rows if row.get("run_id") == record.run_id]
    if place.helper or (outcome == "ok" and not rows):
        # A node of a multi-node run whose workers hold no rank 0: the node with it records the
        # point (under SLURM, in this same job dir, which stays).
        if not place.helper:
            discard(place.run_dir, also_record=True)
        if interrupted is not None:
            raise interrupted
        return Result(outcome, place.run_dir)
    if outcome == "ok" and any(row.get("status") in ("error", "oom") for row in rows):
        outcome = "error"  # a part failed (a wrong compiled answer, a diverged run): not done
    record.outcome, record.complete, record.rows, record.finished = outcome, outcome == "ok", len(rows), record_time()
    record.error = next((str(row["error"]) for row in rows if row.get("status") not in ("ok", "skipped")), "")
    record.error = record.error or next(iter(said), "")  # what stopped it, when its row could not be written
    save_record(record, place)
    if record.complete:
        try:
            store.mark_done(Path(settings.results.store), record, place.run_dir)
        except OSError as err:
            log.error("perflab: %s; a re-run of this sweep measures this point again", files.os_line(err))
    if rows and settings.results.table:
        log.info(
            "\n%s\n\nrows: %s",
            job_table(
                rows,
                [experiment.work(rows), *experiment.headline(rows), *experiment.beside_reference(rows)],
                experiment.metric,
                experiment.label,
            ),
            place.run_dir / RESULTS,
        )
    if interrupted is not None:
        raise interrupted
    return Result(outcome, place.run_dir, rows, record.error)


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


def _stopped(exc: BaseException) -> str | None:
    """The elastic agent turns a stop signal into its own exception while workers run."""
    if type(exc).__name__ == "SignalException":
        return "cancelled"
    return None
