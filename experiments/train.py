"""Data-parallel training of LeNet / ResNet-18 on Fashion-MNIST (book 13.5, 13.6), all by config."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch.distributed as dist

from perflab import launch
from perflab.context import Context
from perflab.errors import ConfigError
from perflab.schema import ExperimentConfig
from perflab.train import loop


@dataclass
class Config(ExperimentConfig):
    """No knobs of its own: model, data, strategy and trainer are top-level config groups."""


def run(ctx: Context) -> None:
    s = ctx.settings
    for section in ("model", "data", "strategy", "trainer"):
        if getattr(s, section) is None:
            raise ConfigError(section, None, f"a {section} config (conf/{section}/ or the experiment's defaults)")
    loop.check_devices(s.strategy.name, ctx.devices)
    nodes = s.strategy.nnodes if s.strategy.name == "ddp" else 1
    loop.plan(s.trainer, len(ctx.devices) * nodes)  # bad batch/device combinations: before launching
    if s.strategy.name != "ddp":
        loop.train(ctx)
        return
    st = s.strategy
    # Rank 0 writes the rows from its own process, into this job's files.
    launch.elastic(_ddp_worker, ctx, nproc=len(ctx.devices), nnodes=st.nnodes, rdzv_endpoint=st.rdzv_endpoint,
                   max_restarts=st.max_restarts,
                   run_id=st.rdzv_id if st.rdzv_endpoint else ctx.base_row["run_id"].replace("/", "-"))


def _ddp_worker(ctx: Context) -> None:
    rank, world, local = launch.init_process_group(ctx.devices, ctx.settings.strategy.backend)
    if rank == 0:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        loop.train(ctx, rank=rank, world=world, local_rank=local)
    finally:
        dist.destroy_process_group()
