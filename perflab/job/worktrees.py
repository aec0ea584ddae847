"""A side of ``perflab ab`` at a git ref of the user's project: a detached worktree of the
repository in the current directory, checked out at the ref, where that side's processes run.

Each side's processes start in its worktree, so their rows' ``subject`` is the ref's commit,
and with the worktree (and its ``src/``, where there is one) first on ``PYTHONPATH`` the
project's modules import from that ref. ``--install CMD`` runs once in each worktree (a shell
command: ``python -m venv .venv && .venv/bin/pip install -e .``); where it leaves a
``.venv/bin/python`` there, that is the side's interpreter. The worktrees are removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator


class RefError(Exception):
    """A ref that is no commit here, or no git repository: one line, exit 2, before any work."""


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)


def commit(flag: str, ref: str, repo: Path) -> str:
    """The full commit ``ref`` names in the git repository at ``repo``; RefError otherwise."""
    found = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
    if found.returncode:
        top = _git("rev-parse", "--show-toplevel", cwd=repo)
        where = (
            f"the git repository here ({top.stdout.strip()})" if not top.returncode else f"{repo}: no git repository"
        )
        raise RefError(f"{flag} {ref}: not a commit of {where}; allowed: a branch, tag or commit")
    return found.stdout.strip()


@contextlib.contextmanager
def checked_out(repo: Path, sha: str, path: Path) -> Iterator[Path]:
    """A detached worktree of ``repo`` at ``sha`` in ``path``, removed (and pruned) afterwards."""
    made = _git("worktree", "add", "--detach", "--force", str(path), sha, cwd=repo)
    if made.returncode:
        raise RefError(f"git worktree add {path} {sha[:12]}: {made.stderr.strip().splitlines()[-1:]}")
    try:
        yield path
    finally:
        _git("worktree", "remove", "--force", str(path), cwd=repo)
        _git("worktree", "prune", cwd=repo)


def environment(path: Path) -> dict[str, str]:
    """``PYTHONPATH`` with the worktree (and its ``src/``) first: the project's code at the ref."""
    first = [str(p) for p in (path / "src", path) if p.is_dir()]
    rest = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join([*first, *([rest] if rest else [])])}


def install(command: str, path: Path) -> int:
    """Run ``command`` in the worktree (a shell, as typed); its exit code."""
    return subprocess.run(command, shell=True, cwd=path).returncode


def interpreter(path: Path) -> str | None:
    """The worktree's own ``.venv/bin/python`` where the install made one, else None."""
    python = path / ".venv" / "bin" / "python"
    return str(python) if python.exists() else None
