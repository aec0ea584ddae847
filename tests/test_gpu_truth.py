"""``tools/gpu/truth.sh``, issue #32's runs for a session with a GPU: on this CPU-only machine it
measures nothing (never a faked GPU number), refuses a phase it lacks, and every perflab command
in it still composes, so the script does not rot between GPU sessions."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from perflab.config import composition
from perflab.job.execute import check_values

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu" / "truth.sh"


def commands() -> list[tuple[str, list[str]]]:
    """Each perflab command of the script: (experiment, overrides), a sweep at its first value."""
    text = (
        SCRIPT.read_text().replace("\\\n", " ").replace('"$gpu"', "devices.spec=[cuda:0]").replace("$dtype", "bfloat16")
    )  # the loop's first
    found = []
    for line in text.splitlines():
        m = re.search(r"\bperflab (?:ab |-m )?(\+experiment=.*)", line)
        if not m or line.lstrip().startswith("#"):
            continue
        words = [w for w in shlex.split(m.group(1).replace("$store", "/tmp")) if not w.startswith("--")]
        experiment, *rest = words
        overrides = [re.sub(r"=(\w+),[\w,]+$", r"=\1", w) for w in rest if "=" in w]
        found.append((experiment.partition("=")[2], overrides))
    return found


def test_a_phase_it_lacks_is_refused():
    done = subprocess.run(["bash", str(SCRIPT), "all"], capture_output=True, text=True)
    assert done.returncode == 2 and "phase all: allowed: tests, book, timing" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script measures")
def test_without_cuda_it_measures_nothing(tmp_path):
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # python3: this one, with torch
    done = subprocess.run(
        ["bash", str(SCRIPT), "book"], capture_output=True, text=True, env={"OUT": str(tmp_path), "PATH": path}
    )
    assert done.returncode == 0 and "no CUDA device here: nothing measured" in done.stderr
    assert [*tmp_path.iterdir()] == []


def test_each_of_its_commands_composes():
    found = commands()
    assert len(found) >= 12, found
    for experiment, overrides in found:
        cfg, _, _ = composition.compose(experiment, overrides)
        check_values(cfg)  # a value the job would refuse (not the devices: none is here)
