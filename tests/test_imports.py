"""The import graph of perflab's own modules has no circle: every arrow points down a floor.

Read from the source with ``ast`` (no module is imported), so it costs a fraction of a second.
Imports inside functions count (they run too); those under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where each package of perflab's wheel comes from (pyproject.toml's package-dir).
SOURCES = {
    "perflab": ROOT / "perflab",
    "perflab.experiments": ROOT / "experiments",
    "hydra_plugins": ROOT / "hydra_plugins",
}


def modules() -> dict[str, Path]:
    """Module name -> its file, for every .py file of perflab's packages."""
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(module named, the names taken from it) for every import that runs."""
    out: list[tuple[str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((("." * node.level) + (node.module or ""), [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the perflab modules it imports."""
    known = modules()
    arrows: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target, names in _imports(ast.parse(path.read_text(), str(path))):
            if target.startswith("."):
                level = len(target) - len(target.lstrip("."))
                base = package.split(".")[: len(package.split(".")) - (level - 1)]
                target = ".".join([*base, target.lstrip(".")]).rstrip(".")
            for candidate in [f"{target}.{n}" for n in names] or [target]:
                found = candidate if candidate in known else target
                while found and found not in known:  # ``import a.b.c`` of a module a.b
                    found = found.rpartition(".")[0]
                if found and found != name:
                    arrows[name].add(found)
    return arrows


def circles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(arrows[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            connect(v)
    return found


def test_no_import_circle():
    arrows = graph()
    assert len(arrows) > 40 and arrows["perflab.app"], "the graph was read"
    found = circles(arrows)
    said = [
        " <-> ".join(group) + ": " + "; ".join(f"{m} -> {sorted(arrows[m] & set(group))}" for m in group)
        for group in found
    ]
    assert not found, "import circles (move what both need into a module below them):\n" + "\n".join(said)


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_an_experiments_imports_come_from_one_face_without_torch():
    """``perflab.experiment`` holds what an experiment module imports; importing it (a config is
    checked with the experiment module imported) brings no torch until a measuring name is used."""
    import subprocess
    import sys

    code = (
        "import sys, perflab.experiment as e\n"
        "before = 'torch' in sys.modules\n"
        "missing = [n for n in e.__all__ if getattr(e, n, None) is None]\n"
        "print(before, missing, e.Context.__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "[]", "Context", "True"]


LIBRARIES = ("hydra", "omegaconf", "yaml", "pandas", "scipy", "pyarrow", "numpy", "torch")


@pytest.mark.parametrize(
    ("args", "code", "allowed"),
    [
        (["+experiment=nosuch"], 2, ()),  # perflab's own lists say it: no library at all
        (["nosuch=1"], 2, ()),
        (["+experiment=matmul", "+bench.repeat=3", "--versio"], 2, ()),  # a flag: perflab's list of Hydra's
        ([], 0, ()),  # the experiment list
        (["+experiment=matmul", "experiment.size=-5"], 2, ("hydra", "omegaconf", "yaml")),  # composed by Hydra
        (["+experiment=matmul", "+bench.repeat=3"], 2, ("hydra", "omegaconf", "yaml")),
        (["+experiment=quick/matmul", "seed=-1"], 2, ("hydra", "omegaconf", "yaml")),
        (["+experiment=matmul", "--help"], 0, ("hydra", "omegaconf", "yaml")),
        (["+experiment=train", "trainer.epochs=0"], 2, ("hydra", "omegaconf", "yaml")),  # composed: model, data
    ],
)
def test_a_refusal_imports_only_what_answering_it_needs(tmp_path, args, code, allowed):
    """The front door (issue 31): a mistake perflab's own lists answer imports no library (Hydra,
    OmegaConf, pandas, scipy, numpy, torch: each imported on first use); a bad value or an unknown
    key, Hydra's compose API and OmegaConf alone (issue 45: one composer). Checked by what is
    imported, not by time, so a new top-level import on this path fails here whatever the load."""
    import subprocess
    import sys

    script = (
        "import sys\nfrom perflab.app import main\ncode = main(sys.argv[1:])\n"
        f"print(code, *sorted(m for m in {LIBRARIES!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tmp_path, capture_output=True, text=True)
    said = done.stdout.splitlines()[-1].split()  # its last line: the listing prints above it
    assert said[0] == str(code), done.stderr
    assert set(said[1:]) <= set(allowed), f"perflab {' '.join(args)} imported {said[1:]} (allowed: {allowed})"


def test_the_schemas_missing_is_omegaconfs():
    """schema.py spells omegaconf.MISSING itself (so that importing it imports no omegaconf):
    OmegaConf must read it as its own, a field set nowhere."""
    import omegaconf

    from perflab.config import schema

    assert schema.MISSING == omegaconf.MISSING
    assert omegaconf.OmegaConf.is_missing(omegaconf.OmegaConf.structured(schema.ModelConfig), "_target_")
