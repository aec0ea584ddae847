"""The README's comparison examples run as written: every fenced block after a
``<!-- tested`` marker, shell lines as commands, Python as a script, in one scratch folder."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT


def readme_blocks() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text()
    return [(lang, body) for lang, body in re.findall(r"<!-- tested[^>]*-->\s*```(\w+)\n(.*?)```", text, flags=re.S)]


def shell_lines(body: str) -> list[list[str]]:
    lines, command = [], ""
    for line in body.splitlines():
        command += line.rstrip("\\").split("  #")[0] + " "
        if not line.endswith("\\"):
            if command.strip():
                lines.append(shlex.split(command))
            command = ""
    return lines


def test_the_readme_marks_its_comparison_examples():
    kinds = [lang for lang, _ in readme_blocks()]
    assert kinds.count("bash") >= 2 and kinds.count("python") >= 1


@pytest.mark.slow
def test_the_readme_comparison_examples_run_as_written(work):
    for lang, body in readme_blocks():
        if lang == "python":
            proc = subprocess.run([sys.executable, "-c", body], cwd=work, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            assert "significan" in proc.stdout and "efficiency" in proc.stdout
            continue
        for argv in shell_lines(body):
            env = dict(os.environ)
            while argv and re.match(r"^[A-Z_]+=", argv[0]):  # VAR=value perflab ...: as a shell runs it
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
            if argv[0] == "perflab":
                argv = [sys.executable, "-m", "perflab", *argv[1:]]
            elif argv[:2] == ["python", "-m"]:
                argv = [sys.executable, *argv[1:]]
            proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=env)
            assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}"
            assert "Traceback" not in proc.stdout + proc.stderr
    assert (work / "plots" / "scaling.png").is_file()
