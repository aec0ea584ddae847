"""Rows as people read them, shared by the report, the plots and the experiments' report hooks:
rows as records (an empty cell absent, a whole number an int), the ok rows, and the runs of a
frame labelled by the config keys that vary between them, written as their values
(``4 devices, batch 512``, never ``devices.count=4, trainer.batch_size=512``)."""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from perflab.config import schema
from perflab.config.schema import MODELS_MODULE, MOVED_MODELS_MODULE
from perflab.store.columns import PER_SAMPLE, RATES
from perflab.store.rows import number

# How a config key reads beside its value; any other key reads "<its last part> <value>"
# ("size 256"), a ``.name`` key as its value alone ("ddp"), a true/false one as "compile" /
# "no compile", one in seconds (``_s``) with its unit ("min time 0.5 s").
WORDS: dict[str, Callable[[Any], str]] = {
    "devices.count": lambda v: f"{v} device{'' if v == 1 else 's'}",
    "devices.spec": str,
    "trainer.batch_size": lambda v: f"batch {v}",
    "trainer.epochs": lambda v: f"{v} epoch{'' if v == 1 else 's'}",
    "trainer.precision": str,
    "trainer.lr": lambda v: f"lr {v}",
    "trainer.lr_rule": lambda v: f"lr rule {v}",
    "trainer.scaling": lambda v: f"{v} scaling",
    "data.train_size": lambda v: f"{v} training items",
    "data.test_size": lambda v: f"{v} test items",
    "model._target_": lambda v: _own_model(str(v)),  # lenet, userpkg.models.SmallCNN
}


def _own_model(target: str) -> str:
    """perflab's own factories by their name alone, wherever a run found them (rows from before
    0.4.0 name perflab.train.models)."""
    for module in (MODELS_MODULE, MOVED_MODELS_MODULE):
        target = target.removeprefix(f"{module}.")
    return target


def missing(v: Any) -> bool:
    if v is None or v is pd.NA or v is pd.NaT:
        return True
    try:
        return isinstance(v, float) and math.isnan(v)
    except TypeError:
        return False


def whole(v: Any) -> Any:
    """A float that is a whole number as an int (a column with empty cells reads back as floats)."""
    if isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(float(v)) < 2**53:
        return int(v)
    return v


def plain_text(v: object) -> str:
    """A cell as text, integers without '.0' (a column read as float in one tree, int in the
    other): how a point's keys and a machine's identity read (``comparison``, ``floor``)."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def text(v: Any) -> str:
    """A cell as text: "" when empty, whole numbers without ``.0``, other floats to 4 digits."""
    if missing(v):
        return ""
    v = whole(v)
    if isinstance(v, (float, np.floating)):
        return f"{v:.4g}"
    return str(v)


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts the way headline() hooks read them: an empty cell is absent, a whole number an int.
    Built a column at a time, and the rows with the same cells filled at once (a cell at a time
    took most of a report of a 100k-row tree)."""
    if df.empty:
        return [{} for _ in range(len(df))]
    columns = [_cells(df[c]) for c in df.columns]
    filled = np.column_stack([present for present, _ in columns])
    alike: dict[bytes, list[int]] = {}  # the rows by which cells they fill
    for i, key in enumerate(np.packbits(filled, axis=1)):
        alike.setdefault(key.tobytes(), []).append(i)
    out: list[dict[str, Any]] = [{}] * len(df)
    for at in alike.values():
        pattern = filled[at[0]]
        keys = [c for c, there in zip(df.columns, pattern) if there]
        picked = [_pick(values, at) for (_, values), there in zip(columns, pattern) if there]
        for i, row in zip(at, zip(*picked) if picked else ((),) * len(at)):
            out[i] = dict(zip(keys, row))
    return out


def _pick(values: list[Any], at: list[int]) -> tuple[Any, ...]:
    """``values`` at the positions ``at``, as a tuple."""
    return tuple(values) if len(at) == len(values) else operator.itemgetter(*at, 0)(values)[:-1]


def _cells(column: pd.Series) -> tuple[np.ndarray, list[Any]]:
    """A column's cells as :func:`records` gives them (:func:`whole` numbers), and which are not
    :func:`missing`."""
    if pd.api.types.is_float_dtype(column.dtype) and not isinstance(column.dtype, pd.CategoricalDtype):
        x = column.to_numpy(float, na_value=np.nan)
        present = ~np.isnan(x)
        values = x.tolist()
        with np.errstate(invalid="ignore"):
            whole_at = np.isfinite(x) & (np.floor(x) == x) & (np.abs(x) < 2**53)
        for i in np.flatnonzero(whole_at).tolist():
            values[i] = int(values[i])
    elif column.dtype == object:  # anything at all: each cell as missing() and whole() say
        values = [whole(v) for v in column.tolist()]
        present = np.array([not missing(v) for v in values], bool)
    else:  # a dtype of its own (Int64, string, boolean, category, datetime): pandas knows its empty cells
        present = column.notna().to_numpy(bool)
        if not present.any():  # another experiment's key: nothing to box
            return present, []
        values = column.tolist()
        if not pd.api.types.is_integer_dtype(column.dtype) and not pd.api.types.is_bool_dtype(column.dtype):
            values = [whole(v) for v in values]
    return present, values


def unit(rows: pd.DataFrame, column: str = "items_unit", default: str = "items") -> str:
    """What the rows' counts count, as they say it (``items_unit``: images, tokens ...;
    ``batch_unit``: what a batch counts): the one unit they share, else ``default``."""
    said = rows[column].dropna().astype("string").unique() if column in rows else []
    return str(said[0]) if len(said) == 1 else default


def ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"].astype("string") == "ok"] if "status" in rows else rows


def measured(rows: pd.DataFrame, prefix: str = "", suffix: str = "") -> pd.DataFrame:
    """The ok rows whose measurement starts with ``prefix`` and ends with ``suffix``."""
    if "measurement" not in rows:
        return rows.iloc[:0]
    names = rows["measurement"].astype("string")
    return ok(rows[(names.str.startswith(prefix) & names.str.endswith(suffix)).fillna(False)])


def varying(rows: pd.DataFrame) -> list[str]:
    """The config keys that say what was measured and differ between these rows (what a sweep swept)."""
    return [c for c in identity_columns(rows) if rows[c].astype("string").nunique(dropna=False) > 1]


def words(key: str, value: Any) -> str:
    """One config key's value as a person says it: ``devices.count`` 4 -> "4 devices"."""
    key = key.removeprefix("cfg.")
    value = whole(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    last = key.rpartition(".")[2]
    if key in WORDS:
        return WORDS[key](value)
    if isinstance(value, bool):
        return last.replace("_", " ") if value else f"no {last.replace('_', ' ')}"
    if last == "name":
        return text(value)
    if last.endswith("_s"):  # seconds: min_time_s 0.5 -> "min time 0.5 s"
        return f"{last.removesuffix('_s').replace('_', ' ')} {text(value)} s"
    return f"{last.replace('_', ' ')} {text(value)}"


def label(keys: Sequence[str], row: Mapping[str, Any]) -> str:
    """The values of ``keys`` in ``row`` as words, a key absent from the row left out."""
    return ", ".join(words(k, row[k]) for k in keys if k in row and not missing(row[k]))


def _order(v: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, before text; empty last."""
    x = number(v)
    if x is not None:
        return (0, x, "")
    return (1 if not missing(v) else 2, 0.0, text(v))


def runs(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The rows run by run (a sweep point by point, in the order of the keys swept), each labelled
    by the keys that vary between runs, and by its device where runs of one label differ in it (a
    run's own mix of devices is in its measurement names); repeats of one point get #1, #2 ...
    One run: ""."""
    return [(name, rows if len(at) == len(rows) else rows.iloc[at]) for name, at in runs_at(rows)]


def runs_at(rows: pd.DataFrame) -> list[tuple[str, list[int]]]:
    """:func:`runs` as each run's positions in ``rows`` (what a reader of :func:`records` of the
    rows converted once takes its runs' records from)."""
    if "run_id" not in rows or rows["run_id"].nunique(dropna=False) <= 1:
        return [("", list(range(len(rows))))]
    keys = varying(rows)
    codes, _ = pd.factorize(rows["run_id"], use_na_sentinel=False)  # runs in the order they first appear
    parts: dict[int, list[int]] = {}
    for i, code in enumerate(codes.tolist()):
        parts.setdefault(code, []).append(i)
    where = rows["device_name"].tolist() if "device_name" in rows else None
    devices = [
        tuple(dict.fromkeys(str(d) for d in (where[i] for i in at) if not missing(d))) if where else ()
        for at in parts.values()
    ]
    values = {k: rows[k].tolist() for k in keys}  # a run's first row, read without building it
    firsts = [{k: values[k][at[0]] for k in keys} for at in parts.values()]
    names = [label(keys, first) for first in firsts]
    seen: dict[str, set[tuple]] = {}
    for name, device in zip(names, devices):
        seen.setdefault(name, set()).add(device)
    by_device = all(len(d) == 1 for d in devices) and any(len(d) > 1 for d in seen.values())
    found: dict[str, list[tuple[tuple, list[int]]]] = {}
    for at, device, name, first in zip(parts.values(), devices, names, firsts):
        if by_device:
            name = ", ".join(x for x in (name, str(device[0])) if x)
        order = tuple(_order(first[k]) for k in keys) + ((str(device[0]),) if by_device else ())
        found.setdefault(name, []).append((order, at))
    out = []
    for name, group in sorted(found.items(), key=lambda item: item[1][0][0]):
        for i, (_, at) in enumerate(group):
            shown = name or "run"
            out.append((f"{shown} #{i + 1}" if len(group) > 1 or not name else shown, at))
    return out


def per_run(rows: pd.DataFrame, value: Callable[[list[dict[str, Any]]], str]) -> str:
    """``value`` of each run's records: "label: value; label: value", or the value once when
    every run has the same."""
    converted = records(rows)  # once, for every run
    found = [(name, v) for name, at in runs_at(rows) if (v := value([converted[i] for i in at]))]
    if len({v for _, v in found}) == 1:
        return found[0][1]
    return "; ".join(f"{name}: {v}" if name else v for name, v in found)


def with_samples(rows: pd.DataFrame, samples: Mapping[str, np.ndarray], metric: str) -> pd.DataFrame:
    """``rows`` with ``_samples``: each row's raw samples as values of ``metric`` (for error bars)."""
    if not samples or rows.empty:
        return rows
    values = [sample_values(samples, r, metric) for r in cells(rows, "row_id", metric, "median_s")]
    out = rows.copy()  # one block per column type again (a loaded tree is fragmented)
    out["_samples"] = values
    return out


# --- which rows are the same point, and their samples ----------------------------------------


def config_column(key: str) -> str:
    """``trainer.batch_size`` -> ``cfg.trainer.batch_size``; plain row columns stay as they are."""
    return key if key.startswith("cfg.") or "." not in key else f"cfg.{key}"


def own_columns(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` without the config keys none of them sets (another experiment's, in a tree of
    several): a hook that boxes every cell of its rows (``to_dict``) boxed them too."""
    empty = [c for c in rows.columns if c.startswith("cfg.") and not rows[c].notna().any()]
    return rows.drop(columns=empty) if empty else rows


def identity_columns(df: pd.DataFrame) -> list[str]:
    """The cfg.* columns that say what was measured (not where results were kept)."""
    volatile = tuple(f"cfg.{k}" for k in schema.volatile_keys())
    return [c for c in df.columns if c.startswith("cfg.") and not c.startswith(volatile) and c != "cfg.experiment.name"]


def device_family(name: object) -> str:
    """A device without a CPU worker's thread count: 'CPU (1 thread)' and 'CPU (2 threads)' are
    the same hardware split differently, not different hardware."""
    return re.sub(r" \(\d+ threads?\)", "", str(name))


def cells(rows: pd.DataFrame, *columns: str) -> list[dict[str, Any]]:
    """Each row as a dict of the ``columns`` it has: what a per-row loop reads, without building
    a Series per row (iterrows took most of a compare of two 100k-row trees)."""
    present = [c for c in dict.fromkeys(columns) if c in rows]
    return [dict(zip(present, values)) for values in zip(*(rows[c].tolist() for c in present))]


# Statistics of a row's seconds whose raw samples are the seconds themselves (the table's
# ``per_sample`` columns; this name for its importers).
PER_SAMPLE_TIMES = PER_SAMPLE


def sample_values(samples: Mapping[str, np.ndarray], row: Mapping[str, Any], metric: str) -> np.ndarray:
    """A row's raw samples as values of ``metric``: seconds for times (a statistic of them:
    median, mean, min, a percentile -- compare tests whether their distribution moved); for
    rates, the rate each sample implies (metric x median / sample seconds)."""
    if not samples or metric not in RATES | PER_SAMPLE_TIMES:
        return np.array([])
    seconds = samples.get(str(row["row_id"]))
    if seconds is None or not len(seconds):
        return np.array([])
    if metric in RATES:
        return float(row[metric]) * float(row["median_s"]) / seconds
    return seconds


# --- reasons several rows give ------------------------------------------------------------------

NUMBER = re.compile(r"(\d+(?:\.\d+)?)")


def reasons(note: str) -> list[str]:
    """A note's reasons (a row's ``suspect`` joins several with "; ")."""
    return [x.strip() for x in note.split("; ") if x.strip()]


def kind(reason: str) -> str:
    """A reason with its figures left out: "others used 83%" and "others used 85%" say the same."""
    return NUMBER.sub("#", reason)


def merged(said: Sequence[str]) -> str:
    """Reasons of one kind said once, each figure that differs between them as its range
    ("other processes used 83 to 85% of the CPUs")."""
    parts = [NUMBER.split(s) for s in said]
    out = list(parts[0])
    for i in range(1, len(out), 2):  # the figures sit at the odd places
        values = sorted({p[i] for p in parts}, key=float)
        if len(values) > 1:
            out[i] = f"{values[0]} to {values[-1]}"
    return "".join(out)


def shared_reasons(notes: Sequence[str]) -> tuple[list[str], list[str]]:
    """The reasons every one of several notes gives, said once (:func:`merged`), and each note
    without them: a reason shared by every row is read once, not on each row."""
    split = [reasons(n) for n in notes]
    if len(split) < 2 or not all(split):
        return [], list(notes)
    every = set.intersection(*({kind(r) for r in rs} for rs in split))
    shared = [
        merged([r for rs in split for r in rs if kind(r) == k])
        for k in dict.fromkeys(kind(r) for r in split[0])
        if k in every
    ]
    return shared, ["; ".join(r for r in rs if kind(r) not in every) for rs in split]
