"""The experiment contract and its door: experiments come from installed packages through the
entry-point group ``perflab.experiments`` (perflab's own too), each hook is checked when its
module is registered, and a user's experiment gets what a built-in gets (the listing, runs,
sweeps, the report's section, compare). Installed packages are made here as a distribution's
metadata folder on ``sys.path`` (what pip leaves), so these tests stay in-process and cheap;
``tests/test_readme.py`` pip-installs the example package itself."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import perflab
from perflab import compare, report
from perflab.config import contract, registry
from perflab.errors import Refused

from conftest import FAST, ROOT

# Every module of perflab but the training workload's library (perflab/train/), whose
# measurements are called "train" and "compile": those words there name no experiment.
# perflab's shared code; the book (perflab/book) is about perflab's own experiments, by name
SHARED = [p for p in (ROOT / "perflab").rglob("*.py") if not {"train", "book"} & set(p.relative_to(ROOT).parts[1:-1])]


def forget() -> None:
    """Discovery again from what is installed now, as a new process would."""
    registry.entries.cache_clear()
    registry.get.cache_clear()


@pytest.fixture
def install(tmp_path, monkeypatch):
    """``install(dist, {name: module}, {path: source})``: a package as pip leaves it, on sys.path."""
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    added: list[str] = []

    def _install(dist: str, entries: dict[str, str], sources: dict[str, str] | None = None) -> None:
        meta = site / f"{dist}-0.1.0.dist-info"
        meta.mkdir(parents=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        lines = [f"{name} = {module}" for name, module in entries.items()]
        (meta / "entry_points.txt").write_text("[perflab.experiments]\n" + "\n".join(lines) + "\n")
        for path, text in (sources or {}).items():
            (site / path).parent.mkdir(parents=True, exist_ok=True)
            (site / path).write_text(text)
        added.extend(entries)
        forget()

    _install.site = site  # type: ignore[attr-defined]
    yield _install
    forget()
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for name in added:  # this process's ConfigStore forgets them too
        for group in (repo.get("experiment", {}), repo.get("schema", {}).get("experiment", {})):
            group.pop(f"{name}.yaml", None)
    for module in [m for m in sys.modules if m.split(".")[0] in ("userpkg", "brokenpkg", "oddpkg", "edgepkg")]:
        del sys.modules[module]


@pytest.fixture
def userpkg(install, monkeypatch):
    """The example package of docs/bring-your-own.md, installed."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "userpkg"))
    install("userpkg", {"rmsnorm": "userpkg.experiments.rmsnorm"})


# --- the contract ---------------------------------------------------------------------------------


def module(**attrs) -> types.ModuleType:
    m = types.ModuleType("mine")
    m.__dict__.update(attrs)
    return m


def test_every_hook_is_checked_against_its_declared_type():
    from perflab.experiments.matmul import Config

    good = {"Config": Config, "run": lambda ctx: None}
    assert contract.check(module(**good)).METRIC == "median_s"  # the defaults of what it leaves out
    cases = [
        ({}, "defines no Config; allowed: a dataclass subclassing perflab.config.schema.ExperimentConfig"),
        ({"Config": int, "run": good["run"]}, "Config is the class int, not a dataclass"),
        ({**good, "run": lambda: None}, "run cannot be called with 1 argument"),
        ({**good, "headline": "x"}, "headline is 'x' (str); allowed: a function of 1 argument"),
        ({**good, "report": lambda rows: None}, "report cannot be called with 2 arguments"),
        ({**good, "METRIC": 3}, "METRIC is 3 (int); allowed: a column name"),
        ({**good, "WRITES_PEAKS": "yes"}, "WRITES_PEAKS is 'yes' (str); allowed: True or False"),
        ({**good, "SUMMARY_ROWS": "train"}, "SUMMARY_ROWS is 'train' (str); allowed: a tuple"),
    ]
    for attrs, line in cases:
        with pytest.raises(contract.Malformed) as found:
            contract.check(module(**attrs))
        assert str(found.value).startswith(line), str(found.value)


def test_perflab_declares_its_own_experiments_as_a_user_package_would():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["perflab.experiments"]
    modules = sorted(p.stem for p in (ROOT / "experiments").glob("*.py") if not p.stem.startswith("_"))
    assert sorted(declared) == modules and all(v == f"perflab.experiments.{k}" for k, v in declared.items())
    found = registry.declared()
    assert {n: d.module for n, d in found.items() if d.builtin} == declared  # what the installed metadata says
    for name in modules:
        assert registry.get(name).hooks.Config.__module__ == f"perflab.experiments.{name}"


def test_no_shared_module_names_an_experiment():
    """What is special about an experiment lives in it: report, plots and compare name none."""
    names = set(registry.choices())
    for path in SHARED:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in names, f"{path.relative_to(ROOT)}:{node.lineno} names {node.value!r}"
    for path in (ROOT / "perflab" / "report").glob("*.*[!y]"):  # the page, its CSS and scripts
        words = set(re.findall(r"\w+", path.read_text()))
        assert not words & names, f"{path.name} names {words & names}"


def test_the_book_holds_the_chapter_and_the_experiments_only_measure():
    """Each book experiment's module measures; its book part (perflab.book) holds the chapter's
    sizes and claims, and its report section and work line stand for the module's."""
    from perflab import book, chapter

    for name in book.PARTS:
        e, part = registry.get(name), book.module(name)
        assert not [n for n in ("CHAPTER_SHARE", "chapter", "claims", "report") if hasattr(e.module, n)], name
        assert e.book.in_chapter and part is not None and e.hooks.report is part.report, name
    assert registry.get("train").hooks.work is book.module("train").work
    assert book.module("infer") is None and set(chapter.in_chapter()) == set(book.PARTS)


def test_the_template_experiment_imports_only_the_authors_face():
    """experiments/matmul.py is what a user copies: every perflab name it uses is perflab.experiment's."""
    tree = ast.parse((ROOT / "experiments" / "matmul.py").read_text())
    found = {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("perflab")
    }
    assert found == {"perflab.experiment"}


# --- the door -------------------------------------------------------------------------------------


def test_a_users_experiment_is_listed_run_swept_reported_and_compared(userpkg, cli, work):
    listed = cli().out
    assert re.search(
        r"rmsnorm +RMSNorm: my hand-written .*\[userpkg\.experiments\.rmsnorm, from userpkg 0\.1\.0\]", listed
    )
    assert "perflab's own (perflab " in listed
    swept = cli("-m", "+experiment=rmsnorm", "experiment.rows=64,128", "experiment.features=256", *FAST)
    assert "sweep: 2 jobs: 2 ok" in swept.out + swept.err
    tree = work / "outputs"
    page = report.build(tree)
    section = page[page.index('id="sec-rmsnorm"') :]
    section = section[: section.index("</section>")]
    assert "RMSNorm: mine against torch" in section and 'data-plot="rmsnorm_bandwidth"' in section
    assert "<td>kernel</td><td>F.rms_norm: one fused op</td>" in section  # its reference beside this tree
    assert re.search(r"<td>rows 64</td><td>cpu mine: [\d.]+ GB/s, torch&#x27;s", section)  # each run's headline
    table = compare.compare(tree, experiment="rmsnorm")
    assert set(table["metric"]) == {"gbps"} and len(table) == 4  # its METRIC; mine and torch's at 2 sizes


def test_a_users_experiment_runs_on_its_configs_defaults_and_presets_from_its_config_dir(userpkg, work, cli):
    df = perflab.run("rmsnorm", [*FAST, "experiment.rows=32"])
    assert df.attrs["outcome"] == "ok" and set(df["cfg.experiment.features"]) == {1024}  # Config's default
    terminal = (Path(df.attrs["run_dir"]) / "perflab.log").read_text()  # what the job printed
    assert "kernel: userpkg.ops.rms_norm: pow, mean, add, rsqrt, 2 muls here; torch's: F.rms_norm" in terminal
    folder = ROOT / "examples" / "userpkg" / "conf"
    listed = cli("--config-dir", str(folder)).out  # the listing names the presets of the user's config dir
    assert f"Presets in {folder}:\n  rmsnorm_llm" in re.sub(r"rmsnorm_llm +", "rmsnorm_llm", listed)
    ran = cli(
        "experiment=rmsnorm_llm", "--config-dir", str(folder), "experiment.rows=16", "experiment.features=64", *FAST
    )
    assert "cpu mine: " in ran.out  # the preset ran, its keys after Hydra's flag taken too
    assert cli("+experiment=rmsnorm_lm", "--config-dir", str(folder), rc=2).err.startswith(
        "perflab: error: experiment=rmsnorm_lm: unknown experiment; did you mean rmsnorm_llm?"
    )
    conf = f"hydra.searchpath=[file://{folder}]"
    df = perflab.run("rmsnorm_llm", [*FAST, conf, "experiment.rows=16", "experiment.features=64"])
    assert set(df["experiment"]) == {"rmsnorm_llm"} and set(df["cfg.experiment.dtype"]) == {"bfloat16"}
    (work / "conf" / "experiment").mkdir(parents=True)
    (work / "conf" / "experiment" / "rmsnorm.yaml").write_text("# @package _global_\nexperiment:\n  rows: 3\n")
    with pytest.raises(Refused, match=r"conf/experiment/rmsnorm.yaml: a preset named like the experiment rmsnorm"):
        perflab.run("rmsnorm", [f"hydra.searchpath=[file://{work / 'conf'}]"])


# --- the user's presets and config dirs -----------------------------------------------------------

# An experiment of the reviewer's own: softmax rows, whose row count has no default.
SOFTMAXER = {
    "up2/__init__.py": "",
    "up2/softmaxer.py": (
        '"""Softmax over rows."""\n'
        "from dataclasses import dataclass\n"
        "from perflab.experiment import ExperimentConfig\n"
        "@dataclass\n"
        "class Config(ExperimentConfig):\n"
        "    rows: int\n"
        "    cols: int = 64\n"
        "def run(ctx):\n"
        "    import torch\n"
        "    x = torch.randn(ctx.params.rows, ctx.params.cols)\n"
        "    ctx.measure('softmax', lambda: x.softmax(-1), ctx.devices, items=ctx.params.rows)\n"
    ),
}


def presets(folder: Path, files: dict[str, str]) -> Path:
    """A user's config dir holding these presets (path under experiment/ -> text)."""
    for name, text in files.items():
        (folder / "experiment" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "experiment" / name).write_text(text)
    return folder


PRESET = "# @package _global_\ndefaults:\n  - {base}\n  - _self_\nexperiment:\n  {key}: 7\n"


def test_a_config_field_without_a_default_is_given_in_a_preset_or_on_the_command_line(install, cli, work):
    install("up2", {"softmaxer": "up2.softmaxer"}, SOFTMAXER)
    assert "softmaxer" in cli().out  # it imports: ExperimentConfig's own field does not come first
    line = (
        "experiment.rows: no value given; allowed: an integer, set in a preset (under experiment:) or on the "
        "command line: experiment.rows=..."
    )
    assert cli("+experiment=softmaxer", rc=2).err == f"perflab: error: {line}\n"
    with pytest.raises(Refused) as refused:
        perflab.run("softmaxer")
    assert str(refused.value) == line
    df = perflab.run("softmaxer", [*FAST, "experiment.rows=8"])
    assert df.attrs["outcome"] == "ok" and set(df["cfg.experiment.rows"]) == {8}


def test_a_preset_named_like_an_experiment_or_leading_back_to_itself_is_refused_first(install, cli, work):
    """Hydra would recurse into a preset that lists itself (a RecursionError, thousands of lines),
    or take perflab's preset in place of one named like it: one line first, for every command
    given that folder, however it is given."""
    install("up2", {"softmaxer": "up2.softmaxer"}, SOFTMAXER)
    mine = presets(work / "mine", {"softmaxer.yaml": PRESET.format(base="softmaxer", key="rows")})
    line = (
        f"perflab: error: {mine}/experiment/softmaxer.yaml: a preset named like the experiment softmaxer, whose "
        "defaults are its Config's; allowed: a preset of another name (softmaxer_big.yaml, its defaults list "
        "starting with - softmaxer)\n"
    )
    for args in (("+experiment=softmaxer",), ("+experiment=quick/matmul", *FAST), ("+experiment=softmaxer", "--help")):
        assert cli(*args, "--config-dir", str(mine), rc=2).err == line
        assert cli(*args, f"hydra.searchpath=[file://{mine}]", rc=2).err == line
    with pytest.raises(Refused) as refused:
        perflab.run("softmaxer", [f"hydra.searchpath=[file://{mine}]"])
    assert f"{refused.value}\n" == line.removeprefix("perflab: error: ")
    theirs = presets(work / "theirs", {"quick/matmul.yaml": PRESET.format(base="/experiment/matmul", key="size")})
    assert cli("+experiment=matmul", "--config-dir", str(theirs), rc=2).err.startswith(
        f"perflab: error: {theirs}/experiment/quick/matmul.yaml: a preset named like perflab's own preset "
        "quick/matmul, which +experiment=quick/matmul runs in its place; allowed: a preset of another name"
    )
    loop = presets(
        work / "loop",
        {"big.yaml": PRESET.format(base="bigger", key="rows"), "bigger.yaml": PRESET.format(base="big", key="rows")},
    )
    assert cli("+experiment=big", "--config-dir", str(loop), rc=2).err == (
        f"perflab: error: {loop}/experiment/big.yaml: its defaults list comes back to it: big -> bigger -> big; "
        "allowed: defaults lists that never lead back (a preset's starts with its experiment: - NAME)\n"
    )
    assert cli("+experiment=quick/matmul", "--config-dir", str(work / "nope"), rc=2).err == (
        f"perflab: error: config dir {work / 'nope'}: no such folder; allowed: a folder of presets, "
        "FOLDER/experiment/NAME.yaml (--config-dir FOLDER or hydra.searchpath=[file://FOLDER])\n"
    )
    assert not (work / "outputs").exists()


def test_a_mistake_in_a_users_preset_is_one_line_naming_its_file(install, cli, work):
    install("up2", {"softmaxer": "up2.softmaxer"}, SOFTMAXER)
    header = "# @package _global_\n"
    body = "defaults:\n  - softmaxer\n  - _self_\nexperiment:\n"
    mine = presets(
        work / "pkg" / "conf",
        {
            "not_yaml.yaml": f"{header}{body}  rows: [1,\n",
            "misspelt.yaml": f"{header}{body}  rowz: 1024\n",
            "headless.yaml": f"{body}  rows: 1024\n",
            "elsewhere.yaml": header + PRESET.format(base="nowhere_norm", key="rows"),  # installed nowhere
        },
    )
    (work / "pkg" / "pyproject.toml").write_text('[project.entry-points."perflab.experiments"]\nnowhere_norm = "x.y"\n')
    where = f"{mine}/experiment"

    def said(name: str) -> str:
        ran = cli(f"+experiment={name}", "--config-dir", str(mine), *FAST, rc=2)
        assert ran.err.startswith("perflab: error: ") and ran.err.count("\n") == 1, ran.err
        return ran.err.removeprefix("perflab: error: ").strip()

    assert said("not_yaml") == (
        f"{where}/not_yaml.yaml, line 7 (its end: a list or mapping opened before is not closed): not valid YAML "
        "(expected the node content, but found '<stream end>'; while parsing a flow node); allowed: YAML with "
        "every list and mapping closed ([1, 2], {a: 1}) and a space after each key's colon"
    )
    assert said("misspelt") == (
        f"In {where}/misspelt.yaml: experiment.rowz: unknown key; did you mean experiment.rows?; allowed: the keys "
        "under experiment: name, rows, cols"
    )
    assert said("headless").startswith(
        f"In {where}/headless.yaml: no `# @package _global_` first line, so its experiment: went under experiment: "
        "(experiment.experiment: unknown key); allowed: `# @package _global_` as the first line of a preset"
    )
    assert said("elsewhere").startswith(
        f"In {where}/elsewhere.yaml: its defaults list names nowhere_norm, and experiment nowhere_norm is not "
        "installed here "
        f"(pip install -e {os.path.relpath(work / 'pkg')} declares it); allowed: an installed experiment or preset: "
    )
    with pytest.raises(Refused) as refused:  # the same line from Python
        perflab.run("misspelt", [f"hydra.searchpath=[file://{mine}]"])
    assert str(refused.value).startswith(f"In {where}/misspelt.yaml: experiment.rowz: unknown key; did you mean")
    assert not (work / "outputs").exists()


def test_a_module_that_does_not_import_breaks_only_itself(install, cli, work):
    install(
        "brokenpkg", {"broken": "brokenpkg.exp"}, {"brokenpkg/__init__.py": "", "brokenpkg/exp.py": "import nothere\n"}
    )
    line = (
        "experiment broken (brokenpkg.exp, from brokenpkg 0.1.0): cannot import it: "
        "ModuleNotFoundError: No module named 'nothere'; allowed: a module that imports (fix it, or pip uninstall "
        "brokenpkg)"
    )
    listed = cli().out  # the listing says it, and exits 0
    assert "Broken (refused when chosen; every other experiment runs):" in listed and line in listed
    ran = cli("+experiment=broken", rc=2)  # chosen: one line, nothing written
    assert ran.err == f"perflab: error: {line}\n" and ran.out == ""
    with pytest.raises(Refused) as refused:  # from Python too: every refusal is a Refused
        perflab.run("broken", FAST)
    assert str(refused.value) == line
    assert not (work / "outputs").exists()
    assert "matmul" in cli("+experiment=quick/matmul", *FAST).out  # every other experiment runs
    assert not perflab.run("quick/matmul", FAST).empty


def test_a_malformed_hook_or_a_taken_name_breaks_only_itself(install, cli):
    source = "from perflab.experiments.matmul import Config\ndef run(ctx): pass\nheadline = 'fast'\n"
    install("oddpkg", {"odd": "oddpkg.exp"}, {"oddpkg/__init__.py": "", "oddpkg/exp.py": source})
    odd = (
        "experiment odd (oddpkg.exp, from oddpkg 0.1.0): headline is 'fast' (str); "
        "allowed: a function of 1 argument (perflab.config.contract.Hooks.headline)"
    )
    assert odd in cli().out
    assert cli("+experiment=odd", rc=2).err == f"perflab: error: {odd}\n"
    install("userpkg", {"matmul": "userpkg.mine"})
    taken = (
        "experiment matmul (userpkg.mine, from userpkg 0.1.0): perflab declares an experiment of "
        "that name too (perflab.experiments.matmul); allowed: one package per name"
    )
    assert taken in cli().out
    assert registry.get("matmul").declared.builtin  # perflab's own keeps its name, and runs
    assert "matmul" in cli("+experiment=quick/matmul", *FAST).out


def test_registering_a_users_experiment_imports_no_torch(install, tmp_path):
    """The contract's promise: every experiment is imported to check a config, none imports torch."""
    install("userpkg", {"rmsnorm": "userpkg.experiments.rmsnorm"})
    code = (
        "import sys; from perflab.config import registry; registry.discover(); "
        "print(registry.listing(), sorted(sys.modules))"
    )
    path = os.pathsep.join([str(install.site), str(ROOT / "examples" / "userpkg")])
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "userpkg.experiments.rmsnorm, from userpkg" in proc.stdout, proc.stderr
    assert "'torch'" not in proc.stdout and "'pandas'" not in proc.stdout


@pytest.mark.parametrize("old", ["perflab.schema", "perflab.contract", "perflab.context"])
def test_the_imports_dropped_in_0_4_0_are_gone(old):
    """0.4.0 removed the forwarding modules CHANGELOG promised until then: perflab.experiment is the face."""
    import importlib

    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_a_users_experiment_without_a_report_hook_gets_a_figure_of_its_measurements(install, work, capsys):
    """It got none ("plots: nothing to plot here"): the median time of each of its measurements."""
    install("up2", {"softmaxer": "up2.softmaxer"}, SOFTMAXER)
    perflab.run("softmaxer", [*FAST, "experiment.rows=8", "results.table=false"])
    assert compare.main([str(work / "outputs"), "--plot", str(work / "plots")]) == 0
    assert f"plot: {work / 'plots' / 'timings.png'}" in capsys.readouterr().out


OLD_HOOKS = """
from dataclasses import dataclass
from perflab.experiment import ExperimentConfig
from perflab.measure.sizing import Point

@dataclass
class Config(ExperimentConfig):
    rows: int = 4

def run(ctx):
    pass

CHAPTER_SHARE = 0.1

def chapter(machine, seconds):
    return [Point("13.9", "oldhooks", [], seconds, "why")]

def claims(rows, tree):
    return []
"""


def test_a_users_experiment_with_the_chapter_hooks_of_before_takes_part_with_a_warning(install):
    """CHAPTER_SHARE, chapter and claims left the contract for perflab.book: a module defining
    them is read as before this release, with a DeprecationWarning that says so."""
    from perflab import chapter

    install("edgepkg", {"oldhooks": "edgepkg.oldhooks"}, {"edgepkg/__init__.py": "", "edgepkg/oldhooks.py": OLD_HOOKS})
    with pytest.warns(DeprecationWarning, match="CHAPTER_SHARE, chapter, claims: these hooks left the experiment"):
        part = registry.get("oldhooks").book
    assert part.share == 0.1 and part.in_chapter and part.claims is not None
    with pytest.warns(DeprecationWarning):
        assert "oldhooks" in chapter.in_chapter()
