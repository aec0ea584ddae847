"""Shared test helpers: run the real CLI in a scratch directory; compose real configs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from perflab import registry
from perflab.registry import config_dir

TINY = {
    "matmul": ["experiment.size=32", "experiment.iterations=2"],
    "async_compute": ["experiment.size=32", "experiment.steps=2", "experiment.train_steps=2",
                      "experiment.train_batch=8"],
    "auto_parallel": ["experiment.cpu_size=32", "experiment.cpu_matmuls=2", "experiment.size=64",
                      "experiment.matmuls=2"],
}
FAST_BENCH = ["bench.warmup=1", "bench.repeats=3"]


def run_cli(*args: str, cwd: Path, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    """``python -m perflab ARGS`` in ``cwd``, as a user would type it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run([sys.executable, "-m", "perflab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    if check_rc is not None:
        assert proc.returncode == check_rc, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def compose_cfg():
    """Compose the real config tree with overrides, as Hydra does for the CLI."""
    registry.register_configs()
    OmegaConf.register_new_resolver("perflab_uid", lambda: "test", use_cache=True, replace=True)

    def _compose(*overrides: str, hydra_node: bool = False):
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra_node)

    return _compose


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
