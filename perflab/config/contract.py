"""The experiment contract: what an experiment module may define, declared once and typed
(:class:`Hooks`), checked when the module is registered (:func:`check`), and the data its
``report`` hook returns (:class:`Section`), which the HTML report, ``compare --plot`` and the
terminal render alike for perflab's own experiments and a user's.

An experiment is a module, found through the entry-point group ``perflab.experiments``
(name -> module), that imports no torch at its top. Everything perflab reads from it is a
field of :class:`Hooks` (and its docstring, for the listing); nothing else. This module imports
neither torch nor pandas: registering an experiment is on the path of every config check.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from perflab.config.schema import ExperimentConfig, PerflabConfig

if TYPE_CHECKING:
    from numpy import ndarray
    from pandas import DataFrame

    from perflab.job.context import Context
    from perflab.measure.devices import Device
else:  # at run time only the hooks' shapes are checked: neither torch nor pandas is imported
    Context = Device = DataFrame = ndarray = Any

Row = Mapping[str, Any]  # one result row: column -> value (an empty cell is absent)
Samples = Mapping[str, "ndarray"]  # row_id -> that row's raw sample seconds (not its warm-up)


# --- what the report hook returns ------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """One line of "the reference beside this tree": what, the reference's value, ours."""

    what: str
    reference: str
    here: str


@dataclass(frozen=True)
class Table:
    """A small table of the section's own (strings, shown as given)."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    intro: str = ""


@dataclass(frozen=True)
class Figure:
    """A plot: ``plot(rows)`` returns a matplotlib Figure, or None when the rows hold nothing it
    could draw (then ``why_none`` is said in its place). ``rows=None``: every row the report or
    comparison holds (a roofline draws the points of every experiment). ``name``: its file in
    ``compare --plot`` (``NAME.png``) and its ``data-plot`` in the report."""

    name: str
    plot: Callable[[DataFrame], Any]
    rows: Optional[DataFrame] = None
    caption: str = ""
    why_none: str = ""


@dataclass(frozen=True)
class Section:
    """An experiment's section of the report, as data. Sections are ordered by ``number`` (the
    book's section for perflab's own: "13.1"; numbered ones first), then by name."""

    number: str = ""
    title: str = ""  # default: the experiment's name
    headline: Sequence[str] = ()  # a few lines over all its runs (default: a single run's headline)
    reference: str = "reference"  # whose values the setup lines carry ("the book"), its column header
    setup: Sequence[Setup] = ()
    tables: Sequence[Table] = ()
    figures: Sequence[Figure] = ()
    notes: Sequence[str] = ()  # sentences under the setup (where the reference values come from ...)


# --- the hooks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hooks:
    """Every name perflab reads from an experiment module, its type and its default.

    Config        its knobs: a dataclass subclassing ExperimentConfig, range checks in
                  ``__post_init__``; fields with defaults run with no YAML at all
    run(ctx)      the work: ctx.measure / ctx.measure_rounds / ctx.record / ctx.skip
    check(settings, devices)  refuse (ConfigError) what only the resolved devices can refute,
                  before the job is recorded as running
    METRIC        the column compare and the tables judge it by
    WRITES_PEAKS  it saves measured peaks (results.peaks); later rows get pct_of_peak
    headline(rows) -> lines   the figures that matter, under the job's table (one run's rows)
    progress(row) -> line     its own line as each row is recorded (None: the generic one)
    label(row) -> name        how its table names a row (training: "epoch 3")
    SUMMARY_ROWS  the measurements compare uses by default (training: its one summary row)
    BESIDE        columns compare shows beside the metric (training: test_acc)
    report(rows, samples) -> Section   its section of the report, as data (rows: one preset's,
                  every run; samples: raw sample seconds by row_id, for error bars)
    work(rows) -> line        how much work a timed call did, beside the reference's, where its report
                  hook's setup lines do not say it (first under the job's table)
    COUNTS_INSTRUCTIONS  its parts say their calls as source text (``Part.count``), so
                  ``bench.instructions=true`` counts their instructions (CPU; else refused)

    The book's claims and ``perflab chapter``'s sizes are no hooks: :mod:`perflab.book` holds them.
    """

    Config: type[ExperimentConfig]
    run: Callable[[Context], None]
    check: Optional[Callable[[PerflabConfig, Sequence[Device]], None]] = None
    METRIC: str = "median_s"
    WRITES_PEAKS: bool = False
    headline: Optional[Callable[[Sequence[Row]], Sequence[str]]] = None
    progress: Optional[Callable[[Row], Optional[str]]] = None
    label: Optional[Callable[[Row], str]] = None
    SUMMARY_ROWS: tuple[str, ...] = ()
    BESIDE: tuple[str, ...] = ()
    report: Optional[Callable[[DataFrame, Samples], Section]] = None
    work: Optional[Callable[[Sequence[Row]], str]] = None
    COUNTS_INSTRUCTIONS: bool = False


NAMES = tuple(f.name for f in dataclasses.fields(Hooks))


class Malformed(ValueError):
    """A hook of an experiment module that does not fit the contract: one line, without the module."""


def hooks_of(module: ModuleType) -> Hooks:
    """The module's hooks (what it does not define: the default). Not checked: see :func:`check`."""
    found = {name: getattr(module, name) for name in NAMES if hasattr(module, name)}
    for name in ("SUMMARY_ROWS", "BESIDE"):
        if name in found and isinstance(found[name], list):
            found[name] = tuple(found[name])
    return Hooks(**found)


def check(module: ModuleType) -> Hooks:
    """The module's hooks, each checked against its declared type (raises Malformed)."""
    hints = typing.get_type_hints(Hooks)
    for f in dataclasses.fields(Hooks):
        required = f.default is dataclasses.MISSING
        if not hasattr(module, f.name):
            if required:
                raise Malformed(f"defines no {f.name}; allowed: {_wanted(f.name, hints[f.name])}")
            continue
        value = getattr(module, f.name)
        if value is None and not required:
            continue
        problem = _misfit(value, hints[f.name])
        if problem:
            raise Malformed(f"{f.name} {problem}; allowed: {_wanted(f.name, hints[f.name])}")
    return hooks_of(module)


def _misfit(value: Any, hint: Any) -> str:
    """What is wrong with ``value`` as a ``hint`` ("" if nothing)."""
    hint = _unoptional(hint)
    origin = typing.get_origin(hint)
    if origin is type:  # Config
        base = typing.get_args(hint)[0]
        if not (inspect.isclass(value) and issubclass(value, base) and dataclasses.is_dataclass(value)):
            return f"is {_what(value)}"
        return ""
    if _is_callable(hint):
        if not callable(value):
            return f"is {_what(value)}"
        n = len(typing.get_args(hint)[0])
        try:
            inspect.signature(value).bind(*range(n))
        except TypeError:
            return f"cannot be called with {n} argument{'s' if n != 1 else ''}"
        except ValueError:  # a builtin without a signature: trust it
            return ""
        return ""
    if origin is tuple:
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            return f"is {_what(value)}"
        return ""
    if hint is bool and not isinstance(value, bool):
        return f"is {_what(value)}"
    if hint is str and not (isinstance(value, str) and value):
        return f"is {_what(value)}"
    return ""


def _wanted(name: str, hint: Any) -> str:
    hint = _unoptional(hint)
    if typing.get_origin(hint) is type:
        return "a dataclass subclassing perflab.config.schema.ExperimentConfig"
    if _is_callable(hint):
        n = len(typing.get_args(hint)[0])
        return f"a function of {n} argument{'s' if n != 1 else ''} (perflab.config.contract.Hooks.{name})"
    if typing.get_origin(hint) is tuple:
        return "a tuple of column or measurement names"
    return {bool: "True or False", str: "a column name, e.g. 'median_s'"}.get(hint, str(hint))


def _unoptional(hint: Any) -> Any:
    """``X`` of ``Optional[X]``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _is_callable(hint: Any) -> bool:
    return typing.get_origin(hint) is collections.abc.Callable


def _what(value: Any) -> str:
    if inspect.isclass(value):
        return f"the class {value.__name__}, not a dataclass subclassing ExperimentConfig"
    if inspect.ismodule(value):
        return f"the module {value.__name__}"
    return f"{value!r:.40} ({type(value).__name__})"
