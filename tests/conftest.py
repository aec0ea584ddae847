"""Shared helpers: the real command line run in-process (no interpreter start-up per call),
perflab.run() in a scratch directory, and the real config tree composed as Hydra does it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from perflab import app
from perflab.config import install, registry
from perflab.config.composition import register
from perflab.config.registry import config_dir

# The tests of Ctrl-C need Python's own SIGINT handler, here and in the perflab processes they
# start: a shell that runs the tests in the background (``.ci/run &``, nohup) starts them with
# SIGINT ignored, and an ignored signal stays ignored in every child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the addopts): two workers for the fast set, none (one process, as before) when
    the selection may hold slow or cluster tests, whose end-to-end runs and timings want the machine."""
    fast = "not slow" in config.option.markexpr and "not cluster" in config.option.markexpr
    return min(2, os.cpu_count() or 1) if fast else 0


def pytest_configure(config):
    """Under xdist every worker's torch, and every process a test starts, shares the 2 cores with
    the other worker: OpenMP threads that spin between ops would burn the CPU the other needs.
    A user's own OMP_WAIT_POLICY stays."""
    if getattr(config.option, "numprocesses", 0) and "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_sessionstart(session):
    """A broken install fails every test the same way: say it once, and run none."""
    from perflab.errors import ConfigError

    try:
        install.check_torch_pair()
    except ConfigError as err:
        pytest.exit(f"perflab's install is broken, fix it first: {err.line()}", returncode=2)


# Every job in the fast tests: few samples, no minimum time (the quick/ presets set the sizes).
FAST = ["bench.warmup=1", "bench.repeats=3", "bench.min_time_s=0"]


def timed_row(times, **fields):
    """A row as a job writes it for raw sample ``times``: ok, with their count and median, then ``fields``."""
    import numpy as np

    return {"status": "ok", "n": len(times), "median_s": float(np.median(times)), **fields}


ROOT = Path(__file__).resolve().parents[1]
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


@dataclass
class Ran:
    rc: int
    out: str
    err: str


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch) -> Path:
    """Each test its own user cache (torch's compile caches and anything else that writes
    there), in it and in the perflab processes it starts: never the user's; a test that must see
    nothing written there (no verdict reads a cache) looks in it."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """A scratch working directory: outputs/ goes here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def one_thread():
    """One intra-op thread for a real A/B: with two, a shared 2-core machine swings 20x between runs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cli(work, capsys):
    """``cli(*args)``: ``perflab ARGS`` in-process, as a user would type it; returns rc/out/err."""

    def _cli(*args: str, rc: int | None = 0) -> Ran:
        code = app.main(list(args))
        captured = capsys.readouterr()
        ran = Ran(code, captured.out, captured.err)
        if rc is not None:
            assert code == rc, f"rc={code}\n{ran.out}\n{ran.err}"
        return ran

    return _cli


def run_subprocess(
    *args: str, cwd: Path, rc: int | None = 0, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m perflab ARGS`` in a fresh interpreter (for what needs a process of its own)."""
    proc = subprocess.run(
        [sys.executable, "-m", "perflab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    if rc is not None:
        assert proc.returncode == rc, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def compose_cfg():
    """Compose the real config tree with overrides, as Hydra does for the command line."""
    register()

    def _compose(*overrides: str, hydra_node: bool = False):
        with initialize_config_dir(str(config_dir()), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra_node)

    return _compose


def presets() -> list[str]:
    return sorted(registry.presets())
