"""The README's and the docs pages' examples run as written: every fenced block after a
``<!-- tested`` marker, shell lines as commands, Python as a script, in one scratch folder per
page (with the repository's ``examples/`` beside it, as in a clone). A marker may say what the
block must print, ``<!-- tested: prints "a" "b" -->``, and the exit code its commands end with,
``<!-- tested: exit 2 -->`` (a refusal: one line on stderr; ``exit 0|3``: either). ``pip install``
lines install into a folder of the scratch one (on the PYTHONPATH of the page's later commands),
never into the environment running the tests. The blocks that cannot run here (a GPU, SLURM,
hours) are checked against the code instead: every ``perflab`` line composes and passes the
schema, every option is one its subcommand takes. Cheap checks keep the README a front door
(short, linking every docs page) and every link, path, extra and ``perflab.NAME`` the pages
name true."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import pytest

from perflab import app
from perflab.config import registry
from perflab.config.composition import register

from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    lang: str
    body: str
    prints: list[str]
    exits: tuple[int, ...] = (0,)  # what each of its commands may exit with


def marked_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = re.findall(r"<!-- tested(.*?)-->\s*```(\w+)\n(.*?)```", text, flags=re.S)
    blocks = []
    for marker, lang, body in found:
        code = re.search(r"exit ([\d|]+)", marker)
        exits = tuple(int(c) for c in code.group(1).split("|")) if code else (0,)
        blocks.append(Block(lang, body, re.findall(r'"([^"]+)"', marker), exits))
    return blocks


def unmarked_bash_blocks(page: Path) -> list[str]:
    """The shell blocks no test runs as written: their commands are checked against the code."""
    found = re.findall(r"(<!-- tested.*?-->\s*)?```bash\n(.*?)```", page.read_text(), flags=re.S)
    return [body for marker, body in found if not marker]


def shell_lines(body: str) -> list[list[str]]:
    lines, command = [], ""
    for line in body.splitlines():
        command += line.rstrip("\\").split("  #")[0] + " "
        if not line.endswith("\\"):
            if command.strip():
                lines.append(shlex.split(command))
            command = ""
    return lines


def shell_env(argv: list[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """``VAR=value perflab ...``: the words before the command set its environment, as a shell does."""
    argv, env = list(argv), dict(env)
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    return argv, env


def as_run_here(argv: list[str], site: Path) -> list[str]:
    """A documented command as this test runs it: with this interpreter, and pip installing
    into ``site`` (no dependencies: they are the ones running the tests)."""
    if argv[0] == "perflab":
        return [sys.executable, "-m", "perflab", *argv[1:]]
    if argv[:2] == ["python", "-m"]:
        return [sys.executable, *argv[1:]]
    if argv[:2] == ["pip", "install"]:
        paths = [a for a in argv[2:] if not a.startswith("-")]
        return [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *paths]
    return argv


def run_page(page: Path, work: Path) -> str:
    """Every tested block of ``page`` in ``work``; returns everything they printed."""
    if (ROOT / "examples").is_dir():
        shutil.copytree(ROOT / "examples", work / "examples")
    site = work / ".site"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)}
    printed = []
    for block in marked_blocks(page):
        out = ""
        if block.lang == "python":
            proc = subprocess.run(
                [sys.executable, "-c", block.body], cwd=work, capture_output=True, text=True, timeout=300, env=env
            )
            assert proc.returncode == 0, proc.stderr
            out = proc.stdout
        else:
            for line in shell_lines(block.body):
                words, line_env = shell_env(line, env)
                argv = as_run_here(words, site)
                proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600, env=line_env)
                assert proc.returncode in block.exits, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}"
                assert "Traceback" not in proc.stdout + proc.stderr
                if 0 not in block.exits:  # a refusal is one line
                    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
                out += proc.stdout + proc.stderr
        for expected in block.prints:
            assert expected in out, f"{page.name}: {expected!r} not printed by\n{block.body}\n---\n{out[-3000:]}"
        printed.append(out)
    return "\n".join(printed)


README_LINES = 150  # a front door: what perflab is, the quickstart, the commands; the rest is in docs/


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_readme_is_a_front_door_to_every_docs_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    assert {b.lang for b in marked_blocks(ROOT / "README.md")} == {"bash", "python"}
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text))
    assert linked == {p.name for p in PAGES if p.parent.name == "docs"}
    for page in PAGES:  # each page says what it is for, under its title
        title, blank, purpose = page.read_text().splitlines()[:3]
        assert title.startswith("# ") and not blank and purpose, page.name


PYPROJECT = (ROOT / "pyproject.toml").read_text()
EXTRAS = set(re.findall(r"^(\w+) = \[", PYPROJECT.split("[project.optional-dependencies]")[1].split("\n[")[0], re.M))
FOLDERS = "benchmarks|tools|perflab|examples|conf|experiments|tests|docs|hydra_plugins|\\.ci"


def imported(name: str) -> object:
    """``perflab.a.b.c`` as Python finds it: the longest importable module, then attributes."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[n:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(name)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_path_extra_and_name_the_pages_give_exists(page):
    """Relative links name a file or folder of the repository, and a ``#part`` a heading of it;
    so do the repository paths the page names (``benchmarks/store.py``), the extras it installs
    (``.[launchers]``) and the ``perflab.NAME`` it says to import or read."""
    text = page.read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target):
            continue
        path, _, part = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if part:
            assert part in anchors(linked), f"{page.name}: {target}: no heading #{part} in {linked.name}"
    commands_and_prose = re.sub(r"```(?!bash|python)\w*\n.*?```", "", text, flags=re.S)  # not a tree drawn in a block
    for path in re.findall(rf"(?<![\w/.<-])((?:{FOLDERS})/[\w./-]*[\w/])", commands_and_prose):
        assert (ROOT / path).exists(), f"{page.name}: {path}"
    for extras in re.findall(r"(?:\.|perflab)\[([\w,]+)\]", text):
        assert set(extras.split(",")) <= EXTRAS, f"{page.name}: [{extras}]; the extras are {sorted(EXTRAS)}"
    for name in re.findall(r"`[^`\n]*?\b(perflab\.[a-z_][\w.]*\w)", text):
        imported(name)


def test_the_bring_your_own_page_marks_examples_that_exist():
    """Cheap: the page's tested blocks are there, and every path they name is in the repository."""
    blocks = marked_blocks(ROOT / "docs" / "bring-your-own.md")
    assert [b.lang for b in blocks] == ["bash", "python"] and all(b.prints for b in blocks)
    commands = shell_lines(blocks[0].body)
    assert [a[:2] for a in commands][0] == ["pip", "install"]
    for path in re.findall(r"examples/[\w/.-]+", "\n".join(b.body for b in blocks)):
        assert (ROOT / path.removeprefix("file://")).exists(), path


def test_the_models_page_marks_examples_whose_models_exist():
    """Cheap: the page installs the example package first, shows a refusal, and every model of
    it the page names (but the misspelt one it is refused for) is a class of userpkg/models.py."""
    page = ROOT / "docs" / "models-and-data.md"
    blocks = marked_blocks(page)
    assert shell_lines(blocks[0].body) == [["pip", "install", "-e", "examples/userpkg"]]
    assert len(blocks) >= 5 and [b.exits for b in blocks].count((2,)) == 1
    refused = {t for b in blocks if 0 not in b.exits for t in re.findall(r"userpkg\.models\.(\w+)", b.body)}
    named = set(re.findall(r"userpkg\.models\.(\w+)", page.read_text())) - refused
    source = (ROOT / "examples" / "userpkg" / "userpkg" / "models.py").read_text()
    assert {"SmallCNN", "TinyTransformer"} <= named and all(f"class {t}(" in source for t in named)
    assert not any(f"class {t}(" in source for t in refused)


def documented_commands(body: str) -> list[list[str]]:
    """The ``perflab`` command lines of a shell block as perflab's own arguments: ``perflab
    ARGS``, ``python -m perflab ARGS`` and ``python -m perflab.NAME ARGS`` (= ``perflab NAME``),
    also where ``&&`` chains them."""
    found = []
    for line in shell_lines(body):
        words, _ = shell_env(line, {})
        while words:
            command = words[: words.index("&&")] if "&&" in words else words
            words = words[len(command) + 1 :]
            if command[0] == "perflab":
                found.append(command[1:])
            elif command[0].endswith("python") and command[1:2] == ["-m"] and command[2].startswith("perflab"):
                name = command[2].removeprefix("perflab").lstrip(".")
                found.append([name, *command[3:]] if name else command[3:])
    return found


def points(args: list[str]) -> list[list[str]]:
    """A sweep's overrides as the points that check every listed value once: point i takes
    the i-th value of each ``key=a,b,c`` (the last, when a list is shorter)."""
    lists = []
    for arg in args:
        key, _, value = arg.partition("=")
        swept = "," in value and not value.startswith(("[", "{", "'", '"'))
        lists.append([f"{key}={v}" for v in value.split(",")] if swept else [arg])
    return [[values[min(i, len(values) - 1)] for values in lists] for i in range(max(map(len, lists), default=1))]


def options_of(subcommand: str) -> set[str]:
    """The options ``perflab SUBCOMMAND --help`` lists."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        importlib.import_module(app.SUBCOMMANDS[subcommand]).main(["--help"])
    return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", out.getvalue()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in PAGES if any(documented_commands(b) for b in unmarked_bash_blocks(p))], ids=lambda p: p.name
)
def test_every_documented_command_is_one_perflab_takes(page):
    """The commands no test runs as written (a GPU, SLURM, several machines, hours) are still
    true: each point of each composes, with every key and value the schema allows, and a
    subcommand's options are its own."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from perflab.job.execute import check_overrides, check_values

    registry.discover()
    register()
    with initialize_config_dir(str(registry.config_dir()), version_base="1.3", job_name="perflab"):
        for body in unmarked_bash_blocks(page):
            for args in documented_commands(body):
                if args and args[0] in app.SUBCOMMANDS:
                    named = {a.strip("[]").partition("=")[0] for a in args[1:]}  # [--opt VALUE] as a usage line has it
                    unknown = {a for a in named if a.startswith("-")} - options_of(args[0])
                    assert not unknown, f"{page.name}: perflab {' '.join(args)}: no option {sorted(unknown)}"
                    continue
                overrides = [re.sub(r"^experiment=", "+experiment=", a) for a in args if not a.startswith("-")]
                if not overrides:  # perflab, perflab --version
                    assert set(args) <= {"--version", "--help"}, f"{page.name}: perflab {' '.join(args)}"
                    continue
                assert any(o.startswith("+experiment=") for o in overrides), f"{page.name}: perflab {' '.join(args)}"
                for point in points(overrides):
                    check_overrides(point)
                    cfg = compose("config", overrides=point, return_hydra_config=True)
                    with open_dict(cfg):
                        del cfg["hydra"]
                    check_values(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if marked_blocks(p)], ids=lambda p: p.name)
def test_the_examples_run_as_written(page, work):
    run_page(page, work)
    if page.name == "README.md":  # the commands wrote what they say
        assert (work / "report.html").is_file() and list((work / "outputs" / "sweeps").glob("*/sweep.csv"))
    if page.name == "compare.md":
        assert (work / "outputs" / "plots" / "scaling.png").is_file()
        assert not any((work / name).exists() for name in ("before", "after", "plots")), "files left in the clone"
    if page.name == "bring-your-own.md":  # the user's experiment got what a built-in gets
        report = (work / "report.html").read_text()
        assert 'data-experiment="rmsnorm"' in report and 'data-experiment="rmsnorm_llm"' in report
        assert "RMSNorm: mine against torch" in report and 'data-plot="rmsnorm_bandwidth"' in report
        assert (work / "plots" / "rmsnorm_bandwidth.png").is_file()
        sweeps = list((work / "outputs" / "sweeps").glob("*/sweep.csv"))
        assert len(sweeps) == 1 and sweeps[0].read_text().count("\n") >= 5  # both points, each with its rows


# --- the figures stated about how long things take: the newest measurement's -----------------

FIGURES = ROOT / "benchmarks" / "results" / "stated_figures.csv"  # benchmarks/stated_figures.py writes it


def seconds_of(text: str) -> float:
    """``25 s``, ``2 min`` or ``~5 h`` as seconds."""
    value, unit = re.fullmatch(r"~?([\d.]+) (s|min|h)", text.strip()).groups()  # type: ignore[union-attr]
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def stated_times() -> dict[str, str]:
    """Each preset's stated default and quick/ time, from its first comment (``[25 s; quick/ 5 s]``),
    which ``perflab`` lists: the one place these figures are written."""
    found = {}
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        head = re.search(r"\[([^;\]]+); quick/ ([^\]]+)\]", path.read_text())
        assert head, f"{path.name}: no [default; quick/ time] in its first comment"
        found[path.stem], found[f"quick/{path.stem}"] = head.group(1).split(":")[0].strip(), head.group(2).strip()
    return found


def test_the_readme_repeats_each_experiments_stated_time():
    stated = stated_times()
    table = dict(re.findall(r"^\| `(\w+)` \|[^|]*\| ([^|]+?) \|$", (ROOT / "README.md").read_text(), re.M))
    assert table and {name: stated[name] for name in table} == table


def close(stated_s: float, measured_s: float) -> bool:
    """A stated figure is true when it is within half again of the measured one (or 2 s of it)."""
    return abs(stated_s - measured_s) <= 2 or measured_s / 1.5 <= stated_s <= measured_s * 1.5


def test_every_time_stated_is_the_newest_measurement_of_it():
    import pandas as pd

    measured = pd.read_csv(FIGURES).groupby("figure").last()["median_s"].to_dict()
    rerun = f"measure it: python {FIGURES.parent.parent.name}/stated_figures.py"
    stated = {k: v for k, v in stated_times().items() if not v.startswith("~")}  # ~: made for GPUs, not run here
    readme = (ROOT / "README.md").read_text()
    suite = re.search(r"The tests take\s+about (\d+) minutes on 2 cores", readme)
    mistake = re.search(r"imported \(about ([\d.]+) s;", (ROOT / "docs" / "running.md").read_text())
    assert suite and mistake
    stated.update({"the README's test command": f"{suite.group(1)} min", "a config mistake": f"{mistake.group(1)} s"})
    wrong = {
        figure: f"stated {text}, measured {measured.get(figure, 'never')}"
        for figure, text in stated.items()
        if figure not in measured or not close(seconds_of(text), measured[figure])
    }
    assert not wrong, f"{wrong}; {rerun}"
