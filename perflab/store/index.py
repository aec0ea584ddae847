"""The index of a results tree: the rows of many run dirs, their raw samples and their operators
in Parquet segments under ``.perflab/index/``, so that loading a big tree reads only what changed,
and only what a reader asks for (one experiment, some columns, the samples of some rows).

A segment is ``<name>.parquet`` (rows, in the types load() gives: the writer's, declared in
:mod:`perflab.store.columns`), a table keyed by row id for each of :data:`KEYED`
(``samples/<name>.parquet``: the raw samples; ``operators/<name>.parquet``: the profiled
operators) and ``<name>.json``, its manifest: which run dirs at which stamps, and each file's size and
footer digest (with Parquet's page checksums, a damaged segment is found and rebuilt from its
run dirs, never read as numbers). Any Parquet reader (pyarrow.dataset, DuckDB) reads them; a run
dir that changed since it was indexed has rows in two segments (its manifests say which is
current)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Collection, Sequence

from perflab.store import columns as known
from perflab.store import files
from perflab.store.layout import OPERATORS
from perflab.store.rows import RESULTS, SAMPLES, Notes, concat, fix_dtypes, read_many
from perflab.store.rundir import RECORD, RunRecord
from perflab.store.tree import NOT_PLAIN, derived_dir, meta, walk

log = logging.getLogger("perflab")


# More index segments than this: the newest are merged into one (_tidy), as many as
# bring them to half this, and more while the next older is no bigger than those merged (a
# tree's big old segment is left alone while new runs come one by one)
MAX_SEGMENTS = 8
# of an index segment (5: rows, samples and operators, each file's size and footer digest); a
# segment of another format (another perflab version: 4 held no operators) is rebuilt
FORMAT = 5
OTHER_FORMAT = "rebuilt {n} index segment{s} written by another perflab version"
DAMAGED = "rebuilt {n} damaged index segment{s}"
Span = tuple[str, str] | None  # the least and greatest row id of rows whose row ids are each there once
Stamps = dict[str, list[int]]  # run dir (relative to the store) -> the stamp _sources gives it
UNWRITTEN = "~unwritten"  # new rows no segment could be written for: ~unwritten-1, ... (sorts after any segment)
SAMPLES_DIR = "samples"  # beside the rows' segments: a glob of *.parquet finds rows alone


@dataclass(frozen=True)
class Keyed:
    """A table each segment keeps beside its rows, keyed by ``row_id``: read from one file of each
    run dir (stamped by _sources: a change reads the run dir again), typed as ``kinds`` declares
    (no reader guesses), each line once by ``key`` (a run dir copied in the tree gives it twice)."""

    name: str  # its folder beside the rows' segments; its file's seal and its notes in the manifest
    file: str  # in each run dir
    kinds: dict[str, known.Kind]
    key: tuple[str, ...]
    required: tuple[str, ...]  # a file without these columns is not perflab's (skipped, said)
    placed: bool  # read back with each line's ``run_dir`` (the samples: without, a column less to read)


SAMPLES_TABLE = Keyed(SAMPLES_DIR, SAMPLES, known.SAMPLES, ("row_id", "phase", "i"), ("row_id", "seconds"), False)
OPERATORS_TABLE = Keyed(
    "operators", OPERATORS, known.OPERATORS, ("row_id", "operator", "kind", "device"), ("row_id", "operator"), True
)
KEYED = (SAMPLES_TABLE, OPERATORS_TABLE)


def _sources(root: Path, notes: Notes | None = None, keyed: bool = True) -> Stamps:
    """Run dir (relative to ``root``) -> stamp: [mtime_ns, size] of its results.csv, of its
    run.json and (``keyed``) of each :data:`KEYED` file (samples.csv, operators.csv; 0, 0 for
    one it lacks), so that a run that ends (run.json: running -> ok) or whose samples or
    operators came after its last row is read again. A load of rows alone stamps no keyed file
    (:data:`ROWS_STAMP`): a change there leaves its rows as they are, and half the system calls
    of the walk are those stats. The same walk as run_dirs(), on its stats (10k run dirs in a
    fraction of a second)."""
    top = os.fspath(root)
    prefix = os.path.join(top, "")  # the walk's paths start with it: cut, not os.path.relpath (10k calls)
    found: Stamps = {}
    for here, stats in walk(top, notes):
        st, rec = stats.get(RESULTS), stats.get(RECORD)
        if st is None:
            continue
        stamp = [st.st_mtime_ns, st.st_size, rec.st_mtime_ns if rec else 0, rec.st_size if rec else 0]
        if keyed:
            stamp += _keyed_stamp(here)
        found[here[len(prefix) :] if here.startswith(prefix) else os.path.relpath(here, top)] = stamp
    return found


ROWS_STAMP = 4  # a stamp's numbers of results.csv and run.json: all a load of rows alone compares


def _keyed_stamp(run_dir: str) -> list[int]:
    """[mtime_ns, size] of each :data:`KEYED` file of a run dir (0, 0 for one it lacks)."""
    base = run_dir if run_dir.endswith(os.sep) else run_dir + os.sep  # not os.path.join: 40k calls at 20k run dirs
    stamp = []
    for t in KEYED:
        try:
            kept = os.stat(base + t.file)
        except OSError:
            stamp += [0, 0]
        else:
            stamp += [kept.st_mtime_ns, kept.st_size]
    return stamp


@dataclass
class Manifest:
    """What a segment's manifest says: the run dirs it holds rows of, at which stamps; what was
    skipped in them when they were read (every later load still says it); the span of its row
    ids if each is there once; its rows; its files' [size, footer digest] (rows, and each keyed
    table); and what was skipped in each keyed table's files (said by a read of that table, not of
    rows)."""

    sources: Stamps
    notes: dict[str, dict[str, int]]
    span: Span = None
    rows: int = 0
    seals: dict[str, list] = field(default_factory=dict)  # "rows" / a Keyed's name -> [bytes, footer's sha256]
    table_notes: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # a Keyed's name -> notes


def _manifest(path: Path) -> Manifest | None:
    """A segment's manifest; None if it is not of this format (or damaged: ValueError,
    OSError); FileNotFoundError if it went meanwhile (a concurrent compaction)."""
    data = json.loads(files.read_regular(path))
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("sources"), dict):
        return None
    noted, ids, rows, seals = data.get("notes"), data.get("row_ids"), data.get("rows"), data.get("files")
    table_notes = data.get("table_notes")
    span: Span = None
    if isinstance(ids, list) and len(ids) == 2 and all(isinstance(x, str) for x in ids):
        span = (ids[0], ids[1])
    if not isinstance(seals, dict) or not all(
        isinstance(seals.get(k), list) and len(seals[k]) == 2 for k in ("rows", *(t.name for t in KEYED))
    ):
        raise ValueError("no sizes and digests of its files")
    if not isinstance(rows, int):
        raise ValueError("no count of its rows")
    return Manifest(
        data["sources"],
        noted if isinstance(noted, dict) else {},
        span,
        rows,
        seals,
        table_notes if isinstance(table_notes, dict) else {},
    )


def _manifests(index: Path) -> tuple[dict[str, Manifest], dict[str, str]]:
    """The index's segments (by name, in the order written) -> their manifests; and those that
    are rebuilt -> why (damaged, or of another format)."""
    manifests: dict[str, Manifest] = {}
    dropped: dict[str, str] = {}
    for path in sorted(index.glob("*.json")) if index.is_dir() else []:
        try:
            found = _manifest(path)
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            found, dropped[path.stem] = None, DAMAGED
        if found is None:
            dropped.setdefault(path.stem, OTHER_FORMAT)
        else:
            manifests[path.stem] = found
    return manifests, dropped


def load_tree(
    root: Path,
    experiment: str | None = None,
    notes: Notes | None = None,
    columns: Collection[str] | None = None,
    kept: dict[str, Any] | None = None,
):
    """Every row under the store ``root`` (optionally of one experiment, and only ``columns``
    and ``run_dir``), through the index, each row id once (the first row of it kept, as load()
    keeps it).

    Run dirs whose results.csv and run.json (with ``kept``, their samples.csv and operators.csv
    too) have not changed since they were indexed come from the Parquet segments (only the row
    groups of ``experiment``, only ``columns``); new or changed ones are read from CSV and added
    as a new segment. A segment that is damaged or of another format is rebuilt from its run
    dirs and removed (``notes`` says so). If the index cannot be written (a read-only tree),
    loading still works, only slower. Every row gets ``run_outcome``: what its run's run.json
    says (``running``: killed, or not ended yet; empty: no run.json).

    ``kept``: this load is kept there (by ``str(root)``) for :func:`samples_after`, which reads
    the samples of its rows without walking the tree again (the index tidied after that).
    """
    notes = notes if notes is not None else Notes()
    load = _begin(Path(root), experiment, columns, notes, None, keyed=kept is not None)  # its samples read next
    df = load.in_full()
    load.tidy = not experiment and columns is None
    if kept is None:
        load.end(tidy=load.tidy)
    else:  # tidied after its samples are read: a merge meanwhile would send them to the CSVs
        load.end(tidy=False)
        load.pieces = {}  # its rows are the frame returned: the samples need none of them
        kept[str(root)] = load
    return df if df.columns.empty else _placed(df, load.root)


def samples_after(
    load: _Load,
    row_ids: Collection[str] | None = None,
    notes: Notes | None = None,
    columns: Sequence[str] | None = None,
    arrow: bool = False,
):
    """load_samples() of the rows a load_tree(kept=...) read (``load``), from the segments that
    load found current: one walk of the tree for its rows and their samples (it was most of a
    second at 20k run dirs, each time)."""
    load.table, load.notes = SAMPLES_TABLE, notes if notes is not None else Notes()
    load.fresh = set()  # what the CSVs read for the rows held in their samples: said from the manifests
    df = load.keyed(row_ids, columns, arrow)
    load.end(tidy=load.tidy)
    return df


def load_samples(
    root: Path,
    row_ids: Collection[str] | None = None,
    notes: Notes | None = None,
    columns: Sequence[str] | None = None,
    arrow: bool = False,
):
    """The raw samples (``row_id``, ``phase``, ``i``, ``seconds``; ``columns``: only those)
    under the store ``root``, through the index: of the rows ``row_ids`` (None: all), in the
    order their segments hold them (``arrow``: as an Arrow table); no samples.csv is parsed but
    those of run dirs not indexed yet."""
    return _load_keyed(Path(root), SAMPLES_TABLE, row_ids, notes, columns, arrow)


def load_operators(root: Path, notes: Notes | None = None):
    """The operators of the profiled rows (the columns of :data:`perflab.store.columns.OPERATORS`,
    then ``run_dir``) under the store ``root``, through the index, in the order their segments
    hold them; no operators.csv is parsed but those of run dirs not indexed yet."""
    return _load_keyed(Path(root), OPERATORS_TABLE, None, notes)


def _load_keyed(
    root: Path,
    table: Keyed,
    row_ids: Collection[str] | None,
    notes: Notes | None,
    columns: Sequence[str] | None = None,
    arrow: bool = False,
):
    """A keyed table of the rows ``row_ids`` (None: all) under the store ``root``, through the index."""
    load = _begin(root, None, None, notes if notes is not None else Notes(), table)
    df = load.keyed(row_ids, columns, arrow)
    load.end(tidy=False)
    return df


def _begin(
    root: Path,
    experiment: str | None,
    columns: Collection[str] | None,
    notes: Notes,
    table: Keyed | None,
    keyed: bool = True,
) -> _Load:
    """A load's state: the tree walked and, beside the walk, its segments' manifests read (and,
    for a load of rows, ``table`` None, their rows); ``keyed``: the run dirs' keyed files stamped
    (not for a load of rows alone: see _sources)."""
    index = meta(root) / "index"
    rows = table is None
    with ThreadPoolExecutor(1) as walker:  # the walk (system calls) beside the decoding (Arrow's threads)
        walking = walker.submit(_sources, root, notes if rows else Notes(), keyed)  # the walk's notes: the rows' to say
        manifests, dropped = _manifests(index)
        keep = None if columns is None else set(columns) | {"_source", "experiment", "row_id"}
        pieces = _pieces(index, manifests, experiment, dropped, keep) if rows else {}
        sources = walking.result()
    return _Load(root, index, experiment, keep, manifests, pieces, dropped, sources, notes, table, keyed)


@dataclass
class _Load:
    """One load's state: the segments (``manifests``: each segment's manifest; ``pieces``: the
    segments read so far, and the new rows as one), the run dirs the walk found (``sources``),
    and which segment holds each one's current rows (``indexed``)."""

    root: Path
    index: Path
    experiment: str | None
    columns: set[str] | None  # the columns read (None: all)
    manifests: dict[str, Manifest]
    pieces: dict[str, list[Any]]  # each segment's Pieces; the new rows: their frame
    dropped: dict[str, str]
    sources: Stamps
    notes: Notes
    table: Keyed | None  # the keyed table read (None: rows): whose skipped lines, files are said
    stamps_keyed: bool  # ``sources`` stamp the keyed files too (else: a load of rows alone, see _sources)
    indexed: dict[str, str] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)  # the run dirs read from CSV now (what was skipped said then)
    unwritten: dict[str, dict[str, Any]] = field(default_factory=dict)  # segments not written (a read-only
    # tree) -> their keyed tables, by name
    removed: set[str] = field(default_factory=set)  # the dropped segments removed (and said) already
    tidy: bool = False  # the index kept small at the end (a load of every row)

    def find(self) -> None:
        """``indexed``: each run dir the walk found -> the newest segment holding it as it is now
        (a segment rebuilt is none); then the run dirs no segment holds are read from CSV and
        added as a new segment (in ``pieces`` too)."""
        self.indexed = {}
        cut = None if self.stamps_keyed else ROWS_STAMP
        for segment, m in self.manifests.items():
            if segment not in self.dropped:
                for source, stamp in m.sources.items():
                    if self.sources.get(source) == stamp[:cut]:  # a later segment's rows of it replace an earlier's
                        self.indexed[source] = segment
        fresh = [s for s in self.sources if s not in self.indexed]
        if fresh:
            self._add(fresh)

    def end(self, tidy: bool) -> None:
        """What was skipped said; the segments found damaged or of another format removed (their
        run dirs were read again); with ``tidy``, the index kept small (_tidy)."""
        t = self.table
        noted = {s for s, m in self.manifests.items() if (m.notes if t is None else m.table_notes.get(t.name))}
        for source, segment in self.indexed.items() if noted else ():  # none noted: 20k run dirs not looked at
            if source in self.fresh or segment not in noted:  # said as it was read, or nothing to say
                continue
            m = self.manifests[segment]
            for kind, count in (m.notes if t is None else m.table_notes.get(t.name, {})).get(source, {}).items():
                self.notes.add(kind, _place(self.root, source, kind) if t is None else _at(self.root, source, t), count)
        for segment, why in self.dropped.items():
            if segment not in self.removed:
                self.notes.add(why, self.index / f"{segment}.parquet")
                _remove_segment(self.index, segment)
                self.removed.add(segment)
        if tidy:
            _tidy(self.index, self.manifests, self.indexed)

    def _add(self, fresh: list[str]) -> None:
        """The rows of run dirs no segment holds, read from CSV and written as a new segment
        with their keyed tables."""
        now, said = Notes(), {t.name: Notes() for t in KEYED}
        # a load of rows alone stamps their keyed files now, before they are read: as a manifest keeps them
        stamps = {
            s: self.sources[s] if self.stamps_keyed else self.sources[s] + _keyed_stamp(os.path.join(self.root, s))
            for s in fresh
        }
        self.fresh.update(fresh)
        new = _read_sources(self.root, fresh, now)
        skipped = {  # each run dir's places looked up only when something was skipped (10k paths otherwise)
            s: {**now.of(_results_of(self.root, s)), **now.of(_place(self.root, s, RECORD_UNREADABLE))}
            if now.kinds
            else {}
            for s in fresh
        }
        if new.empty and not any(skipped.values()):  # no rows (a header alone): read again next time
            return
        new = as_indexed(new) if len(new) else _no_rows()  # no rows, but what was skipped: remembered
        tables = {
            t.name: _read_keyed(self.root, t, fresh, said[t.name]) if len(new) else _keyed(t, None) for t in KEYED
        }
        for kind, places in (now if self.table is None else said[self.table.name]).kinds.items():
            for place, count in places.items():
                self.notes.add(kind, place, count)
        m = Manifest(stamps, {s: k for s, k in skipped.items() if k}, _span(new), len(new))
        for t in KEYED:
            if said[t.name].kinds:
                m.table_notes[t.name] = {s: k for s in fresh if (k := said[t.name].of(_at(self.root, s, t)))}
        unwritten = f"{UNWRITTEN}-{sum(n.startswith(UNWRITTEN) for n in self.manifests)}"  # one name a batch
        name = _write_segment(self.index, new, tables, m) or unwritten
        if name == unwritten:
            self.unwritten[name] = tables
        self.manifests[name] = m
        self.indexed.update(dict.fromkeys(fresh, name))
        if self.experiment:  # its rows (none where the runs name no experiment), its columns all the same
            new = new[(new["experiment"] == self.experiment).to_numpy()] if "experiment" in new else new.iloc[:0]
        if self.columns is not None:
            new = new[[c for c in new.columns if c in self.columns]]
        self.pieces[name] = [new] if m.rows else []  # as a frame: combine joins it as it is

    def read(self, segments: set[str]) -> list[tuple[list[Piece], Span]] | None:
        """The rows of these segments (those not in ``pieces`` read now), in the order written,
        each filtered to the run dirs it holds now, with its span; None if one is gone or
        damaged (then find() again reads its run dirs)."""
        todo = {s: self.manifests[s] for s in segments if s not in self.pieces}
        read = _pieces(self.index, todo, self.experiment, self.dropped, self.columns)
        self.pieces.update(read)
        for segment in todo.keys() - read.keys() - self.dropped.keys():  # gone: merged meanwhile
            del self.manifests[segment]
        if len(read) < len(todo):
            return None
        wanted = _by_segment(self.indexed)
        parts = []
        for segment in sorted(segments):  # in the order written (this load's unwritten last)
            part, keep = self.pieces[segment], wanted.get(segment, set())
            if len(keep) < len(self.manifests[segment].sources):  # run dirs since read again, or gone: out
                part = _only(part, keep)
            parts.append((part, self.manifests[segment].span))
        return parts

    def in_full(self):
        """Every run dir's rows from the segments (and CSV)."""
        import pandas as pd

        self.find()
        while (read := self.read(set(self.indexed.values()))) is None:  # a segment gone or damaged: read again
            self.find()
        pieces = [p for part, _ in read for p in part]
        if not pieces:
            return pd.DataFrame()
        # a part without rows repeats no row id
        return _once(combine(pieces), [span for part, span in read if any(_rows(p) for p in part)])

    def keyed(self, row_ids: Collection[str] | None, columns: Sequence[str] | None = None, arrow: bool = False):
        """The keyed table (``table``: samples, operators) of the current run dirs' rows (of
        ``row_ids``; ``columns``: only those), segment by segment in the order written, with
        ``run_dir`` where the table is ``placed``; a segment gone or damaged: its run dirs read
        again. ``arrow``: the Arrow table as read (no pandas frame of millions of samples)."""
        import pyarrow as pa

        t = self.table
        assert t is not None, "a load of rows has no keyed table to read"
        asked = [*(t.kinds if columns is None else columns), *(["_source"] if t.placed else [])]
        self.find()
        while True:
            tables, held_by = [], sorted(_by_segment(self.indexed).items())
            spans = [self.manifests[segment].span for segment, _ in held_by]
            # the key read only where a line may be there twice (a key column of 4.7M samples: 0.2 s)
            given = asked if _apart(spans) else list(dict.fromkeys([*asked, *t.key]))
            for segment, held in held_by:
                m = self.manifests[segment]
                only = held if len(held) < len(m.sources) else None
                try:
                    if segment in self.unwritten:
                        table = _filtered(self.unwritten[segment][t.name], row_ids, only)
                    else:
                        table = _read_keyed_of(self.index, t, segment, m, row_ids, only, given)
                    tables.append(table.select(given))
                except FileNotFoundError:  # merged meanwhile
                    del self.manifests[segment]
                    break
                except Exception as err:  # damaged: pyarrow raises its own kinds
                    log.debug("index %s %s unreadable (%s): reading its run dirs", t.name, segment, err)
                    self.dropped[segment] = DAMAGED
                    break
            else:
                read = pa.concat_tables(tables) if tables else _keyed(t, None).select(given)
                if not _apart(spans):  # a row id in two run dirs (one copied): its lines kept once
                    twice = read.select(list(t.key)).to_pandas().duplicated(keep="first").to_numpy()
                    read = (read.filter(pa.array(~twice)) if twice.any() else read).select(asked)
                if arrow:
                    return read
                df = read.to_pandas()
                return _with_run_dir(df, self.root) if t.placed else df
            self.find()


def _once(df, spans: list[Span]):
    """``df`` with each row id once (the first row kept); not looked for where the parts' spans
    say none can repeat."""
    if _apart(spans):
        return df
    twice = _twice(df)
    return df[~twice.to_numpy()].reset_index(drop=True) if twice.any() else df


def _pieces(
    index: Path, manifests: dict, experiment: str | None, dropped: dict[str, str], columns: set[str] | None
) -> dict[str, list[Piece]]:
    """Segment -> its rows as read (none: gone, or damaged: then ``dropped`` says so)."""
    pieces: dict[str, list[Piece]] = {}
    for segment, m in manifests.items():
        try:
            with _open_sealed(index / f"{segment}.parquet", m.seals["rows"]) as f:
                pieces[segment] = _read_segment(f, experiment, columns)
        except FileNotFoundError:  # removed by a concurrent compaction: read its run dirs
            pass
        except Exception as err:  # damaged: pyarrow raises its own kinds
            log.debug("index segment %s unreadable (%s): reading its run dirs", segment, err)
            dropped[segment] = DAMAGED
    return pieces


def _open_sealed(path: Path, seal: list) -> BinaryIO:
    """A segment's file, open: a regular file (opened without blocking: a FIFO there never
    blocks the load), of the size and footer digest its manifest wrote (ValueError: damaged)."""
    f = files.open_regular(path)
    try:
        if os.fstat(f.fileno()).st_size != seal[0] or _footer_digest(f) != seal[1]:
            raise ValueError(f"{path}: not the file its manifest describes")
    except BaseException:
        f.close()
        raise
    return f


def _footer_digest(f: BinaryIO) -> str:
    """The sha256 of a Parquet file's footer (its schema, row groups and their statistics: what
    decides which rows are read), from its last bytes; the pages hold checksums of their own."""
    size = f.seek(0, os.SEEK_END)
    if size < 12:
        raise ValueError("too short for Parquet")
    f.seek(size - 8)
    tail = f.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length + 12 > size:
        raise ValueError("no Parquet footer")
    f.seek(size - 8 - length)
    digest = hashlib.sha256(f.read(length + 8)).hexdigest()
    f.seek(0)
    return digest


def _seal(data: bytes) -> list:
    """[size, footer digest] of a Parquet file's bytes, as its manifest keeps them."""
    import io

    return [len(data), _footer_digest(io.BytesIO(data))]


def _checked() -> dict[str, bool]:
    """Parquet's page checksums, verified as read (pyarrow 15 and later, the floor): a byte
    changed inside a page that still parses is caught, not served."""
    return {"page_checksum_verification": True}


SAMPLES_BATCH = 1000  # run dirs whose samples.csv (operators.csv) are parsed together: a frame of text that size


def _read_keyed(root: Path, table: Keyed, sources: list[str], notes: Notes):
    """A keyed table of these run dirs (their samples.csv, operators.csv) as the index keeps it
    (_keyed), parsed a batch of run dirs at a time: only the compact Arrow table grows with the
    tree. A source that is an absolute path is that run dir (else under ``root``)."""
    import pyarrow as pa

    tables = [_keyed(table, None)]
    for at in range(0, len(sources), SAMPLES_BATCH):
        batch = sources[at : at + SAMPLES_BATCH]
        dirs = [Path(s) if Path(s).is_absolute() else root / s for s in batch]
        df = read_files(table, dirs, batch, "_source", notes)
        if "row_id" in df:
            tables.append(_keyed(table, df))
    return pa.concat_tables(tables)


def read_files(table: Keyed, dirs: Sequence[Path], labels: Sequence[str], column: str, notes: Notes):
    """The ``table.file`` (samples.csv, operators.csv) of many run dirs, parsed together
    (rows.read_many; its text columns as text, whatever they look like), each row labelled with
    its dir's label in ``column``. One that is missing or a symlink is not read; one that is not
    a regular file neither, and ``notes`` says so."""
    paths, kept = [], []
    for d, label in zip(dirs, labels):
        path = d / table.file
        kind = files.kind_of(path)
        if kind == "missing" or path.is_symlink():
            continue
        if kind != "a regular file":
            notes.add(NOT_PLAIN, path)
            continue
        paths.append(path)
        kept.append(label)
    text = [c for c, kind in table.kinds.items() if kind == "text"]
    return read_many(paths, kept, column, notes, columns_required=table.required, text=text)


def read_operators(dirs: Sequence[Path], notes: Notes):
    """The operators.csv of these run dirs (not through an index: each parsed), as
    :func:`load_operators` gives them (each line's ``run_dir``: its dir, resolved)."""
    labels = [str(d.resolve()) for d in dirs]  # absolute: no root joined to them
    table = _read_keyed(Path(os.sep), OPERATORS_TABLE, labels, notes)
    return _with_run_dir(table.select([*OPERATORS_TABLE.kinds, "_source"]).to_pandas(), Path(os.sep))


def _keyed(table: Keyed, df):
    """A keyed table as the index keeps it: each line's run dir (``_source``), then the columns
    typed as ``table.kinds`` declares (:data:`perflab.store.columns.SAMPLES`, ``OPERATORS``); text
    as a dictionary (a row's id once, not once a sample: a tenth of the memory)."""
    import pandas as pd
    import pyarrow as pa

    arrow = {"text": pa.dictionary(pa.int32(), pa.string()), "int": pa.int64(), "float": pa.float64()}
    schema = pa.schema([("_source", arrow["text"]), *((c, arrow[k]) for c, k in table.kinds.items())])
    if df is None:
        return schema.empty_table()
    out = {"_source": df["_source"].astype("string").astype("category")}
    for c, kind in table.kinds.items():
        col = df[c] if c in df else pd.Series(None, index=df.index, dtype=object)
        if kind == "text":
            out[c] = col.astype("string").astype("category")
        else:  # a damaged cell reads as missing, not as text
            out[c] = pd.to_numeric(col, errors="coerce").astype("Int64" if kind == "int" else "float64")
    return pa.Table.from_pandas(pd.DataFrame(out), schema=schema, preserve_index=False)


def _filtered(table, row_ids: Collection[str] | None, sources: set[str] | None):
    """The lines of a keyed ``table`` of these rows and run dirs (None: all)."""
    wanted = _wanted(row_ids, sources)
    return table if wanted is None else table.filter(wanted)


def _wanted(row_ids: Collection[str] | None, sources: set[str] | None):
    """The filter of a keyed table's lines of these rows and run dirs (None: all of them)."""
    import pyarrow.dataset as ds

    wanted = None
    for column, values in (("row_id", row_ids), ("_source", sources)):
        if values is not None:
            test = ds.field(column).isin(_text_set(values))
            wanted = test if wanted is None else wanted & test
    return wanted


def _text_set(values: Collection[str]):
    """``values`` once each, as Arrow text (a set to test against: in no order, a sort of 46k row ids saved)."""
    import pyarrow as pa

    return pa.array(list(set(values)), type=pa.string())


def _read_keyed_of(
    index: Path,
    table: Keyed,
    segment: str,
    m: Manifest,
    row_ids,
    sources: set[str] | None,
    columns: Sequence[str] | None = None,
):
    """A segment's keyed table of these rows and run dirs (``columns``: only those, and ``row_id``),
    read through pyarrow.dataset: the run dirs asked for are a filter pushed down to the row
    groups, the rows tested once (``_of_rows``), from the file opened without blocking."""
    import pyarrow.dataset as ds

    options = ds.ParquetFragmentScanOptions(**_checked())
    with _open_sealed(index / table.name / f"{segment}.parquet", m.seals[table.name]) as f:
        fragment = ds.ParquetFileFormat(default_fragment_scan_options=options).make_fragment(f)
        placed = table.placed or sources is not None  # a run dir's name: to filter by, or given
        asked = table.kinds if columns is None else ["row_id", *(c for c in columns if c not in ("row_id", "_source"))]
        read = [*asked, *(["_source"] if placed else [])]
        return _of_rows(fragment.to_table(columns=read, filter=_wanted(None, sources)), row_ids)


def _of_rows(table, row_ids: Collection[str] | None):
    """The lines of a keyed ``table`` of the rows ``row_ids`` (None: all), tested once per row id:
    its row ids as one dictionary (a filter pushed down tests each batch's dictionary against
    them all again: 1 s of a 20k run dir history asking for every row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = table["row_id"]
    if row_ids is None or not len(table) or not pa.types.is_dictionary(column.type):
        return table if row_ids is None else _filtered(table, row_ids, None)
    column = column.unify_dictionaries()
    asked = pc.is_in(column.chunk(0).dictionary, value_set=_text_set(row_ids))
    if pc.all(asked).as_py():  # every row of the segment asked for (history, compare: all the ok rows)
        return table
    return table.filter(pa.chunked_array([pc.take(asked, c.indices) for c in column.chunks], type=pa.bool_()))


def _span(df) -> Span:
    """The span of the rows' row ids if each is there once (None: some row id is there twice, or
    missing): rows of parts whose spans do not overlap hold each row id once, without a look."""
    if "row_id" not in df or not len(df):
        return None
    ids = df["row_id"]
    if ids.isna().any() or ids.duplicated().any():
        return None
    return str(ids.min()), str(ids.max())


def _apart(spans: list[Span]) -> bool:
    """Whether no row id can be in two of the parts these are the spans of, nor twice in one."""
    if any(s is None for s in spans):
        return False
    ordered = sorted(s for s in spans if s is not None)
    return all(a[1] < b[0] for a, b in zip(ordered, ordered[1:]))


def _twice(df):
    """Which rows repeat an earlier row's ``row_id`` (none without the column)."""
    import pandas as pd

    if "row_id" not in df:
        return pd.Series(False, index=df.index)
    return df["row_id"].duplicated(keep="first")


def as_indexed(df):
    """Rows as a segment holds them: in the types load() gives (read back, nothing is converted
    again), each row's run dir (``_source``) a category (one string per run dir, not per row)."""
    df = fix_dtypes(df)
    df["_source"] = df["_source"].astype("category")
    return df


@dataclass
class Piece:
    """Rows of one row group of a segment as read: ``table`` holds the columns read; columns
    its statistics say are empty throughout, or one integer throughout (``constant``), are not
    read at all (a config key of another experiment costs nothing). ``schema``: the segment's
    columns, in order, with pandas' description of each."""

    table: Any
    schema: Any
    constant: dict[str, int] = field(default_factory=dict)

    def whole(self):
        """The piece as one table of every column of its schema."""
        import numpy as np
        import pyarrow as pa

        n, columns = self.table.num_rows, []
        for f in self.schema:
            if f.name in self.table.column_names:
                columns.append(self.table[f.name])
            elif f.name in self.constant:
                columns.append(pa.array(np.full(n, self.constant[f.name]), type=f.type))
            else:
                columns.append(pa.nulls(n, f.type))
        return pa.Table.from_arrays(columns, schema=self.schema)


def _read_segment(source: Any, experiment: str | None, columns: set[str] | None = None) -> list[Piece]:
    """A segment's rows (``source``: its open file), a piece a row group, of one experiment
    (only the row groups whose statistics say they may hold it are read), of ``columns`` (None:
    all). Rows are filtered on each category's values, not on every row's text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(source, **_checked()) as segment:
        meta, schema = segment.metadata, segment.schema_arrow
        if "_source" not in schema.names:
            raise ValueError("no _source column")
        if columns is not None:
            schema = pa.schema([f for f in schema if f.name in columns], metadata=schema.metadata)
        ints = _ints(schema, _described(schema))
        pieces = []
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            stats = {group.column(j).path_in_schema: group.column(j).statistics for j in range(group.num_columns)}
            if experiment and "experiment" in stats and not _may_hold(stats["experiment"], experiment):
                continue
            read, constant = [], {}
            for name in schema.names:
                s = stats.get(name)
                if name in ("_source", "experiment") or s is None or not s.has_null_count:
                    read.append(name)
                elif s.null_count == group.num_rows:
                    continue  # empty throughout: null where it is built
                elif name in ints and s.null_count == 0 and s.has_min_max and s.min == s.max:
                    constant[name] = s.min
                else:
                    read.append(name)
            table = segment.read_row_group(i, columns=read)
            if experiment:
                table = _kept(table, "experiment", {experiment})
            pieces.append(Piece(table, schema, constant))
    return pieces or [Piece(schema.empty_table(), schema)]


def _ints(fields, described: dict[str, dict]) -> set[str]:
    """The columns pandas' description (``described``: by name) says are Int64 (nullable) and
    Arrow holds as int64."""
    import pyarrow as pa

    return {
        f.name for f in fields if described.get(f.name, {}).get("numpy_type") == "Int64" and pa.types.is_int64(f.type)
    }


def _described(schema) -> dict[str, dict]:
    """pandas' description of each column of ``schema``, by name."""
    return {c["name"]: c for c in (schema.pandas_metadata or {}).get("columns", [])}


def _may_hold(stats, value: str) -> bool:
    """Whether a row group may hold ``value`` in a column, by its statistics (no statistics: may)."""
    if stats is None or not stats.has_min_max or not isinstance(stats.min, str) or not isinstance(stats.max, str):
        return True
    return stats.min <= value <= stats.max


def _kept(table, column: str, values: set[str]):
    """The rows of ``table`` whose ``column`` is one of ``values`` (the table itself when all are)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column not in table.column_names:
        return table.slice(0, 0)
    wanted = pa.array(sorted(values), type=pa.large_string())
    masks = []
    for chunk in table[column].chunks:
        if pa.types.is_dictionary(chunk.type):  # one test per category, then spread over the rows
            masks.append(pc.take(pc.is_in(chunk.dictionary.cast(pa.large_string()), value_set=wanted), chunk.indices))
        else:
            masks.append(pc.is_in(chunk.cast(pa.large_string()), value_set=wanted))
    mask = pc.fill_null(pa.chunked_array(masks, type=pa.bool_()), False)
    return table if len(table) == 0 or pc.all(mask).as_py() else table.filter(mask)


def combine(parts):
    """One frame of the rows read, built once: the segments' pieces (and new rows) converted
    to pandas column by column, each value copied once (no table of them all first). Where
    the parts disagree on a column's type (text in one, numbers in another) they are joined
    as rows.concat joins frames."""
    import pyarrow as pa

    try:
        if not any(isinstance(p, Piece) for p in parts):  # all read from CSV now (a cold load): frames already
            raise TypeError("no segment read")
        pieces = [p if isinstance(p, Piece) else _piece(pa.Table.from_pandas(p, preserve_index=False)) for p in parts]
        df = _frame(pieces)
    except (pa.ArrowException, TypeError, ValueError, KeyError) as err:
        log.debug("index rows joined as pandas frames (%s)", err)
        df = concat([p.whole().to_pandas() if isinstance(p, Piece) else p for p in parts])
    return _categories_as_read(df)


def _categories_as_read(df):
    """``df`` with each category column (but ``_source``) as from its values: the categories
    present, sorted (_as_read)."""
    import pandas as pd

    for col in df.columns:
        if isinstance(df[col].dtype, pd.CategoricalDtype) and col != "_source":
            df[col] = _as_read(df[col])
    return df


def _as_read(column):
    """A category column with only the categories present, sorted: recoded only where that
    changes something (a count of each code, not pandas' sort of every row's code)."""
    import numpy as np

    codes = column.cat.codes.to_numpy()
    used = np.bincount(codes[codes >= 0], minlength=len(column.cat.categories)) > 0
    if not used.all():
        column = column.cat.remove_categories(column.cat.categories[~used])
    if not column.cat.categories.is_monotonic_increasing:
        column = column.cat.reorder_categories(column.cat.categories.sort_values())
    return column


def _piece(table) -> Piece:
    return Piece(table, table.schema)


def _frame(pieces: list[Piece]):
    """The pieces as one frame: the first one's columns, then any the others add (rows.concat's
    order), each of one type: where a piece lacks a column, or holds no value in it, it is
    null there. Int64 columns are filled in place, piece by piece (empty or constant ones
    without reading anything); the others go through Arrow's conversion once. A column of two
    types raises ArrowTypeError (then pandas joins the rows)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    fields: dict[str, Any] = {}
    described: dict[str, dict] = {}
    for p in pieces:  # an empty piece (no row of the experiment asked for) still adds its columns
        told = _described(p.schema)
        for f in p.schema:
            if f.name not in fields:
                fields[f.name] = f
                if f.name in told:
                    described[f.name] = told[f.name]
    ints = _ints(fields.values(), described)
    full = [p for p in pieces if p.table.num_rows]  # the pieces that hold rows: an empty one decides nothing
    n = sum(p.table.num_rows for p in full)
    arrays, masked = {}, {}
    # every Int64 column's missing-mask a row of one block: big enough for the kernel's huge pages
    # (a 1 MB mask a column is 256 page faults at 1M rows; 127 columns, ~0.3 s of system time)
    masks = iter(np.ones((len(ints), n), dtype=bool))
    for name, f in fields.items():
        if name in ints:
            masked[name] = _int64(name, full, next(masks))
            continue
        chunks = []
        kind = pa.dictionary(pa.int32(), f.type.value_type) if pa.types.is_dictionary(f.type) else f.type
        for p in full:
            col = p.table[name] if name in p.table.column_names else None
            if col is None and name in p.constant:  # one integer throughout, unread: not of this column's type
                raise pa.ArrowTypeError(f"{name}: int64 and {f.type}")
            if col is None or (col.type != f.type and col.null_count == len(col)):
                chunks.append(pa.nulls(len(p.table), kind))
            elif pa.types.is_dictionary(col.type) and pa.types.is_dictionary(kind):
                # codes of one width (a category holding more values in one piece needs wider codes)
                for c in col.chunks:
                    chunks.append(
                        pa.DictionaryArray.from_arrays(c.indices.cast(pa.int32()), c.dictionary.cast(kind.value_type))
                    )
            elif col.type != f.type:
                raise pa.ArrowTypeError(f"{name}: {col.type} and {f.type}")
            else:
                chunks.extend(col.chunks)
        arrays[name] = pa.chunked_array(chunks, type=kind)
    schema = pa.schema([pa.field(name, a.type) for name, a in arrays.items()])
    meta = {
        "columns": [described[name] for name in arrays if name in described],
        "column_indexes": [],
        "index_columns": [],
    }
    table = pa.Table.from_arrays(
        list(arrays.values()), schema=schema.with_metadata({b"pandas": json.dumps(meta).encode()})
    )
    df = table.to_pandas(split_blocks=True)
    if masked:  # beside the rest (no copy: pandas keeps each column's array), then in the columns' order
        df = pd.concat([df, pd.DataFrame(masked, index=df.index, copy=False)], axis=1)[list(fields)]
    return df


def _int64(name: str, pieces: list[Piece], missing):
    """One Int64 column of the pieces, each value copied once: a piece's constant written as
    such, a piece without the column left missing (nothing read, nothing written). ``missing``:
    its mask, all True, as long as all the pieces together (filled here)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    values = np.zeros(len(missing), dtype=np.int64)  # pages untouched where missing
    at = 0
    for p in pieces:
        rows = p.table.num_rows
        if name in p.constant:
            values[at : at + rows] = p.constant[name]
            missing[at : at + rows] = False
        elif name in p.table.column_names and p.table[name].null_count < rows:
            col = p.table[name]
            if not pa.types.is_int64(col.type):
                raise pa.ArrowTypeError(f"{name}: {col.type} and int64")
            i = at
            for c in col.chunks:
                values[i : i + len(c)] = np.frombuffer(
                    c.buffers()[1], dtype=np.int64, count=len(c), offset=c.offset * 8
                )
                missing[i : i + len(c)] = c.is_null().to_numpy(zero_copy_only=False) if c.null_count else False
                i += len(c)
        at += rows
    return pd.arrays.IntegerArray(values, missing)


def _placed(df, root: Path):
    """The rows with ``run_dir``, where each run dir is now (trees move), for ``_source``."""
    return fix_dtypes(_with_run_dir(df, root))


def _with_run_dir(df, root: Path):
    """``df`` with ``run_dir`` last, where each run dir is now (trees move), for ``_source``."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    base = os.fspath(root.resolve())
    sources = df["_source"].astype("category")
    within = pa.scalar(os.path.join(base, ""), pa.large_string())
    names = pa.array(sources.cat.categories, pa.large_string())  # by Arrow: 20k run dirs a Python loop took 30 ms
    where = pc.if_else(
        pc.starts_with(names, os.sep),
        names,
        pc.binary_join_element_wise(within, names, pa.scalar("", pa.large_string())),
    )
    codes = sources.cat.codes.to_numpy()
    taken = where.take(pa.array(codes, mask=codes < 0))  # Arrow's text, as pandas' str holds it: no string object a row
    run_dir = pd.Series(pd.array(taken, dtype="str"), index=df.index)
    return pd.concat([df.drop(columns=["_source", "run_dir"], errors="ignore"), run_dir.rename("run_dir")], axis=1)


def _at(root: Path, source: str, table: Keyed) -> Path:
    """A run dir's file of a keyed table (its samples.csv, its operators.csv)."""
    return _results_of(root, source).with_name(table.file)


def _results_of(root: Path, source: str) -> Path:
    return (Path(source) if Path(source).is_absolute() else root / source) / RESULTS


def _place(root: Path, source: str, kind: str) -> Path:
    """The file a note of ``kind`` about a run dir names: its run.json, or its results.csv."""
    return _results_of(root, source).with_name(RECORD if kind == RECORD_UNREADABLE else RESULTS)


def _read_sources(root: Path, sources: list[str], notes: Notes):
    """Rows of many run dirs under ``root``, with a ``_source`` column (see read_runs)."""
    dirs = [Path(s) if Path(s).is_absolute() else root / s for s in sources]
    return read_runs(dirs, sources, "_source", notes)


# What every reader of run dirs does with their run.json (one rule: load() through the index or
# run dir by run dir, compare, report, and ``perflab results``, which says the same lines): the
# rows of a run whose run.json is there but unreadable (damaged, or not perflab's) are left out,
# as its listing leaves the run out; a run whose results.csv holds fewer rows than its run.json
# counts (cut short, or damaged) is said to miss them.
RECORD_UNREADABLE = "left out {n} run{s} whose run.json is unreadable (damaged, or not perflab's)"
ROWS_MISSING = "{n} row{s} missing: a results.csv holds fewer rows than its run.json counts (cut short, or damaged)"


def record_of(run_dir: Path, notes: Notes | None = None) -> RunRecord | None:
    """A run dir's record; None if it has none, or an unreadable one (then ``notes`` says so)."""
    record = RunRecord.read(run_dir)
    if record is None and notes is not None and os.path.lexists(run_dir / RECORD):
        notes.add(RECORD_UNREADABLE, run_dir / RECORD)
    return record


def missing_rows(record: RunRecord | None, rows, results: Path, notes: Notes) -> int:
    """How many of the rows ``record`` counts are not among ``rows`` (its run's rows as read);
    said in ``notes`` (place: the results.csv)."""
    have = int((rows["run_id"].astype("string") == record.run_id).sum()) if record and "run_id" in rows else 0
    return count_missing(record, have, results, notes)


def count_missing(record: RunRecord | None, have: int, results: Path, notes: Notes) -> int:
    """How many of the rows ``record`` counts are not among the ``have`` rows of its run that
    were read; said in ``notes`` (place: the results.csv)."""
    if record is None or not record.rows:
        return 0
    if have < record.rows:
        notes.add(ROWS_MISSING, results, count=record.rows - have)
    return max(0, record.rows - have)


def read_runs(dirs: Sequence[Path], labels: Sequence[str], column: str, notes: Notes):
    """The rows of run dirs (rows.read_many), each labelled with its dir's label in ``column``
    and with ``run_outcome``, what its run.json says (``running``: killed, or not ended yet;
    empty: no run.json); the rule above for unreadable records and missing rows. One pass over
    the rows whatever the number of run dirs (each run's rows counted by one value_counts)."""
    records = {label: record_of(d, notes) for label, d in zip(labels, dirs)}
    unreadable = notes.kinds.get(RECORD_UNREADABLE, {})
    kept = [(d, label) for d, label in zip(dirs, labels) if not unreadable or str(d / RECORD) not in unreadable]
    df = read_many([d / RESULTS for d, _ in kept], labels=[label for _, label in kept], column=column, notes=notes)
    have = _rows_per_run(df, column, {label: r.run_id for label, r in records.items() if r and r.rows})
    for d, label in kept:
        count_missing(records[label], have.get(label, 0), d / RESULTS, notes)
    if not df.empty:
        outcomes = {label: r.outcome if r else "" for label, r in records.items()}
        df["run_outcome"] = df[column].map(outcomes).astype("string")
    return df


def _rows_per_run(df, column: str, run_ids: dict[str, str]) -> dict[str, int]:
    """Label -> how many of its rows carry its run's id (``run_ids``: label -> run id)."""
    if df.empty or "run_id" not in df or not run_ids:
        return {}
    own = df["run_id"].astype("string") == df[column].map(run_ids).astype("string")
    return {str(k): int(v) for k, v in df.loc[own.fillna(False).astype(bool), column].value_counts().items()}


def _write_segment(index: Path, df, tables: dict[str, Any], manifest: Manifest) -> str | None:
    """A new immutable segment of ``df`` (rows) and ``tables`` (each Keyed's, by name: an Arrow
    table as _keyed makes it), then its manifest with each file's size and footer digest
    (readers only trust segments with one); its name, None where it could not be written."""
    # named in the order written (to the nanosecond): segments are read, and their rows given, in that order
    ns = time.time_ns()  # one reading: UTC to the second, then its nanoseconds
    name = f"seg-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(ns // 10**9))}-{ns % 10**9:09d}-{secrets.token_hex(4)}"
    m = manifest
    try:
        rows, kept = to_parquet(df), {t.name: _parquet(tables[t.name]) for t in KEYED}
        m.seals = {"rows": _seal(rows), **{table: _seal(data) for table, data in kept.items()}}
        said = {"format": FORMAT, "sources": m.sources, "notes": m.notes, "row_ids": m.span, "rows": m.rows}
        said["table_notes"] = m.table_notes
        for table in kept:
            derived_dir(index / table)  # a file or FIFO where it belongs removed (said), never waited on
        files.write_atomic(index / f"{name}.parquet", rows)
        for table, data in kept.items():
            files.write_atomic(index / table / f"{name}.parquet", data)
        files.write_atomic(index / f"{name}.json", json.dumps({**said, "files": m.seals}))
    except (OSError, ValueError, ImportError) as err:
        log.debug("results index not updated (%s); loading still works", err)
        return None
    return name


def _remove_segment(index: Path, segment: str) -> None:
    """A segment's files (its manifest first: a reader trusts no segment without one)."""
    for path in (index / f"{segment}.json", index / f"{segment}.parquet"):
        _remove(path)
    for t in KEYED:
        _remove(index / t.name / f"{segment}.parquet")


def _remove(path: Path) -> None:
    """A file of the index, or whatever sits where it belongs (it is derived, and ours); a
    symlink there is removed, never what it points to."""
    if not path.is_symlink() and path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _tidy(index: Path, manifests: dict[str, Manifest], indexed: dict[str, str]) -> None:
    """The index kept small: a segment holding no current run dir (each read again since, or
    gone) removed; then, with more than MAX_SEGMENTS left, the newest merged into one holding
    the current rows of the run dirs they hold (``indexed``: run dir -> its segment): as many
    as leave half MAX_SEGMENTS, and more while the next older is no bigger than those merged,
    so that a big old segment is rewritten only once as much was added after it. A reader that
    finds a segment gone meanwhile reads those run dirs from CSV instead. Nothing is done where
    the index cannot be written (each load would decode the segments for nothing)."""
    if not os.access(index, os.W_OK):
        return
    _remove(index / "warm.arrow")  # an earlier version's cache (about the rows' size in memory): read by none
    holds = _by_segment(indexed)
    names = []
    for name in sorted(n for n in manifests if not n.startswith(UNWRITTEN)):
        if name in holds:
            names.append(name)
        else:
            _remove_segment(index, name)
    if len(names) <= MAX_SEGMENTS:
        return
    sizes = [manifests[n].rows for n in names]
    take = 1
    while take < len(names) and (len(names) - take + 1 > MAX_SEGMENTS // 2 or sizes[-take - 1] <= sum(sizes[-take:])):
        take += 1
    merged = names[-take:]
    parts: list[Any] = []
    tables: dict[str, list[Any]] = {t.name: [] for t in KEYED}
    for segment in merged:
        try:
            with _open_sealed(index / f"{segment}.parquet", manifests[segment].seals["rows"]) as f:
                pieces = _read_segment(f, None)
            for t in KEYED:
                tables[t.name].append(_read_keyed_of(index, t, segment, manifests[segment], None, holds[segment]))
        except Exception as err:  # gone or damaged meanwhile: the next load sees to it
            log.debug("index segments not merged (%s)", err)
            return
        parts += _only(pieces, holds[segment])
    df = combine(parts) if any(p.table.num_rows for p in parts) else _no_rows()
    of = {source: manifests[segment] for segment in merged for source in holds[segment]}
    kept = Manifest(
        {source: m.sources[source] for source, m in of.items()},
        {source: m.notes[source] for source, m in of.items() if source in m.notes},
        _span(df),
        len(df),
    )
    for t in KEYED:
        noted = {source: n for source, m in of.items() if (n := m.table_notes.get(t.name, {}).get(source))}
        if noted:
            kept.table_notes[t.name] = noted
    import pyarrow as pa

    if _write_segment(index, df, {name: pa.concat_tables(read) for name, read in tables.items()}, kept):
        for segment in merged:
            _remove_segment(index, segment)


def _no_rows():
    """A segment's frame for run dirs that gave no row (what was skipped in them is remembered)."""
    import pandas as pd

    return pd.DataFrame({"_source": [], "experiment": []}, dtype="string")


def _by_segment(indexed: dict[str, str], but: Collection[str] = ()) -> dict[str, set[str]]:
    """Segment -> the run dirs whose current rows it holds (``indexed``: run dir -> segment),
    but those of ``but``."""
    held: dict[str, set[str]] = {}
    for source, segment in indexed.items():
        if source not in but:
            held.setdefault(segment, set()).add(source)
    return held


def _only(pieces: list[Any], sources: set[str]) -> list[Any]:
    """The pieces' rows of these run dirs (a piece: of a segment, or the new rows' frame)."""
    return [
        Piece(_kept(p.table, "_source", sources), p.schema, p.constant)
        if isinstance(p, Piece)
        else p[p["_source"].isin(sources).to_numpy()]
        for p in pieces
    ]


def _rows(piece) -> int:
    """How many rows a piece holds (of a segment, or the new rows' frame)."""
    return piece.table.num_rows if isinstance(piece, Piece) else len(piece)


MAX_ROW_GROUPS = 256  # a segment's rows in one row group per stretch of one experiment, up to this many


def to_parquet(df) -> bytes:
    """Parquet bytes; object columns that mix types (numbers in one run, text in another) become
    text. Each stretch of rows of one experiment is a row group of its own (rows keep their
    order; run dirs of one experiment share a header, so rows come in few such stretches):
    ``load(experiment=...)`` reads only its own row groups, skipping the rest by their statistics."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    mixed = [
        col
        for col in df.columns
        if df[col].dtype == object
        and pd.api.types.infer_dtype(df[col], skipna=True) not in ("string", "boolean", "empty")
    ]
    if mixed:  # the caller's frame is left as it is
        text = lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v)  # noqa: E731
        df = df.assign(**{c: df[c].map(text) for c in mixed})
    table = pa.Table.from_pandas(df, preserve_index=False)
    starts = [0]
    if "experiment" in df and len(df):
        codes = pd.factorize(df["experiment"])[0]
        starts += list(np.flatnonzero(codes[1:] != codes[:-1]) + 1)
    if len(starts) > MAX_ROW_GROUPS:
        starts = [0]
    return _parquet(table, starts)


SAMPLE_GROUP = 1 << 16  # samples a row group: its statistics let a read of some rows' samples skip the rest


def _parquet(table, starts: Sequence[int] = (0,)) -> bytes:
    """Parquet bytes of an Arrow table, a row group from each of ``starts`` (at most
    SAMPLE_GROUP rows each), with page checksums where this pyarrow writes them."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    # dictionaries for all but floats: a float column (a measurement) seldom repeats a value, and
    # trying a dictionary on it first costs more than the rest of the write
    coded = [f.name for f in table.schema if not pa.types.is_floating(f.type)]
    checks = {"write_page_checksum": True}
    with pq.ParquetWriter(buf, table.schema, use_dictionary=coded, **checks) as writer:
        for start, end in zip(starts, [*starts[1:], table.num_rows]):
            writer.write_table(table.slice(start, end - start), row_group_size=SAMPLE_GROUP)
    return buf.getvalue()
