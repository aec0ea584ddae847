"""Worker processes through torch's elastic launcher (the engine behind ``torchrun``), shared
by every experiment that needs a process group (DDP training, the comm experiment).

Hydra runs once; the job calls ``launch(...)``, which starts ``nproc`` workers on this node.
On one node the rendezvous is ``localhost:0`` (like ``torchrun --standalone``: a free port,
no race); with ``nnodes`` > 1 every node runs the same command with the same endpoint and
id. Workers' logs go to ``<run dir>/workers/``, and each worker dies with the job: a job
killed with ``kill -9`` leaves no orphans behind.

While workers run, torch's agent holds SIGINT, SIGTERM, SIGHUP and SIGQUIT (its handler raises
``SignalException`` to shut the workers down). ``launch`` gives the handlers that were there
back when it returns, and a signal the agent took is then delivered again to them: Ctrl-C is a
KeyboardInterrupt, a job's stop signal its ``Stopped``, as if no workers had run.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from perflab.measure.devices import Device


def launch(
    entrypoint: Callable[..., Any],
    *args: Any,
    nproc: int,
    log_dir: Path,
    run_id: str,
    nnodes: int = 1,
    rdzv_endpoint: str = "",
    max_restarts: int = 0,
) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` worker processes here; return values by global rank."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=nnodes,
        max_nodes=nnodes,
        nproc_per_node=nproc,
        run_id=run_id.replace("/", "-"),
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or "localhost:0",
        max_restarts=max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
        logs_specs=DefaultLogsSpecs(log_dir=str(log_dir)),
    )
    noisy = logging.getLogger("torch.distributed.elastic")
    level = noisy.level
    noisy.setLevel(logging.WARNING)
    try:
        with handlers_kept():
            return elastic_launch(config, _worker)(os.getpid(), _log_file(log_dir), entrypoint, *args)
    except SignalException as stop:
        signal.raise_signal(stop.sigval)  # to the handler the agent had displaced: it raises its own stop
        raise  # a signal that handler ignores: the workers are gone all the same
    finally:
        noisy.setLevel(level)


# What torch's agent takes while its workers run (TORCHELASTIC_SIGNALS_TO_HANDLE's default).
AGENT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """This process's handlers of :data:`AGENT_SIGNALS` as they were before the block, whatever
    it installed (main thread only: no handler can be set elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            if old is not None:  # None: set outside Python, and it cannot be put back
                signal.signal(sig, old)


def _log_file(log_dir: Path) -> str:
    """Where rank 0 logs: the terminal ("") when the job's own lines go there, else a file in
    ``log_dir`` (``perflab chapter`` keeps every job's lines off its terminal)."""
    loggers = (logging.getLogger("perflab"), logging.getLogger())
    handlers = [h for logger in loggers for h in logger.handlers]
    to_terminal = any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in handlers)
    return "" if to_terminal or not handlers else str(log_dir / "rank0.log")


def _worker(parent: int, log_file: str, entrypoint: Callable[..., Any], *args: Any) -> Any:
    """In each worker: die with the job (Linux), log like the job, then run the entrypoint."""
    _die_with_parent(parent)
    if os.environ.get("RANK") == "0":
        where: dict[str, Any] = {"filename": log_file} if log_file else {"stream": sys.stdout}
        logging.basicConfig(level=logging.INFO, format="%(message)s", **where)
    return entrypoint(*args)


def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the job died before we could ask to be told
        os._exit(1)


def init_process_group(devices: list[Device], backend: str = "auto") -> tuple[int, int, int]:
    """Join the group the launcher set up; returns (rank, world size, local rank).

    Picks this worker's device from ``devices`` by local rank: NCCL for GPUs, gloo on the CPU
    (where each worker gets its device's share of the intra-op threads).
    """
    import torch
    import torch.distributed as dist

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = devices[local]
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device.index)
    elif device.threads:
        torch.set_num_threads(device.threads)
    dist.init_process_group(backend)
    return rank, world, local
