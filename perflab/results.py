"""Result rows: tidy CSV per job (written atomically), a shared ledger (appended under a
file lock), a raw-samples sidecar, ``load()`` into pandas, and the end-of-job table."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from filelock import FileLock

RESULTS = "results.csv"
SAMPLES = "samples.csv"
SAMPLE_COLUMNS = ("row_id", "run_id", "experiment", "measurement", "phase", "i", "seconds")
STATUSES = ("ok", "skipped", "oom", "error", "timeout")
# Read as text even when every value in a file is empty or looks like a number.
TEXT_COLUMNS = ("row_id", "run_id", "sweep_id", "measurement", "error", "note", "devices", "device_name",
                "fallback", "beside", "torch", "cuda", "python", "cpu", "hostname", "git_sha", "perflab_version", "run_dir")

# Columns that come first, in this order; everything else follows in first-seen order.
LEADING = [
    "row_id", "run_id", "sweep_id", "job_num", "experiment", "measurement", "repeat", "rank",
    "status", "error", "note", "devices", "device_name", "fallback", "beside",
    "n", "median_s", "mean_s", "std_s", "min_s", "max_s", "iqr_s", "noisy",
    "warmup_n", "warmup_first_s", "timer", "calls_per_sample", "num_threads",
    "items_per_s", "tflops", "gbps", "pct_of_peak",
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


def _to_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return buf.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ""
    return "" if value is None else value


def write_atomic(path: Path, text: str) -> None:
    """Write via a temp file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    columns = order_columns(c for row in rows for c in row)
    write_atomic(path, _to_text(rows, columns))


def append_to_ledger(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append rows to a CSV shared by many jobs, under a file lock.

    Rows whose columns fit the header are appended; new columns make the ledger be
    rewritten (atomically) with the union header, so one valid CSV survives mixed jobs.
    """
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        header = _header(path)
        new_cols = [c for row in rows for c in row if c not in header]
        if header and not new_cols:
            with path.open("a", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=header, lineterminator="\n")
                for row in rows:
                    writer.writerow({k: _cell(v) for k, v in row.items()})
            return
        old = _read_rows(path) if header else []
        columns = order_columns([*header, *new_cols])
        write_atomic(path, _to_text([*old, *rows], columns))


def _header(path: Path) -> list[str]:
    if not path.exists() or path.stat().st_size == 0:
        return []
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


def _read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


class ResultsWriter:
    """One job's rows. Each ``add`` rewrites the job's CSV atomically, appends the raw samples,
    and appends the row to the ledger: a crash leaves every finished row in all three.

    Rows are kept in memory; the file is read again only if someone else wrote it since our
    last write (a DDP job's rank 0 writes from its own process), so nothing is lost or re-read
    for nothing.
    """

    def __init__(self, run_dir: Path, ledger: Path | None, samples: bool = True) -> None:
        self.run_dir, self.ledger, self.keep_samples = run_dir, ledger, samples
        self._rows: list[dict[str, Any]] = []
        self._stamp: tuple[int, int] | None = None  # (mtime_ns, size) of our last write

    @property
    def rows(self) -> list[dict[str, Any]]:
        path = self.run_dir / RESULTS
        stamp = _stamp(path)
        if stamp != self._stamp:
            self._rows, self._stamp = (_read_rows(path) if stamp else []), stamp
        return self._rows

    def add(self, row: dict[str, Any], samples: Sequence[float] = (), warmup: Sequence[float] = ()) -> dict[str, Any]:
        """Store ``row`` (its ``row_id`` is ``<run_id>#<n>``, n counting this job's rows)."""
        rows = self.rows
        row = {"row_id": f"{row['run_id']}#{len(rows) + 1}", **row}
        rows.append(row)
        path = self.run_dir / RESULTS
        write_csv(path, rows)
        self._stamp = _stamp(path)
        if self.keep_samples and (samples or warmup):
            keys = [row[k] for k in ("row_id", "run_id", "experiment", "measurement")]
            lines = [[*keys, "warmup", i, t] for i, t in enumerate(warmup)]
            lines += [[*keys, "sample", i, t] for i, t in enumerate(samples)]
            _append_lines(self.run_dir / SAMPLES, SAMPLE_COLUMNS, lines)
        if self.ledger is not None:
            append_to_ledger(self.ledger, [row])
        return row


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _append_lines(path: Path, columns: Sequence[str], lines: Sequence[Sequence[Any]]) -> None:
    """Append to a CSV with fixed columns in one write (the header first if the file is new)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    if not path.exists():
        writer.writerow(columns)
    writer.writerows(lines)
    with path.open("a", newline="") as f:
        f.write(buf.getvalue())


def load(*paths: str | os.PathLike, samples: bool = False):
    """Rows as a pandas DataFrame from CSV files, run dirs or whole outputs trees.

    Folders are searched recursively; a row found twice (in a job's file and in the ledger)
    is kept once. ``samples=True`` loads the raw-samples sidecars instead.
    """
    import pandas as pd

    name = SAMPLES if samples else RESULTS
    files: list[Path] = []
    for p in map(Path, paths or ("outputs",)):
        if p.is_dir():
            files += sorted(p.rglob(name))
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"no results at {p}")
    frames = [pd.read_csv(f, low_memory=False, dtype={c: "string" for c in TEXT_COLUMNS})
              for f in files if f.stat().st_size > 0]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True, sort=False)
    key = ["row_id", "phase", "i"] if samples else ["row_id"]
    if all(k in df for k in key):
        df = df.drop_duplicates(subset=key, keep="first", ignore_index=True)
    return _dtypes(df)


def _dtypes(df):
    import pandas as pd

    if "timestamp" in df:
        df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601")
    for col in ("status", "experiment", "timer", "phase"):
        if col in df:
            df[col] = df[col].astype("category")
    for col in ("noisy", "cuda_available"):
        if col in df:
            df[col] = df[col].map({"True": True, "False": False, True: True, False: False}).astype("boolean")
    for col in ("job_num", "rank", "n", "warmup_n", "num_threads", "calls_per_sample"):
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    return df


def summary_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A short fixed-width table of a job's rows for the terminal."""
    header = ["measurement", "status", "n", "median", "iqr", "throughput", "note"]
    lines = [header]
    for r in rows:
        ok = r.get("status") == "ok" and r.get("n")
        label = str(r.get("measurement", ""))
        if _number(r.get("epoch")) is not None:
            label += f" {int(float(r['epoch']))}"
        quality = f"test acc {float(r['test_acc']):.3f}, loss {float(r['train_loss']):.3f}" \
            if _number(r.get("test_acc")) is not None else ""
        lines.append([
            label,
            str(r.get("status", "")) + (" (noisy)" if str(r.get("noisy")) == "True" else ""),
            str(r.get("n", "")) if ok else "",
            human_time(r.get("median_s")) if ok else "",
            human_time(r.get("iqr_s")) if ok else "",
            throughput(r),
            "; ".join(x for x in (quality, str(r.get("error") or r.get("note") or "")) if x)[:80],
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def human_time(s: Any) -> str:
    """Seconds as a short string in s, ms, us or ns ("" for an empty cell)."""
    s = _number(s)
    if s is None:
        return ""
    if s == 0:
        return "0"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def throughput(r: Mapping[str, Any]) -> str:
    """A row's headline rate: TFLOP/s, else GB/s, else items/s."""
    for col, unit in (("tflops", "TFLOP/s"), ("gbps", "GB/s"), ("items_per_s", "items/s")):
        v = _number(r.get(col))
        if v is not None:
            return f"{v:.3g} {unit}"
    return ""


def _number(v: Any) -> float | None:
    """A cell as a float, or None when it is empty (rows read back from CSV hold text)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x
