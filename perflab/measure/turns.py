"""Two jobs in one process take turns: one measures a sample, then the other, never both at once.

``perflab ab`` measures both sides of a comparison in one process where they differ only by
overrides (``perflab.job.together``): the sides' samples alternate call by call, so a neighbour
that comes for a second, a clock that drops or a process that landed on a slow core falls on
both alike, and cancels in their ratio. ``turn()`` is the hand-over, called by the timing loop
after each sample and by ``Context.record`` after each row, outside any clock; in a process of
one job it does nothing.

The torch settings a job makes for itself (its threads, its float32 matmul precision, its
default dtype) are put back when its turn comes again: the other job may have set its own.

The jobs' CPU work that is timed runs on one thread they share (``compute``), not each on its
own: OpenMP gives every thread that calls a parallel op a pool of its own, and with two pools
one could stall while the other's workers still spin (samples of 200 ms beside the other side's
1 ms, alternating: a stall of one side that pairing cannot cancel). One thread, one pool; a
daemon, as the jobs' are: a Ctrl-C ends the process without waiting for a sample (an executor's
worker would be joined at exit, a user's call that never returns with it).
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Sequence, TypeVar

import torch


def _settings() -> tuple[Any, ...]:
    return torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.get_default_dtype()


def _restore(saved: tuple[Any, ...]) -> None:
    threads, precision, dtype = saved
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    torch.set_default_dtype(dtype)


T = TypeVar("T")


def _carried(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` to run on another thread as on this one: torch's per-thread modes (grad, inference,
    CPU autocast) and OpenMP's threads, which that thread does not share."""
    grad, inference, threads = torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_num_threads()
    autocast, autocast_dtype = torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")

    def there() -> T:
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        with (
            torch.inference_mode(inference),
            torch.set_grad_enabled(grad),
            torch.autocast("cpu", dtype=autocast_dtype, enabled=autocast),
        ):
            return fn()

    return there


class Turns:
    """A baton among ``n`` parties (threads), handed round in order; a party that has ended is
    passed over. Party 0 holds it first; the others wait at ``start`` for their first turn."""

    def __init__(self, n: int) -> None:
        self.n, self.holder, self.ended = n, 0, [False] * n
        self.cond = threading.Condition()
        self.mine = threading.local()
        self.saved: dict[int, tuple[Any, ...]] = {}
        self.computer = Computer()

    def start(self, party: int) -> None:
        self.mine.party = party
        with self.cond:
            self.cond.wait_for(lambda: self.holder == party)

    def turn(self) -> None:
        party = getattr(self.mine, "party", None)
        if party is None:  # a thread of neither job (a loader's, a watcher's): not its to hand over
            return
        with self.cond:
            following = self._next(party)
            if following == party:
                return
            self.saved[party] = _settings()
            self.holder = following
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.holder == party)
        _restore(self.saved.pop(party))

    def end(self, party: int) -> None:
        with self.cond:
            self.ended[party] = True
            self.holder = self._next(party)
            self.cond.notify_all()

    def _next(self, party: int) -> int:
        for step in range(1, self.n + 1):
            other = (party + step) % self.n
            if not self.ended[other]:
                return other
        return party


class Computer:
    """One daemon thread that runs the calls given to it, one at a time, until closed."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="perflab-compute", daemon=True)
        self.thread.start()

    def run(self, fn: Callable[[], T]) -> T:
        done: Future[T] = Future()
        self.calls.put((fn, done))
        return done.result()

    def close(self, wait: bool = True) -> None:
        """End the thread; with ``wait``, once it has ended: a daemon thread still unwinding torch's
        thread state when the interpreter exits aborts the process ("terminate called without an
        active exception"). Not on a Ctrl-C: a call under way is not waited for."""
        self.calls.put(None)
        if wait:
            self.thread.join()

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            fn, done = call
            try:
                done.set_result(fn())
            except BaseException as err:  # noqa: BLE001 - the caller's to raise, on its own thread
                done.set_exception(err)


_TURNS: Turns | None = None


def shared() -> bool:
    """Whether jobs take turns in this process (``in_turns``)."""
    return _TURNS is not None


def turn() -> None:
    """Hand the process to the next job, if it is shared (else nothing): outside every clock."""
    if _TURNS is not None:
        _TURNS.turn()


def compute(fn: Callable[[], T]) -> T:
    """``fn()`` (CPU work: a sample, clock and all), on the thread the jobs sharing this process
    compute on, else here. Not for a GPU's work: its current device and stream are the thread's."""
    if _TURNS is None:
        return fn()
    return _TURNS.computer.run(_carried(fn))


def in_turns(jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    """Run each job in a thread of its own, one at a time, handing over at each ``turn()``; their
    values (an exception a job raised is its value). Jobs run in this process's threads: its
    signal handlers stay the main thread's."""
    global _TURNS
    turns = _TURNS = Turns(len(jobs))
    values: list[Any] = [None] * len(jobs)

    def party(i: int) -> None:
        turns.start(i)
        try:
            values[i] = jobs[i]()
        except BaseException as err:  # noqa: BLE001 - the job's own end, handed back to the caller
            values[i] = err
        finally:
            turns.end(i)

    # daemons: a Ctrl-C or an exit of the main thread ends the process, never waits on a job's end
    threads = [
        threading.Thread(target=party, args=(i,), name=f"perflab-turn-{i}", daemon=True) for i in range(len(jobs))
    ]
    ended = False
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ended = True
    finally:
        _TURNS = None
        turns.computer.close(wait=ended)
    return values
