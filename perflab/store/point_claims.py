"""Claims on sweep points: ``.perflab/claims/<config hash>.json`` says who measures a point now
(host, pid, a random token); its mtime is a heartbeat, so a claim whose holder died is taken
over. Two sweeps of the same points share the work instead of measuring it twice.

A claim can be lost without its holder dying: a process paused (SIGSTOP, a laptop lid, a SLURM
suspend) beats no more, and another takes the point over. So a holder fences every record it
makes (:meth:`HeldClaim.fence`): before and after writing a row or the done mark it checks that the
claim file still holds its own token; a take-over replaced it, and the holder stops there
(:class:`TakenOver`) instead of recording a second measurement of the point."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perflab.store import files
from perflab.store.tree import derived_dir, meta

log = logging.getLogger("perflab")


@dataclass(frozen=True)
class Holder:
    """Who is measuring a point now (as its claim file says)."""

    host: str
    pid: int
    run_dir: str
    age_s: float  # seconds since its last heartbeat
    slurm_job: str = ""  # the SLURM job it ran in, if any
    path: str = ""  # the claim file
    unreadable: str = ""  # why the claim file says nothing (empty, not a claim, a directory)

    def __str__(self) -> str:
        if self.unreadable:
            return f"the claim file {self.path} ({self.unreadable}, {self.age_s:.0f} s old)"
        return f"{self.host}:{self.pid} ({self.run_dir}; claim file {self.path})"


# A claim file is written at once by the process that created it: one that still says nothing
# after this long never will (its writer died, or a full disk cut it short).
UNREADABLE_GRACE_S = 5.0


class TakenOver(BaseException):
    """This process's claim on a point was taken over (it was paused past ``claim_stale_s``):
    what it measured after that is not recorded. A BaseException, like Stopped, so that an
    experiment's ``except Exception`` cannot swallow it."""

    def __init__(self, claim: "HeldClaim") -> None:
        self.holder = _holder(claim.path)
        silent = time.monotonic() - claim.last_seen
        super().__init__(
            f"this point was taken over by {self.holder or 'another process'} while this process was "
            f"paused ({silent:.0f} s without a heartbeat; results.claim_stale_s={claim.stale_s:g})"
        )


class HeldClaim:
    """A held claim on a sweep point; a thread refreshes its mtime until ``release()``. A claim
    that another process took over (it thought this one gone) is left to that process."""

    def __init__(self, path: Path, body: bytes, beat_s: float, stale_s: float = 0.0) -> None:
        self.path, self.body, self._stop = path, body, threading.Event()
        self.stale_s, self.last_seen = stale_s, time.monotonic()
        self._thread = threading.Thread(target=self._beat, args=(beat_s,), daemon=True, name="perflab-claim")
        self._thread.start()

    def _mine(self) -> bool:
        try:
            return files.read_regular(self.path) == self.body
        except FileNotFoundError:
            return False
        except OSError:  # a passing read error (a network filesystem): still ours
            return True

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every) and self._mine():
            try:
                os.utime(self.path)
                self.last_seen = time.monotonic()
            except OSError:
                return

    def fence(self) -> None:
        """Raise TakenOver unless this claim is still ours: called before and after each record."""
        if not self._mine():
            raise TakenOver(self)
        self.last_seen = time.monotonic()

    def release(self) -> None:
        self._stop.set()
        if self._mine():
            self.path.unlink(missing_ok=True)

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a worker process (a DDP rank's RunWriter fences its rows too): the claim's
        fence only; its heartbeat and its release stay with the process that claimed it."""
        return Fence, (self.path, self.body, self.stale_s)


class Fence(HeldClaim):
    """A claim held by another process of this job, seen from a worker: it can only be checked."""

    def __init__(self, path: Path, body: bytes, stale_s: float) -> None:  # no heartbeat thread here
        self.path, self.body, self.stale_s, self.last_seen = path, body, stale_s, time.monotonic()

    def release(self) -> None:
        raise RuntimeError("a worker cannot release its job's claim")


def claim(root: Path, config_hash: str, run_dir: Path, stale_s: float) -> HeldClaim | Holder:
    """Claim the point ``config_hash`` for this process, or say who holds it.

    A claim is taken over when its holder is gone: a dead pid on this host, no heartbeat for
    ``stale_s`` (a holder on another node that was killed), or an earlier run of this same
    SLURM job (requeued after a preemption or a node failure: SLURM ended that run).
    """
    folder = derived_dir(meta(root) / "claims")
    path = folder / f"{config_hash}.json"
    body = json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "run_dir": str(run_dir),
            "since": time.time(),
            "slurm_job": os.environ.get("SLURM_JOB_ID", ""),
            "token": secrets.token_hex(8),  # a take-over replaces it: how a paused holder knows
        }
    ).encode()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except (FileExistsError, IsADirectoryError):
            holder = _holder(path)
            if holder is None:  # gone between our try and our look
                continue
            if not _gone(holder, stale_s):
                return holder
            _take_over(path, holder)
            continue
        try:
            with files.naming(path), os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
        except OSError:  # a full disk, an I/O error: leave no empty claim behind for others to wait on
            path.unlink(missing_ok=True)
            raise
        return HeldClaim(path, body, beat_s=max(1.0, min(30.0, stale_s / 4)), stale_s=stale_s)
    return _holder(path) or Holder("?", 0, "?", 0.0, path=str(path), unreadable="changing hands")


def requeued() -> bool:
    """This is a SLURM job's second or later run (SLURM requeued it)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) > 0


# Each claim's heartbeat as this process saw it: (its mtime when last looked at, when this process
# first saw that mtime, by its own clock). Nodes' clocks differ: a claim stamped in the future (a
# writer whose clock is ahead) still goes stale once its mtime stops moving for stale_s here.
_SEEN: dict[str, tuple[int, float]] = {}
_clock = time.monotonic  # this process's own clock (a test's, to age a claim without waiting)


def _age(path: Path, mtime_ns: int) -> float:
    """Seconds since the claim's last heartbeat: against the filesystem's own clock (a file just
    stamped beside it: the holder's mtimes come from the same clock, whatever this node's says),
    and never less than how long this process has seen its mtime stand still."""
    now = _clock()
    seen = _SEEN.get(str(path))
    if seen is None or seen[0] != mtime_ns:
        _SEEN[str(path)] = seen = (mtime_ns, now)
    return max((_filesystem_now(path.parent) - mtime_ns) / 1e9, now - seen[1])


def _filesystem_now(folder: Path) -> int:
    """The time (ns) as the filesystem holding ``folder`` stamps files now: a probe file made and
    removed. This node's clock where none can be made (a read-only tree)."""
    probe = folder / f".clock-{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return time.time_ns()
    try:
        os.utime(fd)  # stamped by the same call a heartbeat makes
        return os.fstat(fd).st_mtime_ns
    except OSError:
        return time.time_ns()
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            probe.unlink()


def _holder(path: Path) -> Holder | None:
    """What the claim file at ``path`` says; None if there is none. A file that cannot be read
    as a claim (empty, garbage, a directory) is a Holder that says why, aged by its mtime."""
    try:
        age = _age(path, path.lstat().st_mtime_ns)
    except FileNotFoundError:
        return None
    except OSError as err:
        return Holder("?", 0, "?", 0.0, path=str(path), unreadable=err.strerror or str(err))
    if path.is_dir():
        return Holder("?", 0, "?", age, path=str(path), unreadable="a directory")
    try:
        data = files.read_json(path)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return Holder(
            str(data.get("host", "?")),
            int(data.get("pid", 0)),
            str(data.get("run_dir", "?")),
            age,
            str(data.get("slurm_job", "")),
            path=str(path),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as err:
        size = path.stat().st_size if path.exists() else 0
        why = "empty" if size == 0 else f"not a claim: {type(err).__name__}"
        return Holder("?", 0, "?", age, path=str(path), unreadable=why)


def _gone(holder: Holder, stale_s: float) -> bool:
    if holder.age_s > stale_s:
        return True
    if holder.unreadable:  # never a claim (a directory), or one that stayed unwritten
        return holder.unreadable == "a directory" or holder.age_s > min(stale_s, UNREADABLE_GRACE_S)
    if holder.slurm_job and holder.slurm_job == os.environ.get("SLURM_JOB_ID") and requeued():
        return True
    if holder.host != socket.gethostname():
        return False
    if not 0 < holder.pid <= PID_MAX:  # no process has it (0 and -1 would ask about whole groups)
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


PID_MAX = 2**22  # Linux's pid_max at most (4194304)


def _take_over(path: Path, holder: Holder) -> None:
    """Move the dead holder's claim aside (only one of several takers can), then retry."""
    aside = path.with_name(f"{path.name}.gone-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = _holder(aside)
    if (
        moved is not None
        and not moved.unreadable
        and (moved.host, moved.pid, moved.run_dir) != (holder.host, holder.pid, holder.run_dir)
    ):
        # someone claimed it between our look and our move: put theirs back
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)
    log.info("perflab: took over %s%s", holder, "" if holder.unreadable else ": its holder stopped")
