"""docs/models-and-data.md runs as written: every fenced block after a ``<!-- tested`` marker,
each line a command, with examples/userpkg importable (as ``pip install -e examples/userpkg``
makes it); ``<!-- tested: exit N -->`` says the exit code a block's commands end with."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT

PAGE = ROOT / "docs" / "models-and-data.md"


def tested_blocks() -> list[tuple[int, str]]:
    found = re.findall(r"<!-- tested(?:: exit (\d+))?[^>]*-->\s*```bash\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [(int(code or 0), body) for code, body in found]


def test_the_page_marks_its_examples_and_names_real_targets():
    blocks = tested_blocks()
    assert len(blocks) >= 4 and any(code == 2 for code, _ in blocks)
    targets = set(re.findall(r"userpkg\.models\.(\w+)", PAGE.read_text()))
    source = (ROOT / "examples" / "userpkg" / "userpkg" / "models.py").read_text()
    assert {"SmallCNN", "TinyTransformer"} <= targets
    assert all(f"class {t}(" in source for t in targets - {"SmalCNN"}), "every target the page names exists"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(tested_blocks())))
def test_the_pages_examples_run_as_written(work, index):
    code, body = tested_blocks()[index]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "examples" / "userpkg")}
    for line in filter(None, (line.split("  #")[0].strip() for line in body.splitlines())):
        argv = shlex.split(line)
        assert argv[0] == "perflab"
        proc = subprocess.run(
            [sys.executable, "-m", "perflab", *argv[1:]], cwd=work, capture_output=True, text=True, env=env, timeout=600
        )
        assert proc.returncode == code, f"{line}\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stdout + proc.stderr
        if code == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
