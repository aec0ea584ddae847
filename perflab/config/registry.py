"""Finds the experiments every installed package declares, checks each against the contract
(:mod:`perflab.config.contract`) and registers its typed config with Hydra's ConfigStore, so that
``+experiment=NAME`` composes a checked schema.

The door is one entry-point group, ``perflab.experiments`` (name -> module): perflab declares
its own experiments there in its pyproject.toml exactly as a user's package declares theirs::

    [project.entry-points."perflab.experiments"]
    mine = "userpkg.experiments.mine"

An experiment with no YAML preset runs on its Config's defaults (``+experiment=mine``); presets
(``conf/experiment/NAME.yaml``, or the user's own config dir via ``--config-dir`` or
``hydra.searchpath``) set other values. Every hook is read here, through :class:`Experiment`; the
hooks called after the measurement (work, headline, the report's setup lines, label, progress)
are called through one door, :meth:`Experiment.after`, where a failure costs one line, not the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import logging
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

from perflab.config import contract
from perflab.config.schema import PerflabConfig
from perflab.errors import ConfigError, first_line
from perflab.store import files

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.job.context import Context

log = logging.getLogger("perflab")
T = TypeVar("T")

GROUP = "perflab.experiments"
OURS = "perflab"  # the distribution whose experiments are the built-ins
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExperimentError(ConfigError):
    """An experiment that cannot be registered (it does not import, or does not fit the
    contract): one line naming it, its module and its package; exit 2, nothing run."""

    def __init__(self, name: str, where: str, problem: str, allowed: str = "") -> None:
        self.where = where
        super().__init__("experiment", name, allowed, problem)

    def line(self) -> str:
        allowed = f"; allowed: {self.allowed}" if self.allowed else ""
        return f"experiment {self.value} ({self.where}): {self.problem}{allowed}"


@dataclass(frozen=True)
class Declared:
    """An entry of the group: the experiment's name, its module and the package declaring it."""

    name: str
    module: str
    package: str
    version: str

    @property
    def builtin(self) -> bool:
        return self.package == OURS

    def __str__(self) -> str:
        return f"{self.module}, from {self.package} {self.version}".strip()


@functools.cache
def entries() -> tuple[dict[str, Declared], dict[str, ExperimentError]]:
    """The group's entries, by name: those that can be imported, and those declared wrongly (a
    malformed entry point, a name two packages declare), each with its one line."""
    found: dict[str, Declared] = {}
    wrong: dict[str, ExperimentError] = {}
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = ep.dist
        d = Declared(ep.name, ep.module, dist.name if dist else "?", dist.version if dist else "")
        if ep.attr or not NAME.fullmatch(ep.name):
            wrong[ep.name] = ExperimentError(
                ep.name,
                f"{ep.value}, from {d.package}",
                f'entry point {ep.name} = "{ep.value}" in group {GROUP}',
                'a name of letters, digits and _ and a module path: mine = "userpkg.experiments.mine"',
            )
            continue
        other = found.get(ep.name)
        if other is not None and other.module != d.module:
            if d.builtin:  # the name was perflab's first: the other package is the one to rename
                d, other = other, d
            wrong[ep.name] = ExperimentError(
                ep.name,
                str(d),
                f"{other.package} declares an experiment of that name too ({other.module})",
                f"one package per name: rename it in {d.package}'s pyproject.toml",
            )
            if not other.builtin:  # neither is perflab's: the name is nobody's until one renames it
                found.pop(ep.name)
                continue
            found[ep.name] = other
            continue
        found[ep.name] = d
    if not any(d.builtin for d in found.values()):
        raise ExperimentError(
            "(none)",
            f"group {GROUP}",
            f"{OURS}'s own experiments are not registered: its install metadata is out of date",
            "re-install it (pip install -e . in a clone, or pip install perflab)",
        )
    return dict(sorted(found.items())), wrong


def declared() -> dict[str, Declared]:
    """Every experiment the installed packages declare, by name; no module imported. A name
    declared wrongly is left out (:func:`entries` says why)."""
    return entries()[0]


def names() -> list[str]:
    """Every experiment's name, without importing any."""
    return list(declared())


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: every hook perflab reads is read here, through :attr:`hooks`."""

    name: str
    module: ModuleType
    declared: Declared
    said: set[tuple[str, str]] = field(default_factory=set, init=False, compare=False, repr=False)

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a worker process (inside a job's Context) by name: registered there anew."""
        return get, (self.name,)

    @property
    def hooks(self) -> contract.Hooks:
        """Its module's hooks; for perflab's own, the book's report and work line stand for the
        module's (perflab.book). Read now, not at registration: tests patch a module."""
        hooks = contract.hooks_of(self.module)
        if not self.declared.builtin:
            return hooks
        from perflab import book

        shown = book.shown(self.name, True)
        return dataclasses.replace(hooks, **shown) if shown else hooks

    @property
    def book(self) -> Any:
        """The book's part of it (``perflab.book.Part``): its claims and its sizes in ``perflab chapter``."""
        from perflab import book

        return book.part(self.name, self.declared.builtin, self.module)

    @property
    def metric(self) -> str:
        return self.hooks.METRIC

    def run(self, ctx: Context) -> None:
        self.hooks.run(ctx)

    def check(self, settings: PerflabConfig, devices: Sequence[Any]) -> None:
        """Raise ConfigError for a config these devices cannot run; before any work."""
        if settings.bench.timer == "cuda_event" and devices and not any(d.type == "cuda" for d in devices):
            on = ", ".join(d.name for d in devices)
            raise ConfigError(
                "bench.timer",
                "cuda_event",
                "auto, wall_sync or torch_utils_benchmark (CUDA events time a CUDA device)",
                problem=f"this job runs on {on}, no CUDA device",
            )
        if settings.bench.instructions:
            self._check_instructions(devices)
        fn = self.hooks.check
        if fn:
            fn(settings, devices)

    def _check_instructions(self, devices: Sequence[Any]) -> None:
        """``bench.instructions=true`` only where it can count: an experiment whose parts say
        their calls as source text, on the CPU alone, with valgrind installed."""
        from perflab.measure import instructions

        if not self.hooks.COUNTS_INSTRUCTIONS:
            problem = f"{self.name} does not say its work as source text to count"
            counting = ", ".join(n for n in names() if _counts_instructions(n)) or "none installed"
            raise ConfigError(
                instructions.KEY, "true", f"false (experiments that count them: {counting})", problem=problem
            )
        gpu = [d.name for d in devices if d.type != "cpu"]
        if gpu:
            problem = f"this job runs on {', '.join(gpu)}: callgrind counts CPU work only"
            raise ConfigError(instructions.KEY, "true", "false, or devices.spec=cpu", problem=problem)
        why = instructions.unavailable()
        if why:
            raise ConfigError(instructions.KEY, "true", "false, or install valgrind", problem=why)

    # --- the hooks called after the measurement: a failure is a line, the rows stand -------------

    def after(self, hook: str, call: Callable[[Callable[..., Any]], T], instead: Callable[[str], T]) -> T | None:
        """``call(the hook)``, or, where it raises, ``instead`` of its line ("mine.headline failed:
        KeyError: 'x'"): a hook that runs once the rows are saved never costs the job or its
        table. None where the module defines no such hook."""
        fn = getattr(self.hooks, hook)
        if fn is None:
            return None
        try:
            return call(fn)
        except Exception as err:
            return instead(f"{self.module.__name__}.{hook} failed: {type(err).__name__}: {first_line(err)}")

    def once(self, line: str, row: Mapping[str, Any]) -> None:
        """Log a per-row hook's failure once per run (not once per row)."""
        key = (line, str(row.get("run_id", "")))
        if key not in self.said:
            self.said.add(key)
            log.warning("%s", line)

    def progress(self, row: Mapping[str, Any]) -> str | None:
        """Its own line as a row is recorded (None: the generic one, also where its hook fails)."""
        found = self.after("progress", lambda fn: fn(row), lambda line: self.once(line, row))
        return None if found is None else str(found)

    def label(self, row: Mapping[str, Any]) -> str:
        """How the job's table names a row (default, and where its hook fails: its measurement)."""
        found = self.after("label", lambda fn: str(fn(row)), lambda line: self.once(line, row))
        return found or str(row.get("measurement", ""))

    def headline(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """The figures that matter, under the job's table (where its hook fails: that line)."""
        return self.after("headline", lambda fn: [str(line) for line in fn(rows)], lambda line: [line]) or []

    def work(self, rows: Sequence[Mapping[str, Any]]) -> str:
        """How much work a timed call did ("" without a work hook; where it fails: that line)."""
        return (self.after("work", lambda fn: str(fn(rows)), str) or "") if rows else ""

    def beside_reference(self, rows: Sequence[Mapping[str, Any]]) -> list[str]:
        """The terminal's lines of its report section: each setup line, this run's beside the
        reference's (nothing without a report hook; where it fails: that line)."""
        import pandas as pd

        def setup(fn: Callable[..., Any]) -> list[str]:
            s = self.section(pd.DataFrame(list(rows)), {})
            return [f"{x.what}: {x.here or '?'} here; {s.reference}: {x.reference}" for x in s.setup]

        return self.after("report", setup, lambda line: [line]) or []

    # --- the report's hooks ----------------------------------------------------------------------

    def section(self, rows: DataFrame, samples: contract.Samples) -> contract.Section:
        """Its section of the report (rows: one preset's), or without a report hook a plain one
        with a figure of its measurements (the median time of each, plots.timings)."""
        fn = self.hooks.report
        found = fn(rows, samples) if fn else None
        if not isinstance(found, contract.Section):
            if fn:
                raise TypeError(f"{self.name}'s report hook returned {type(found).__name__}, not a Section")
            from perflab.analysis import plots

            why = "timings: no ok row with a median time"
            found = contract.Section(figures=[contract.Figure("timings", plots.timings, rows, why_none=why)])
        return found

    @property
    def summary(self) -> str:
        """The first line of its module's docstring."""
        return first_line(self.module.__doc__ or "") or "(no docstring)"


def _counts_instructions(name: str) -> bool:
    """Whether ``name`` counts instructions (a broken experiment does not); for a refusal's
    list, so it imports every experiment only when one is refused."""
    try:
        return bool(get(name).hooks.COUNTS_INSTRUCTIONS)
    except (ConfigError, ExperimentError):
        return False


@functools.cache
def get(name: str) -> Experiment:
    """The experiment ``name``, imported and checked against the contract (ExperimentError if not)."""
    d = declared().get(name)
    if d is None:
        raise ConfigError("experiment", name, ", ".join(choices()), problem="unknown experiment")
    try:
        module = importlib.import_module(d.module)
    except (Exception, SystemExit) as err:  # the module's own top-level code, whatever it raises: sys.exit() too
        fix = "a module that imports" + ("" if d.builtin else f" (fix it, or pip uninstall {d.package})")
        said = f"{type(err).__name__}: {first_line(err)}"
        if isinstance(err, SystemExit):  # would end perflab, every command of it, without a word
            said = f"it calls sys.exit({err.code!r}) as it is imported"
        raise ExperimentError(name, str(d), f"cannot import it: {said}", fix) from None
    try:
        contract.check(module)
    except contract.Malformed as err:
        raise ExperimentError(name, str(d), str(err)) from None
    return Experiment(name, module, d)


def discover() -> dict[str, Experiment]:
    """Every experiment that imports and fits the contract (the others are refused when chosen)."""
    found: dict[str, Experiment] = {}
    for name in names():
        with contextlib.suppress(ExperimentError):
            found[name] = get(name)
    return found


def check_chosen(name: str) -> None:
    """Raise the one line of ``name`` if it is an experiment that cannot be used (a preset or
    an unknown name is for composing to judge)."""
    if name in declared():
        get(name)
    elif name in entries()[1]:
        raise entries()[1][name]


def of_rows(rows: DataFrame) -> Experiment | None:
    """The experiment behind rows of one preset (lenet_scratch -> train): ``cfg.experiment.name``,
    else the ``experiment`` column itself; None when it is not installed here (or is several)."""
    for column in ("cfg.experiment.name", "experiment"):
        found = rows[column].dropna().astype("string").unique() if column in rows else []
        if len(found) == 1 and str(found[0]) in declared():
            return get(str(found[0]))
    return None


def config_dir() -> Path:
    """The ``perflab.conf`` package (the repo's top-level ``conf/``, installed or editable)."""
    return Path(str(resources.files("perflab.conf")))


def presets(folder: Path | None = None) -> dict[str, str]:
    """The ``+experiment=`` presets of a config dir (default: perflab's, conf/experiment/*.yaml),
    each with the first line of its comment."""
    found = {}
    for path in sorted(((folder or config_dir()) / "experiment").glob("*.yaml")):
        try:
            text = files.read_text(path)
        except (OSError, ValueError):  # not a file to read (a FIFO): composing refuses it in one line
            text = ""
        comments = [line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#")]
        found[path.stem] = next((c for c in comments if c and not c.startswith("@package")), "")
    return found


def choices() -> list[str]:
    """What ``+experiment=`` takes here: perflab's presets and every declared experiment."""
    return sorted(set(presets()) | set(declared()))


def register_configs() -> None:
    """Root schema as ``perflab_schema``; each experiment's as ``schema/experiment/<name>``; and
    for an experiment without a preset of its name, ``experiment/<name>``: its Config's defaults."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="perflab_schema", node=PerflabConfig)
    ours = presets()
    for exp in discover().values():
        cs.store(group="schema/experiment", name=exp.name, node=exp.hooks.Config)
        if exp.name not in ours:
            cs.store(
                group="experiment",
                name=exp.name,
                package="_global_",
                node={
                    "defaults": [{"/schema/experiment@experiment": exp.name}, "_self_"],
                    "experiment": {"name": exp.name},
                },
            )


def listing(config_dirs: Sequence[Path] = ()) -> str:
    """``perflab`` alone: perflab's presets, then the experiments other packages declare (imported
    to read their docstrings), those that cannot be used with their one line, then the presets of
    the user's own config dirs (``--config-dir``, ``hydra.searchpath``)."""
    choices = presets()
    theirs, wrong = [], dict(entries()[1])  # perflab's own are not imported to list them
    for name, d in declared().items():
        if not d.builtin:
            try:
                theirs.append(get(name))
            except ExperimentError as err:
                wrong[name] = err
    width = max(map(len, [*choices, *(e.name for e in theirs), *wrong]), default=0)
    lines = [
        "perflab: choose an experiment with +experiment=NAME"
        "  [how long its default run and its quick/ variant take on a 2-core CPU]",
        "",
    ]
    ours = next((d for d in declared().values() if d.builtin), None)
    lines.append(f"perflab's own ({ours.package} {ours.version}: perflab.experiments):" if ours else "perflab's own:")
    lines += [f"  {name.ljust(width)}  {summary}" for name, summary in choices.items()]
    if theirs:
        lines += ["", "From other packages (entry points perflab.experiments; run on their Config's defaults):"]
        lines += [f"  {e.name.ljust(width)}  {e.summary} [{e.declared}]" for e in theirs]
    if wrong:
        lines += ["", "Broken (refused when chosen; every other experiment runs):"]
        lines += [f"  {name.ljust(width)}  {err.line()}" for name, err in wrong.items()]
    for folder in config_dirs:
        found = presets(folder)
        if found:
            lines += ["", f"Presets in {folder}:"]
            lines += [f"  {name.ljust(width)}  {summary}" for name, summary in found.items()]
    lines += [
        "",
        "Each of perflab's own has a quick/ variant, small enough for a first look (seconds): +experiment=quick/NAME",
        "",
        "Examples:",
        "  perflab +experiment=auto_parallel",
        "  perflab +experiment=quick/train                    # 2 epochs on 2048 images",
        "  perflab +experiment=matmul --help                  # every key of that job and its value",
        "  perflab -m +experiment=matmul experiment.size=64,128   # a sweep",
        "  perflab +experiment=train strategy=ddp devices.count=2 trainer.epochs=2",
        "  python -m perflab.results                          # past runs",
        "Your own experiment: docs/bring-your-own.md",
    ]
    return "\n".join(lines)
