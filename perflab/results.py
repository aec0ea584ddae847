"""Loading results into pandas, and ``perflab results``: past runs, like ``git log``.

perflab results [PATH]            the runs under PATH (default outputs/), newest first
perflab results show RUN          one run's table (RUN: a run id, a prefix, or a path)
perflab results reindex [PATH]    rebuild the derived index (done points, row segments)
perflab results export FILE [PATH] [--parquet]   every row under PATH in one CSV (or Parquet) file
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from perflab.errors import OneLineParser
from perflab.store import done_marks, files, index, tree
from perflab.store.columns import SAMPLES
from perflab.store.rows import (
    OWN_HEADER,
    RESULTS,
    Notes,
    concat,
    csv_text,
    fix_dtypes,
    read_csv,
)
from perflab.store.rundir import RECORD, RunRecord, folder_id, overrides_of, rows_of


def load(*paths: str | os.PathLike, experiment: str | None = None, samples: bool = False):
    """Rows as a pandas DataFrame from CSV files, run dirs, sweep dirs or whole results trees.

    A results tree (``outputs/``) is read through its index (fast at a million rows); other
    folders are read run dir by run dir, following a re-run sweep's references to the runs
    that measured its points earlier. A row found twice is kept once (by ``row_id``, unique
    across machines), so any mix of trees loads without losing or doubling rows. A config key
    some runs lack stays empty there, and an integer key stays integer. Only perflab's own files
    are read; what was skipped or rebuilt (torn lines, foreign files, a damaged index) is said
    in one line per kind (a warning; also ``df.attrs["notes"]``). Rows read from run dirs carry
    ``run_outcome``, their run's outcome from its run.json: ``running`` marks the rows of a run
    that was killed (or has not ended yet). ``samples=True`` loads the raw per-sample times.
    """
    return _load(paths, experiment, samples)


def load_rows(*paths: str | os.PathLike, experiment: str | None = None, columns: Sequence[str] | None = None):
    """load()'s rows with only ``columns`` (and ``row_id``, ``experiment``, ``run_dir``): a
    results tree's index reads no other column, nor another experiment's row groups."""
    return _load(paths, experiment, False, columns)


_SAMPLES = tuple(SAMPLES)  # the columns load_samples gives


def load_samples(
    *paths: str | os.PathLike,
    row_ids: Iterable[str] | None = None,
    kept: dict | None = None,
    columns: Sequence[str] = _SAMPLES,
    arrow: bool = False,
):
    """The raw samples (``row_id``, ``phase``, ``i``, ``seconds``; ``columns``: only those) of
    the rows ``row_ids`` (None: all) under ``paths``, each sample once: a results tree's from
    its index (no samples.csv parsed but those of runs not indexed yet), other folders' from
    their samples.csv. ``kept``: a :class:`Reading`'s loads of the trees' rows (not walked
    again). ``arrow``: as a pyarrow Table (one tree's as its index holds them, no pandas frame
    of millions of samples made)."""
    import pandas as pd
    import pyarrow as pa

    notes = Notes()
    wanted = None if row_ids is None else set(map(str, _listed(row_ids)))
    places = [Path(p) for p in paths or ("outputs",)]
    # one tree's samples come through its index, each there once: with any other place's, kept once here by their key
    indexed = len(places) == 1 and (str(places[0]) in (kept or {}) or (places[0].is_dir() and tree.is_store(places[0])))
    read = list(columns) if indexed else list(_SAMPLES)
    frames = []
    for path in places:
        if kept and str(path) in kept:
            frames.append(index.samples_after(kept.pop(str(path)), wanted, notes, read, arrow and indexed))
        elif path.is_dir() and tree.is_store(path):
            frames.append(index.load_samples(path, wanted, notes, read, arrow and indexed))
        else:
            frames.append(_samples_of(path, wanted, notes))
    notes.say()
    if indexed and len(frames[0]):
        return frames[0]
    df = concat([f for f in frames if len(f)])
    if df.empty:
        df = pd.DataFrame(columns=list(columns))
    else:
        twice = df.duplicated(subset=["row_id", "phase", "i"], keep="first")  # a run dir copied, or two trees
        df = (df[~twice] if twice.any() else df)[list(columns)].reset_index(drop=True)
    return pa.Table.from_pandas(df, preserve_index=False) if arrow else df


def _samples_of(path: Path, wanted: set[str] | None, notes: Notes):
    """The samples of a CSV file, or of the samples.csv of the run dirs under a folder (no index)."""
    if path.is_file():
        df = read_csv(path, ("row_id", "seconds"), notes=notes)
    elif path.is_dir():
        df = read_samples(list(run_dirs(path, Notes())), notes)
    else:
        raise FileNotFoundError(f"no results at {path}")
    if wanted is not None and "row_id" in df:
        df = df[df["row_id"].astype("string").isin(wanted).to_numpy(bool)]
    return df.reindex(columns=list(_SAMPLES))


def _listed(values: Iterable[str]) -> Iterable:
    """``values`` as a list where they are a pandas Series or numpy array (one call, not an
    element at a time: 46k row ids of Arrow text took 0.1 s)."""
    tolist = getattr(values, "tolist", None)
    return tolist() if callable(tolist) else values


def load_operators(*paths: str | os.PathLike):
    """Where each measurement's time went (``bench.profile=true``): the ``operators.csv`` of
    every run dir under ``paths`` in one DataFrame, a line per (row, operator): the row's
    ``row_id``, ``run_id``, ``process``, ``experiment``, ``measurement`` and timed ``median_s``,
    then ``operator``, ``kind`` (op, kernel, range), ``device``, ``calls`` and ``self_s`` per
    measured call, ``share`` of the profiled call (``profiled_s``), and ``run_dir``; sorted by
    ``row_id`` (see perflab.measure.operators.typed). A results tree's come from its index (no
    operators.csv parsed but those of runs not indexed yet), other folders' from their files."""
    from perflab.measure import operators

    notes = Notes()
    frames: list = []
    dirs: list[Path] = []
    for p in paths:
        path = Path(p)
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: {_no_folder(path)}")
        if tree.is_store(path) and not files.not_a_folder(path):
            try:
                frames.append(index.load_operators(path, notes))
                continue
            except OSError as err:  # no permission, a dead mount: the run dirs read themselves, and that said
                notes.add(INDEX_UNREADABLE.replace("{why}", files.os_line(err)), path)
        dirs += list(run_dirs(path))
    if dirs:
        frames.append(operators.read(dirs, notes))
    notes.say()
    return operators.typed(frames)


class Reading:
    """One read of ``paths``: their rows (load()), then the raw samples of some of them
    (load_samples()), a results tree walked once for both (the walk that finds what its index
    lacks was most of a second at 20k run dirs, each time)."""

    def __init__(self, *paths: str | os.PathLike, experiment: str | None = None) -> None:
        self.paths, self.experiment = paths, experiment
        self.kept: dict = {}  # each tree's load of rows, until its samples are read

    def rows(self):
        """load(*paths, experiment=...)."""
        return _load(self.paths, self.experiment, False, kept=self.kept)

    def samples(self, row_ids: Iterable[str] | None = None, columns: Sequence[str] = _SAMPLES, arrow: bool = False):
        """load_samples(*paths, row_ids=..., columns=..., arrow=...), after rows()."""
        return load_samples(*self.paths, row_ids=row_ids, kept=self.kept, columns=columns, arrow=arrow)


def _load(paths, experiment: str | None, samples: bool, columns: Sequence[str] | None = None, kept: dict | None = None):
    """load(), of ``columns`` alone where given (load_rows); ``kept``: a Reading's. pandas is
    imported once needed: a tree's walk (most of a second at 20k run dirs) goes on meanwhile."""
    notes = Notes()
    frames = []
    whole = []  # frames from load_tree: each row id there once already
    for path in map(Path, paths or ("outputs",)):
        if path.is_file():
            frames.append(read_csv(path, ("row_id", "seconds") if samples else OWN_HEADER, notes=notes))
        elif not path.is_dir():
            raise FileNotFoundError(f"no results at {path}")
        elif files.not_a_folder(path):  # no permission, a dead mount: never "no runs"
            raise FileNotFoundError(f"{path}: {files.not_a_folder(path)}")
        elif samples:  # the tree's own notes are said when its rows are loaded
            frames.append(read_samples(list(run_dirs(path, Notes())), notes))
        elif tree.is_store(path) and (indexed := _through_index(path, experiment, notes, columns, kept)) is not None:
            whole.append(indexed)
            frames.append(indexed)
        else:
            dirs = [d for d in run_dirs(path, notes) if (d / RESULTS).is_file() and not (d / RESULTS).is_symlink()]
            frames.append(index.read_runs(dirs, [str(d.resolve()) for d in dirs], "run_dir", notes))
    notes.say()
    frames = [f for f in frames if not f.empty]
    if not frames:
        import pandas as pd

        empty = pd.DataFrame()
        empty.attrs["notes"] = notes.lines()
        return empty
    df = concat(frames)
    key = ["row_id", "phase", "i"] if samples else ["row_id"]
    once = len(frames) == 1 and any(frames[0] is f for f in whole)  # one tree's rows, each row id once
    if all(k in df for k in key) and not once:  # copied only when some row is there twice
        twice = df.duplicated(subset=key, keep="first")
        df = df[~twice] if twice.any() else df
    trees_only = all(any(f is w for w in whole) for f in frames)  # load_tree kept the experiment's rows alone
    if experiment is not None and "experiment" in df and not trees_only:
        mine = (df["experiment"].astype("string") == experiment).fillna(False).astype(bool)
        df = df if mine.all() else df[mine]
    if columns is not None:
        asked = {*columns, "row_id", "experiment", "run_dir"}
        df = df[[c for c in df.columns if c in asked]]
    df = df.reset_index(drop=True)
    df = fix_dtypes(df)
    df.attrs["notes"] = notes.lines()
    return df


INDEX_UNREADABLE = "read {n} tree{s} without its index, which could not be used ({why})"


def _through_index(
    top: Path, experiment: str | None, notes: Notes, columns: Sequence[str] | None = None, kept: dict | None = None
):
    """The tree's rows through its index (only ``columns``, where given), or None where the index
    cannot be read or written (no permission, a dead mount): then the run dirs are read
    themselves, and that is said."""
    try:
        return index.load_tree(top, experiment, notes, columns, kept)
    except OSError as err:
        notes.add(INDEX_UNREADABLE.replace("{why}", files.os_line(err)), top)
        return None


def _no_folder(path: Path) -> str:
    """Why ``path`` is no results tree to read: missing, what sits there instead (a FIFO), or
    a folder this process cannot read (never listed as "no runs")."""
    kind = files.kind_of(path)
    return "no such folder" if kind == "missing" else files.not_a_folder(path) or f"{kind}, not a folder"


def read_samples(dirs: Sequence[Path], notes: Notes):
    """The samples.csv of many run dirs, parsed together (index.read_files)."""
    df = index.read_files(index.SAMPLES_TABLE, dirs, [str(d) for d in dirs], "_file", notes)
    return df.drop(columns="_file", errors="ignore")


def run_dirs(top: Path, notes: Notes | None = None) -> Iterator[Path]:
    """Run dirs under ``top``, and the earlier runs its "done" points stand for (a done point
    writes its record alone: a run dir with rows of its own is read without its record, 20k
    JSON files a report of a nightly history read for nothing)."""
    seen: set[Path] = set()
    for here, found in tree.walk(top, notes):
        d = Path(here)
        record = None if RESULTS in found else RunRecord.read(d)
        target = Path(record.same_as) if record and record.outcome == "done" and record.same_as else d
        if target.resolve() not in seen:
            seen.add(target.resolve())
            yield target


# --- the command line -----------------------------------------------------------------------


def runs(top: Path) -> list[tuple[Path, RunRecord]]:
    return scan(top)


def scan(top: Path, notes: Notes | None = None) -> list[tuple[Path, RunRecord]]:
    """Runs with their records, newest first, in one pass over the tree; a run folder whose
    run.json is there but unreadable is left out, as ``load`` leaves out its rows (``notes``
    says so, in the loader's words)."""
    found = []
    for d in tree.run_dirs(top, notes):
        record = index.record_of(d, notes)
        if record is not None:
            found.append((d, record))
    return sorted(found, key=lambda dr: dr[1].started, reverse=True)


def listing(top: Path, limit: int = 50) -> str:
    """One block per run, newest first: id, when, experiment, outcome and rows (and rows its
    run.json counts that its results.csv lacks), the keys it set, and its headline figure; then
    what was left out, in the loader's words."""
    import pandas as pd

    from perflab.analysis.table import figure

    lines = []
    notes = Notes()
    found = scan(top, notes)
    for run_dir, record in found[:limit]:
        linked = (run_dir / RESULTS).is_symlink()  # not read, as load() reads none (scan's notes say so)
        table = rows_of(run_dir, text=True) if record.outcome != "done" and not linked else None
        rows = table if table is not None else pd.DataFrame()  # cells as text: only a few are looked at
        counts = Counter(rows["status"] if "status" in rows else [None] * len(rows))
        said = [f"{n} {s}" for s, n in counts.items()]
        lost = index.missing_rows(record, table, run_dir / RESULTS, notes) if table is not None else 0
        if lost:
            said.append(f"{lost} of its {record.rows} rows missing")
        outcome = record.outcome + (f" ({', '.join(said)})" if said else "")
        if record.outcome == "done":
            outcome += f" (same as {record.same_as})"
        keys = _set_keys(run_dir)
        metric = metric_of([{"cfg.experiment.name": v} for v in rows.get("cfg.experiment.name", [])])
        ok = rows[rows["status"] == "ok"] if "status" in rows else rows.iloc[:0]
        shown = next(  # the last row with a figure, named: "forward b64: 24.9 ms", never a bare number
            (
                f"{r.get('measurement') or 'figure'}: {f}"
                for _, r in ok.iloc[::-1].iterrows()
                if (f := figure(r, metric))
            ),
            "",
        )
        where = f"sweep {record.sweep_id} #{record.job_num}" if record.sweep_id else "run"
        lines.append(f"{record.run_id}  {record.started.replace('T', ' ')[:19]}  {record.experiment}  {outcome}")
        lines.append(f"    {where}: {run_dir}")
        if keys:
            lines.append(f"    {' '.join(keys)}")
        if shown or record.error:
            lines.append(f"    {shown}{'  ' if shown and record.error else ''}{record.error}")
    lines += notes.lines()
    return "\n".join(lines) if lines else f"no runs under {top}"


def metric_of(rows: list[dict]) -> str:
    """The metric of the experiment (module) these rows came from."""
    from perflab.config import registry

    name = next((str(r["cfg.experiment.name"]) for r in rows if r.get("cfg.experiment.name")), "")
    return registry.get(name).metric if name in registry.names() else "median_s"


def _set_keys(run_dir: Path) -> list[str]:
    return [o for o in overrides_of(run_dir) if not o.startswith(("+experiment=", "hydra."))]


def find_run(ref: str, top: Path) -> Path:
    if not ref:
        raise LookupError("RUN is empty: give a run id (or its start) or a run folder")
    if any((Path(ref) / name).is_file() for name in (RECORD, RESULTS)):
        return Path(ref)
    # a run id or its start, or the run dir's name or the id that ends it (what a job prints)
    matches = [d for d, r in runs(top) if r.run_id.startswith(ref) or ref in (d.name, folder_id(d))]
    if len(matches) != 1:
        raise LookupError(f"{ref}: {'no run' if not matches else f'{len(matches)} runs'} with that id under {top}")
    return matches[0]


def show(run_dir: Path) -> str:
    from perflab.analysis.table import job_table
    from perflab.config import registry

    record = RunRecord.read(run_dir)
    source = Path(record.same_as) if record and record.outcome == "done" and record.same_as else run_dir
    rows = rows_of(source).to_dict("records")
    name = next((str(r["cfg.experiment.name"]) for r in rows if r.get("cfg.experiment.name")), "")
    experiment = registry.get(name) if name in registry.names() else None
    head = f"{record.run_id}  {record.experiment}  {record.outcome}  {run_dir}\n\n" if record else ""
    return head + job_table(
        rows, experiment.headline(rows) if experiment else (), metric_of(rows), experiment.label if experiment else None
    )


def is_export(path: Path) -> bool:
    """A CSV of rows perflab wrote (an earlier export): its header starts with perflab's columns."""
    from perflab.store.rows import header_of, is_ours

    return is_ours(header_of(path))


def export(target: Path, top: Path, parquet: bool = False) -> int:
    allowed = "a new file, or an earlier export (replaced)"
    files.check_replace("FILE", target, _parquet_export if parquet else is_export, allowed)
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
    files.write_atomic(target, index.to_parquet(df))
    return len(df)


def at_least_one(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return int(text)


PROG = "perflab results"  # how its lines start (``python -m perflab.results`` is the same command)


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0])
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
            if not top.is_dir() or files.not_a_folder(top):
                raise LookupError(f"{top}: {_no_folder(top)} (give the results tree)")
            if not tree.is_store(top):  # it would write .perflab/ there and read every run below
                raise LookupError(f"{top}: not a results tree; allowed: a folder holding runs/, sweeps/ or .perflab/")
            for part in ("done", "index"):  # claims stay: they are sweeps running now, not derived
                path = tree.meta(top) / part
                if not path.is_symlink():  # a linked index (another disk) is rebuilt in place; never deleted through
                    tree.remove(path)
            done = done_marks.rebuild_done(top)
            rows = len(index.load_tree(top))
            print(f"reindexed {top}: {done} complete runs, {rows} rows")
        elif words and words[0] == "export" and len(words) >= 2:
            n = export(Path(words[1]), Path(words[2]) if len(words) > 2 else Path("outputs"), args.parquet)
            print(f"{n} rows -> {words[1]}")
        elif words and words[0] in ("show", "export"):
            raise LookupError(f"{words[0]}: needs {'RUN' if words[0] == 'show' else 'FILE'} (see --help)")
        elif len(words) <= 1:
            top = Path(words[0]) if words else Path("outputs")
            if not top.is_dir() or files.not_a_folder(top):
                raise LookupError(f"{top}: {_no_folder(top)} (run an experiment first, or give the results tree)")
            print(listing(top, args.n))
        else:
            parser.error(f"unknown command: {' '.join(words)}")
    except (LookupError, FileNotFoundError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a ConfigError from export's checks, say
        if type(err).__name__ != "ConfigError":
            raise
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
