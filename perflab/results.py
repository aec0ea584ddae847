"""Loading results into pandas, and ``python -m perflab.results``: past runs, like ``git log``.

python -m perflab.results [PATH]            the runs under PATH (default outputs/), newest first
python -m perflab.results show RUN          one run's table (RUN: a run id, a prefix, or a path)
python -m perflab.results reindex [PATH]    rebuild the derived index (done points, row segments)
python -m perflab.results export FILE [PATH] [--parquet]   every row under PATH in one CSV (or Parquet) file
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Iterator, Sequence

from perflab import files, store
from perflab.rows import RESULTS, SAMPLES, csv_text, fix_dtypes, read_csv
from perflab.rundir import RECORD, RunRecord, overrides_of, rows_of


def load(*paths: str | os.PathLike, experiment: str | None = None, samples: bool = False):
    """Rows as a pandas DataFrame from CSV files, run dirs, sweep dirs or whole results trees.

    A results tree (``outputs/``) is read through its index (fast at a million rows); other
    folders are read run dir by run dir, following a re-run sweep's references to the runs
    that measured its points earlier. A row found twice is kept once (by ``row_id``, unique
    across machines), so any mix of trees loads without losing or doubling rows. Torn lines
    are skipped with a warning. ``samples=True`` loads the raw per-sample times instead.
    """
    import pandas as pd

    frames = []
    for path in map(Path, paths or ("outputs",)):
        if path.is_file():
            frames.append(read_csv(path, ("row_id", "seconds") if samples else ("row_id",)))
        elif not path.is_dir():
            raise FileNotFoundError(f"no results at {path}")
        elif samples:
            frames += [read_csv(d / SAMPLES, ("row_id", "seconds")) for d in run_dirs(path) if (d / SAMPLES).is_file()]
        elif store.is_store(path):
            frames.append(store.load_tree(path, experiment))
        else:
            frames += [rows_of(d).assign(run_dir=str(d.resolve())) for d in run_dirs(path) if (d / RESULTS).is_file()]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True, sort=False)
    key = ["row_id", "phase", "i"] if samples else ["row_id"]
    if all(k in df for k in key):
        df = df.drop_duplicates(subset=key, keep="first", ignore_index=True)
    if experiment is not None and "experiment" in df:
        df = df[df["experiment"].astype("string") == experiment].reset_index(drop=True)
    return fix_dtypes(df)


def run_dirs(top: Path) -> Iterator[Path]:
    """Run dirs under ``top``, and the earlier runs its "done" points stand for."""
    seen: set[Path] = set()
    for d in store.run_dirs(top):
        record = RunRecord.read(d)
        target = Path(record.same_as) if record and record.outcome == "done" and record.same_as else d
        if target.resolve() not in seen:
            seen.add(target.resolve())
            yield target


# --- the command line -----------------------------------------------------------------------


def runs(top: Path) -> list[tuple[Path, RunRecord]]:
    return scan(top)[0]


def scan(top: Path) -> tuple[list[tuple[Path, RunRecord]], list[Path]]:
    """(runs with their records, newest first; run folders whose run.json is there but not a
    record perflab can read), in one pass over the tree."""
    found, unreadable = [], []
    for d in store.run_dirs(top):
        record = RunRecord.read(d)
        if record is not None:
            found.append((d, record))
        elif (d / RECORD).exists():
            unreadable.append(d)
    return sorted(found, key=lambda dr: dr[1].started, reverse=True), unreadable


def listing(top: Path, limit: int = 50) -> str:
    """One block per run, newest first: id, when, experiment, outcome and rows, the keys it set,
    and its headline figure."""
    from perflab.table import figure

    lines = []
    found, bad = scan(top)
    for run_dir, record in found[:limit]:
        rows = rows_of(run_dir).to_dict("records") if record.outcome != "done" else []
        counts: dict[str, int] = {}
        for row in rows:
            counts[row.get("status")] = counts.get(row.get("status"), 0) + 1
        outcome = record.outcome + (f" ({', '.join(f'{n} {s}' for s, n in counts.items())})" if counts else "")
        if record.outcome == "done":
            outcome += f" (same as {record.same_as})"
        keys = _set_keys(run_dir)
        metric = metric_of(rows)
        shown = next((figure(r, metric) for r in reversed(rows) if r.get("status") == "ok" and figure(r, metric)), "")
        where = f"sweep {record.sweep_id} #{record.job_num}" if record.sweep_id else "run"
        lines.append(f"{record.run_id}  {record.started.replace('T', ' ')[:19]}  {record.experiment}  {outcome}")
        lines.append(f"    {where}: {run_dir}")
        if keys:
            lines.append(f"    {' '.join(keys)}")
        if shown or record.error:
            lines.append(f"    {shown}{'  ' if shown and record.error else ''}{record.error}")
    if bad:
        shown = ", ".join(str(d) for d in bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        lines.append(f"left out, their run.json unreadable: {shown}")
    return "\n".join(lines) if lines else f"no runs under {top}"


def metric_of(rows: list[dict]) -> str:
    """The metric of the experiment (module) these rows came from."""
    from perflab import registry

    name = next((str(r["cfg.experiment.name"]) for r in rows if r.get("cfg.experiment.name")), "")
    return registry.get(name).metric if name in registry.names() else "median_s"


def _set_keys(run_dir: Path) -> list[str]:
    return [o for o in overrides_of(run_dir) if not o.startswith(("+experiment=", "hydra."))]


def find_run(ref: str, top: Path) -> Path:
    if not ref:
        raise LookupError("RUN is empty: give a run id (or its start) or a run folder")
    if any((Path(ref) / name).is_file() for name in (RECORD, RESULTS)):
        return Path(ref)
    # a run id or its start, or the run dir's name or the short id that ends it (what a job prints)
    matches = [d for d, r in runs(top) if r.run_id.startswith(ref) or ref in (d.name, *_short_ids(d))]
    if len(matches) != 1:
        raise LookupError(f"{ref}: {'no run' if not matches else f'{len(matches)} runs'} with that id under {top}")
    return matches[0]


def _short_ids(run_dir: Path) -> tuple[str, ...]:
    """The random id a run dir's name ends with (``2026-11-23_12-27-14_e7c42e06`` -> ``e7c42e06``)."""
    head, sep, tail = run_dir.name.rpartition("_")
    return (tail,) if sep and head else ()


def show(run_dir: Path) -> str:
    from perflab import registry
    from perflab.table import job_table

    record = RunRecord.read(run_dir)
    source = Path(record.same_as) if record and record.outcome == "done" and record.same_as else run_dir
    rows = rows_of(source).to_dict("records")
    name = next((str(r["cfg.experiment.name"]) for r in rows if r.get("cfg.experiment.name")), "")
    experiment = registry.get(name) if name in registry.names() else None
    head = f"{record.run_id}  {record.experiment}  {record.outcome}  {run_dir}\n\n" if record else ""
    return head + job_table(
        rows, experiment.headline(rows) if experiment else (), metric_of(rows), experiment.label if experiment else None
    )


def export(target: Path, top: Path, parquet: bool = False) -> int:
    allowed = "a new file, or an earlier export (replaced)"
    if files.check_file("FILE", target, allowed):
        with open(files.target(target), "rb") as f:
            ours = _parquet_export(target) if parquet else f.readline().startswith(b"row_id,")
            if not ours:  # not perflab's rows: not ours to replace
                raise LookupError(f"FILE={target}: exists and is not a perflab export; allowed: {allowed}")
    df = load(top)
    if parquet:
        return export_parquet(df, target)
    rows = [{k: v for k, v in r.items() if v is not None} for r in df.to_dict("records")]
    files.write_atomic(target, csv_text(rows))
    return len(rows)


def _parquet_export(path: Path) -> bool:
    """An earlier Parquet export of ours: a Parquet file with perflab's row ids."""
    import pyarrow.parquet as pq

    try:
        return "row_id" in pq.read_schema(files.target(path)).names
    except (OSError, ValueError):
        return False


def export_parquet(df, target: Path) -> int:
    """Every current row (what ``load`` returns: not the index's superseded rows of run dirs
    that changed since, not a row twice) as one Parquet file, typed as ``load`` types them."""
    files.write_atomic(target, store._to_parquet(df))
    return len(df)


def at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perflab.results", description=__doc__.split("\n\n")[0])
    parser.add_argument("words", nargs="*", help="[PATH] | show RUN [PATH] | reindex [PATH] | export FILE [PATH]")
    parser.add_argument("-n", type=at_least_one, default=50, help="how many runs to list (default 50)")
    parser.add_argument("--parquet", action="store_true", help="export: write Parquet instead of CSV")
    args = parser.parse_args(argv)
    words = args.words
    try:
        if words and words[0] == "show" and len(words) >= 2:
            print(show(find_run(words[1], Path(words[2]) if len(words) > 2 else Path("outputs"))))
        elif words and words[0] == "reindex":
            top = Path(words[1]) if len(words) > 1 else Path("outputs")
            if not top.is_dir():
                raise LookupError(f"{top}: no such folder (give the results tree)")
            for part in ("done", "index"):  # claims stay: they are sweeps running now, not derived
                shutil.rmtree(store.meta(top) / part, ignore_errors=True)
            done = store.rebuild_done(top)
            rows = len(store.load_tree(top))
            print(f"reindexed {top}: {done} complete runs, {rows} rows")
        elif words and words[0] == "export" and len(words) >= 2:
            n = export(Path(words[1]), Path(words[2]) if len(words) > 2 else Path("outputs"), args.parquet)
            print(f"{n} rows -> {words[1]}")
        elif words and words[0] in ("show", "export"):
            raise LookupError(f"{words[0]}: needs {'RUN' if words[0] == 'show' else 'FILE'} (see --help)")
        elif len(words) <= 1:
            top = Path(words[0]) if words else Path("outputs")
            if not top.is_dir():
                raise LookupError(f"{top}: no such folder (run an experiment first, or give the results tree)")
            print(listing(top, args.n))
        else:
            parser.error(f"unknown command: {' '.join(words)}")
    except (LookupError, FileNotFoundError) as err:
        print(f"perflab.results: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a ConfigError from export's checks, say
        if type(err).__name__ != "ConfigError":
            raise
        print(f"perflab.results: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
