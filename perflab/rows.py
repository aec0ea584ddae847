"""The row format: tidy CSV, one row per measurement, columns in a stable order.

Writing: every cell on one line (newlines become spaces), so a physical line is a record.
Reading: a torn or malformed line (a short write, binary junk) is skipped and counted, never
fatal to the whole file.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

log = logging.getLogger("perflab")

RESULTS = "results.csv"
SAMPLES = "samples.csv"
SAMPLE_COLUMNS = ("row_id", "run_id", "experiment", "measurement", "phase", "i", "seconds")
STATUSES = ("ok", "skipped", "oom", "error", "timeout", "cancelled")
# The measured figures: numbers, whatever a CSV cell holds.
FIGURE_COLUMNS = (
    *("median_s", "mean_s", "std_s", "min_s", "max_s", "iqr_s", "seconds"),
    *("items_per_s", "tflops", "gbps", "bus_gbps", "mfu", "pct_of_peak", "intensity", "test_acc"),
)
# Read as text even when every value in a file is empty or looks like a number.
TEXT_COLUMNS = (
    "row_id",
    "run_id",
    "sweep_id",
    "config_hash",
    "measurement",
    "error",
    "note",
    "suspect",
    "devices",
    "device_name",
    "fallback",
    "beside",
    "torch",
    "cuda",
    "python",
    "cpu",
    "hostname",
    "git_sha",
    "perflab_version",
    "subject",
    "subject_time",
    "cpu_model",
    "cpu_governor",
    "cpu_boost",
    "kernel",
    "mkl",
    "onednn",
    "cudnn",
    "cuda_driver",
    "gpu_model",
    "gpu_throttle",
    "run_dir",
    "slurm_job_id",
    "slurm_array_task_id",
    "slurm_node",
    "slurm_nodes",
    "log",
    "trace",
    "checkpoint",
    "precision",
)

# Columns that come first, in this order; everything else follows in first-seen order, cfg.* last.
LEADING = [
    "row_id",
    "run_id",
    "sweep_id",
    "job_num",
    "experiment",
    "measurement",
    "repeat",
    "rank",
    "status",
    "error",
    "suspect",
    "note",
    "devices",
    "device_name",
    "fallback",
    "beside",
    "n",
    "median_s",
    "mean_s",
    "std_s",
    "min_s",
    "max_s",
    "iqr_s",
    "noisy",
    "warmup_n",
    "warmup_first_s",
    "timer",
    "calls_per_sample",
    "num_threads",
    "items_per_s",
    "tflops",
    "gbps",
    "pct_of_peak",
    "mfu",
]


def flatten(cfg: Mapping[str, Any], prefix: str = "cfg") -> dict[str, Any]:
    """Every leaf of a nested mapping as ``cfg.a.b`` (lists become JSON text)."""
    out: dict[str, Any] = {}
    for key, value in cfg.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif value is None and prefix == "cfg":
            continue  # a section this experiment does not use (e.g. trainer for matmul)
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(list(value))
        else:
            out[name] = value
    return out


def order_columns(columns: Iterable[str]) -> list[str]:
    columns = list(dict.fromkeys(columns))
    lead = [c for c in LEADING if c in columns]
    cfg = [c for c in columns if c.startswith("cfg.")]
    rest = [c for c in columns if c not in lead and not c.startswith("cfg.")]
    return lead + rest + cfg


def cell(value: Any) -> Any:
    """A value as it goes into a CSV cell: empty for None/NaN, one line for text."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or type(value).__name__ == "NAType":
        return ""
    if isinstance(value, str) and ("\n" in value or "\r" in value):
        return " ".join(value.split())
    return value


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None, header: bool = True) -> str:
    columns = list(columns) if columns is not None else order_columns(c for row in rows for c in row)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="raise", lineterminator="\n")
    if header:
        writer.writeheader()
    for row in rows:
        writer.writerow({k: cell(v) for k, v in row.items()})
    return buf.getvalue()


def header_of(path: Path) -> list[str]:
    """The first line of a CSV file as column names ([] if empty or unreadable as text)."""
    try:
        with path.open(newline="", errors="strict") as f:
            return next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error):
        return []


def read_csv(path: Path, columns_required: Sequence[str] = ("row_id",), text: bool = False):
    """A perflab CSV as a DataFrame; torn or malformed lines are skipped and reported.

    ``df.attrs["skipped_lines"]`` counts them; a file without ``columns_required`` in its
    header is not ours: an empty frame and a warning. ``text=True`` keeps every cell as the
    exact text it was (empty cells as ""), for rewriting a file without changing a digit.
    """
    import pandas as pd

    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
    if not lines:
        return pd.DataFrame()
    header = _fields(lines[0])
    if header is None or not set(columns_required) <= set(header):
        log.warning("%s: not a perflab results file (its header lacks %s); skipped", path, ", ".join(columns_required))
        return pd.DataFrame()
    good, bad = [lines[0]], 0
    for line in lines[1:]:
        fields = _fields(line)
        if fields is not None and len(fields) == len(header) and "\ufffd" not in line and "\x00" not in line:
            good.append(line if line.endswith("\n") else line + "\n")
        elif line.strip():
            bad += 1
    if bad:
        log.warning("%s: skipped %d torn or malformed line%s", path, bad, "s" if bad > 1 else "")
    typed = (
        {"dtype": str, "keep_default_na": False}
        if text
        else {"dtype": {c: "string" for c in TEXT_COLUMNS if c in header}}
    )
    df = pd.read_csv(io.StringIO("".join(good)), low_memory=False, **typed)
    df.attrs["skipped_lines"] = bad
    return df


def read_many(paths: Sequence[Path], labels: Sequence[str], column: str):
    """Many results files at once, each row labelled (``column``) with its file's label.

    Files that share a header are parsed together, in one pass of pandas' C parser: tens of
    thousands of small files load in seconds. A group that does not parse cleanly (a torn or
    malformed line somewhere) falls back to reading its files one by one, line-checked.
    """
    import pandas as pd

    groups: dict[str, list[tuple[str, str, int]]] = {}
    for path, label in zip(paths, labels):
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        header, _, body = text.partition("\n")
        if not body.strip():
            continue
        body = body if body.endswith("\n") else body + "\n"
        groups.setdefault(header, []).append((label, body, body.count("\n")))
    frames = []
    for header, files in groups.items():
        fields = _fields(header) or []
        try:
            df = pd.read_csv(
                io.StringIO(header + "\n" + "".join(b for _, b, _ in files)),
                low_memory=False,
                dtype={c: "string" for c in TEXT_COLUMNS if c in fields},
                skip_blank_lines=False,
            )
            if len(df) != sum(n for *_, n in files) or "\ufffd" in "".join(b for _, b, _ in files):
                raise ValueError("lines and rows differ")
            df[column] = [label for label, _, n in files for _ in range(n)]
        except (ValueError, pd.errors.ParserError):
            by_label = dict(zip(labels, paths))
            parts = [read_csv(by_label[label]).assign(**{column: label}) for label, _, _ in files]
            df = pd.concat([p for p in parts if not p.empty] or [pd.DataFrame()], ignore_index=True, sort=False)
        frames.append(df)
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()


def _fields(line: str) -> list[str] | None:
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return None


def fix_dtypes(df):
    """Types a user expects in pandas: categories, nullable ints and booleans, timestamps."""
    import pandas as pd

    if "timestamp" in df:
        df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601", errors="coerce")
    for col in ("status", "experiment", "timer", "phase"):
        if col in df:
            df[col] = df[col].astype("category")
    for col in ("noisy", "cuda_available", "input_bound"):
        if col in df:
            df[col] = df[col].map({"True": True, "False": False, True: True, False: False}).astype("boolean")
    for col in ("job_num", "rank", "n", "warmup_n", "num_threads", "calls_per_sample", "epoch", "epochs"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in FIGURE_COLUMNS:  # a hand-edited or damaged cell reads as missing, not as text
        if col in df and not pd.api.types.is_numeric_dtype(df[col]):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in TEXT_COLUMNS:
        if col in df and df[col].dtype != "string":
            df[col] = df[col].astype("string")
    return df


def number(v: Any) -> float | None:
    """A cell as a float, or None when it is empty (rows read back from CSV hold text)."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x
