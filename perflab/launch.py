"""Worker processes through torch's elastic launcher (the engine behind ``torchrun``).

Hydra runs once; the job calls ``elastic(...)``, which starts ``nproc`` workers on this node
(c10d rendezvous; several nodes when ``nnodes`` > 1 and every node runs the same command
with the same ``rdzv_endpoint``). Each worker calls ``init_process_group()``.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Callable

import torch
import torch.distributed as dist

from perflab.devices import Device


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def elastic(entrypoint: Callable[..., Any], *args: Any, nproc: int, nnodes: int = 1, rdzv_endpoint: str = "",
            run_id: str = "perflab", max_restarts: int = 0) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` worker processes; return values by global rank."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=nnodes, max_nodes=nnodes, nproc_per_node=nproc, run_id=run_id, rdzv_backend="c10d",
        rdzv_endpoint=rdzv_endpoint or f"127.0.0.1:{free_port()}", max_restarts=max_restarts,
        monitor_interval=0.1, start_method="spawn",
    )
    noisy = logging.getLogger("torch.distributed.elastic")
    level = noisy.level
    noisy.setLevel(logging.WARNING)
    try:
        return elastic_launch(config, entrypoint)(*args)
    finally:
        noisy.setLevel(level)


def init_process_group(devices: list[Device], backend: str = "auto") -> tuple[int, int, int]:
    """Join the group the launcher set up; returns (rank, world size, local rank).

    Picks this worker's device from ``devices`` by local rank: NCCL for GPUs, gloo on the CPU
    (where each worker gets its device's share of the intra-op threads).
    """
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
