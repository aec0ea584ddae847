"""The wheel carries the configs and the experiments, and runs from any directory."""

from __future__ import annotations

import os
import shutil
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
    src = tmp_path / "src"  # a clean copy: no stale build/ folder can smuggle files into the wheel
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "outputs", "*.egg-info", "__pycache__", ".pytest_cache", "data"
        ),
    )
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)], check=True)
    (wheel,) = wheels.glob("perflab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "perflab/conf/config.yaml",
        "perflab/conf/experiment/auto_parallel.yaml",
        "perflab/conf/hydra/job_logging/perflab.yaml",
        "perflab/conf/model/lenet.yaml",
        "perflab/conf/launcher/slurm.yaml",
        "perflab/conf/experiment/quick/matmul.yaml",
        "perflab/experiments/matmul.py",
        "perflab/app.py",
        "perflab/train/loop.py",
        "perflab/report/page.html",  # the report's page, style and scripts are files, shipped as package data
        "perflab/report/style.css",
        "perflab/report/guard.js",
        "perflab/report/check.js",
    ):
        assert expected in names
    assert not any(n.startswith("experiments/") for n in names), "no top-level package to clash with users' own"
    assert {"hydra_plugins/perflab_slurm/__init__.py", "hydra_plugins/perflab_slurm/_launcher.py"} <= set(names)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True)

    env = {**os.environ, "PYTHONPATH": str(site)}
    # Every package must come from the wheel, not from the editable checkout this venv also has.
    modules = [
        "perflab",
        "perflab.train.loop",
        "perflab.conf",
        "perflab.experiments.train",
        "perflab.experiments.compile",
    ]
    where = subprocess.run(
        [sys.executable, "-c", f"import importlib; [print(importlib.import_module(m).__file__) for m in {modules!r}]"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(line.startswith(str(site)) for line in where.stdout.splitlines()), where.stdout
    discover = (
        "from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
        "print([p.__name__ for p in Plugins.instance().discover(Launcher)])"
    )
    launchers = subprocess.run([sys.executable, "-c", discover], cwd=work, env=env, capture_output=True, text=True)
    assert "PerflabSlurmLauncher" in launchers.stdout, "Hydra finds perflab's SLURM launcher in the wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "perflab", "+experiment=quick/matmul", "bench.min_time_s=0"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(list((work / "outputs" / "runs").glob("*/results.csv"))) == 1
    report = subprocess.run(
        [sys.executable, "-m", "perflab.report", "outputs"], cwd=work, env=env, capture_output=True, text=True
    )
    assert report.returncode == 0, report.stderr
    assert 'data-experiment="matmul"' in (work / "report.html").read_text()  # found through the wheel's entry points
    assert list((site / "bin").glob("perflab")), "the console script is installed"


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_without_the_launchers_extra_a_run_prints_no_hydra_plugin_warning(tmp_path):
    """Hydra imports every plugin at each start; perflab's SLURM launcher needs the submitit
    launcher, and without it (no perflab[launchers]) it is no plugin, and says nothing."""
    code = (
        "import sys; sys.modules['hydra_plugins.hydra_submitit_launcher'] = None\n"  # as if not installed
        "import perflab\n"
        "perflab.run('quick/matmul', ['bench.repeats=1', 'bench.min_time_s=0', 'results.table=false'])\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "hydra_plugins" not in ran.stderr and "Error importing" not in ran.stderr, ran.stderr


def test_the_wheel_lists_every_package_of_perflab():
    """pyproject names the wheel's packages one by one: a new subpackage left out of it imports
    from a checkout and fails in an installed wheel (perflab.measure.instruments did). The slow
    test above builds the wheel; this one reads the list."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "perflab").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert found <= listed, sorted(found - listed)
