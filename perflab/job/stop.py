"""Stop means stop: a job told to end (scancel's SIGTERM, SLURM's warning signal before a time
limit, Ctrl-C) stops measuring at once and leaves a ``cancelled`` / ``timeout`` row, never
more ``ok`` rows after it was told.

submitit (Hydra's SLURM launcher) ignores SIGTERM and answers the time-limit signal (SIGUSR2,
``signal_delay_s`` before the limit) by requeueing; inside a perflab job ours take over for
the job's duration and the previous handlers come back afterwards. torch's elastic agent turns
a signal into its own exception while workers run (:func:`stop_of` reads it as the stop it is).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Callable, Iterator


class Stopped(BaseException):
    """Raised in the job's main thread by a stop signal. A BaseException, like
    KeyboardInterrupt, so that ``except Exception`` in an experiment cannot swallow it."""

    def __init__(self, status: str, why: str) -> None:
        super().__init__(why)
        self.status, self.why = status, why


SIGNALS = {signal.SIGTERM: ("cancelled", "stopped by SIGTERM (kill, scancel, preemption, a lost node, or a shutdown)")}
if hasattr(signal, "SIGUSR2"):
    SIGNALS[signal.SIGUSR2] = ("timeout", "stopped by SIGUSR2: SLURM's warning that the time limit is near")


def stop_of(exc: BaseException) -> BaseException | None:
    """torch elastic's ``SignalException`` (its handler turns a signal into an exception) as the
    stop it stands for: KeyboardInterrupt for Ctrl-C, :class:`Stopped` for a stop signal or any
    other; None for an exception that no signal raised."""
    sig = getattr(exc, "sigval", None)
    if type(exc).__name__ != "SignalException" or sig is None:
        return None
    if sig == signal.SIGINT:
        return KeyboardInterrupt()
    status, why = SIGNALS.get(sig, ("cancelled", f"stopped by {signal.Signals(sig).name}"))
    return Stopped(status, why)


# The stop signals received in the current block. A signal can land while Python runs a
# finalizer or a lock's release, where the raised Stopped is printed and ignored; the stop is
# still here, and the next ok row raises it (raise_if_stopped).
_received: list[Stopped] = []


@contextlib.contextmanager
def on_stop_signals() -> Iterator[None]:
    """Within the block, the stop signals raise :class:`Stopped` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        status, why = SIGNALS[signal.Signals(signum)]
        _received.append(Stopped(status, why))
        if not _held:
            raise _received[-1]

    _received.clear()
    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _received.clear()


_held: list[bool] = []


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """Within the block (the stop's own row being written), a stop signal is kept, not raised:
    SLURM may send a preempted job's SIGTERM twice."""
    _held.append(True)
    try:
        yield
    finally:
        _held.pop()


def raise_if_stopped() -> None:
    """Raise the stop a signal asked for, if its own raise was swallowed."""
    if _received:
        raise _received[0]


def terminate_as_interrupt() -> Callable[[], None]:
    """SIGTERM (``kill``, a closing session) ends a command as Ctrl-C does: a sweep cancels the
    jobs it submitted and still prints its summary; the chapter's point being measured becomes a
    row. Returns what restores the old handler (nothing to do off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
