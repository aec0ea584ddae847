"""The wheel carries the configs and the experiments, and runs from any directory."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_runs_from_any_directory(tmp_path):
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    work.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], check=True)
    (wheel,) = wheels.glob("perflab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("perflab/conf/config.yaml", "perflab/conf/experiment/auto_parallel.yaml",
                     "perflab/conf/hydra/job_logging/perflab.yaml", "experiments/matmul.py", "perflab/app.py"):
        assert expected in names
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)

    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import perflab; print(perflab.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site))
    proc = subprocess.run([sys.executable, "-m", "perflab", "+experiment=matmul", "experiment.size=16",
                           "experiment.iterations=1", "bench.repeats=2"], cwd=work, env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (work / "outputs" / "results.csv").is_file()
    assert len(list((work / "outputs" / "runs").glob("*/results.csv"))) == 1
    assert list((site / "bin").glob("perflab")), "the console script is installed"
