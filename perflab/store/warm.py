"""The warm cache of a results tree's index: the frame a full load built, kept beside the
segments as one uncompressed Arrow IPC file (``.perflab/index/warm.arrow``) with the stamps of
the run dirs whose rows it holds, so that a later load decodes only the rows of run dirs that
came since. The file is mapped copy-on-write (``mmap.ACCESS_COPY``): each column's pandas
array is a view of the mapping (a page is read when touched, and a write goes to a private
copy of that page, never to the file); Arrow-backed text columns hold the mapping's buffers.

Each column keeps room after its rows (:data:`SPARE`): the rows of run dirs indexed since
(a new run) are written there, in the process's private pages, so a load after a new run
copies no column of the old rows. It is derived, safe to delete, and replaced whole (a new
file renamed over it: a frame still mapping the old one keeps it).

Disk cost: about what the frame holds in memory (1M rows of ~190 columns: ~1.8 GB)."""

from __future__ import annotations

import json
import logging
import mmap
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("perflab")

NAME = "warm.arrow"
VERSION = 3  # of this file's layout (3: keyed by its run dirs' stamps, room after each column)
# Fewer rows than this are not kept: Parquet decodes them in a few tenths of a second (100k rows:
# 0.35 s), and the cache's disk, about the frame's memory, would buy nothing a user notices.
MIN_ROWS = 100_000
# Room after each column's rows for rows of newer run dirs: a 32nd of the rows (1M rows: 31k,
# about 300 runs of 100 rows), at least MIN_ROOM, before the next full load rebuilds the file.
SPARE = 32
MIN_ROOM = 1024
POPULATE_READ = 22  # Linux's MADV_POPULATE_READ (5.14 and later), which Python's mmap module does not name


def _key() -> dict[str, Any]:
    """What the kept frame's types stand on: this perflab, reading into this pandas."""
    import pandas as pd

    from perflab.version import __version__

    return {"version": VERSION, "perflab": __version__, "pandas": pd.__version__}


def write(path: Path, df, sources: dict[str, list[int]], span) -> None:
    """``df`` (load_tree's rows, before their run dirs are placed) as the warm cache, with
    ``sources``: the run dirs whose rows it holds -> their stamps as indexed, and ``span``:
    its row ids' (index._span). Not written (said in the debug log) where it cannot be."""
    import pyarrow as pa

    capacity = len(df) + max(len(df) // SPARE, MIN_ROOM)
    try:
        columns, arrays = [], []
        for name in df.columns:
            kind, parts, extra = _parts(df[name], capacity)
            columns.append({"name": name, "kind": kind, "dtype": str(df[name].dtype), **extra})
            arrays += parts
        meta = {
            "key": _key(),
            "sources": sources,
            "span": span,
            "empty": _empty_by_experiment(df),
            "columns": columns,
            "rows": len(df),
            "capacity": capacity,
        }
        schema = pa.schema([pa.field(str(i), a.type) for i, a in enumerate(arrays)]).with_metadata(
            {b"perflab": json.dumps(meta).encode()}
        )
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with pa.OSFile(os.fspath(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(batch)
            os.replace(tmp, path)  # a new file: a frame mapping the old one keeps it
        finally:
            if tmp.exists():
                tmp.unlink()
    except (OSError, ValueError, TypeError, pa.ArrowException) as err:
        log.debug("warm cache not written (%s); loading still works", err)


def _parts(column, capacity: int) -> tuple[str, list, dict[str, Any]]:
    """How one column is kept: its kind, its Arrow arrays of ``capacity`` rows (its rows, then
    room; each one contiguous buffer where a view is read back), and what else rebuilds it."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    def padded(data, fill=0):
        out = np.empty(capacity, dtype=data.dtype)  # each byte written once
        out[: len(data)], out[len(data) :] = data, fill
        return pa.array(out.view(np.uint8) if out.dtype == bool else out)

    values = column.array
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "fiub":
        return "numpy", [padded(column.to_numpy())], {}
    if isinstance(values, (pd.arrays.IntegerArray, pd.arrays.FloatingArray, pd.arrays.BooleanArray)):
        kind = values.dtype.numpy_dtype
        data = values.to_numpy(dtype=kind, na_value=kind.type(0))
        return "masked", [padded(data), padded(values.isna(), fill=True)], {}
    if isinstance(column.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(column.cat.categories):
        extra = {"categories": [str(c) for c in column.cat.categories], "ordered": bool(column.cat.ordered)}
        return "category", [padded(column.cat.codes.to_numpy(), fill=-1)], extra
    room = capacity - len(column)  # nulls, unused (new text is added as a chunk): one batch holds one length
    if isinstance(values, pd.arrays.ArrowStringArray):
        text = pa.array(values)  # Arrow's own buffers (pandas' __arrow_array__)
        return "arrow", [pa.concat_arrays([*_chunks(text), pa.nulls(room, text.type)])], {}
    if pd.api.types.infer_dtype(column, skipna=True).startswith("mixed"):
        # values of two kinds (the full load joined parts of other types as pandas does): one
        # experiment's rows may have a type of their own, so no cache is kept to take them from
        raise TypeError(f"{column.name} holds values of two kinds")
    other = pa.array(column, from_pandas=True)
    return "other", [pa.concat_arrays([other, pa.nulls(room, other.type)])], {}


def _empty_by_experiment(df) -> dict[str, list[str]]:
    """Experiment -> the columns that hold no value in its rows (most config keys are another
    experiment's): one experiment's load makes them without reading them."""
    import numpy as np
    import pandas as pd

    if "experiment" not in df or not isinstance(df["experiment"].dtype, pd.CategoricalDtype):
        return {}
    codes = df["experiment"].cat.codes.to_numpy().astype(np.intp) + 1  # 0: no experiment
    names = list(df["experiment"].cat.categories)
    empty: dict[str, list[str]] = {name: [] for name in names}
    for col in df.columns:
        held = np.bincount(codes, weights=df[col].notna().to_numpy(), minlength=len(names) + 1)[1:]
        for name, count in zip(names, held):
            if not count:
                empty[name].append(col)
    return empty


def _chunks(array) -> list:
    import pyarrow as pa

    return list(array.chunks) if isinstance(array, pa.ChunkedArray) else [array]


@dataclass
class Cached:
    """A warm cache as mapped: ``frame``, its rows (views of the mapping); ``sources``, the run
    dirs they are of -> their stamps as indexed; ``span``, their row ids' (index._span);
    ``empty``, each experiment's columns that hold no value in its rows."""

    frame: Any
    sources: dict[str, list[int]]
    span: Any
    empty: dict[str, list[str]]  # experiment -> the columns holding no value in its rows
    _room: dict[str, Any]  # column -> its arrays of ``capacity`` rows (a numpy kind's), to add rows in
    _capacity: int
    _map: Any = None  # the mmap

    def prefetch(self, columns) -> None:
        """The pages of these columns (those with room) mapped in one call each, not a page fault
        every 4 KB as they are read: Linux's MADV_POPULATE_READ (5.14 and later; elsewhere a no-op).
        About 0.03 s for all of a 1M-row cache against about 0.1 s of page faults."""
        if self._map is None or not sys.platform.startswith("linux"):
            return
        base = _address(self._map)
        for name in columns:
            for values in self._room.get(name, ()):
                start = values.ctypes.data - base
                aligned = start - start % mmap.PAGESIZE
                try:
                    self._map.madvise(POPULATE_READ, aligned, start + values.nbytes - aligned)
                except (OSError, ValueError):  # an older kernel: read as touched
                    return

    def room(self) -> int:
        """How many rows can still be added."""
        return self._capacity - len(self.frame)

    def extended(self, tail):
        """The cached rows, then ``tail``'s (rows of newer run dirs, as index.combine gives them),
        as one frame, the old rows not copied: each column's new rows are written in the room
        after its rows (private pages). Columns the tail adds come last; a category gains the
        tail's values as categories after its own. None where that is not the frame a full load
        would give (no room left, a column of another type, a missing value where the column
        cannot hold one): then the caller loads in full."""
        import numpy as np
        import pandas as pd

        df, n, k = self.frame, len(self.frame), len(tail)
        if n + k > self._capacity:
            return None
        out: dict[str, Any] = {}
        for name in df.columns:
            mine = df[name]
            theirs = tail[name] if name in tail.columns and tail[name].notna().any() else None
            if theirs is not None and not _same_kind(mine.dtype, theirs.dtype):
                return None
            room = self._room.get(name)
            if isinstance(mine.dtype, pd.CategoricalDtype):
                if room is None or (theirs is not None and not pd.api.types.is_string_dtype(theirs.cat.categories)):
                    return None  # not text (an experiment named 2024, read as a number): as a full load joins it
                extra = [] if theirs is None else theirs.cat.categories.difference(mine.cat.categories, sort=True)
                dtype = pd.CategoricalDtype(mine.cat.categories.append(pd.Index(extra)), ordered=mine.cat.ordered)
                codes, wide = room[0][: n + k], pd.Categorical([], dtype=dtype).codes.dtype  # pandas' for so many
                if wide.itemsize > codes.itemsize:
                    codes = codes.astype(wide)  # more categories than the codes' type holds: copied
                codes[n:] = -1 if theirs is None else pd.Categorical(theirs, dtype=dtype).codes
                out[name] = pd.Categorical.from_codes(codes, dtype=dtype, validate=False)
            elif room is not None and len(room) == 2:  # masked: values, then where missing
                data, missing = room[0][: n + k], room[1][: n + k]
                if theirs is None:
                    missing[n:] = True
                else:
                    data[n:] = theirs.to_numpy(dtype=data.dtype, na_value=data.dtype.type(0))
                    missing[n:] = theirs.isna().to_numpy()
                out[name] = type(mine.array)(data, missing, copy=False)
            elif room is not None:  # numpy: missing only as a float's NaN
                data = room[0][: n + k]
                if theirs is None and data.dtype.kind != "f":
                    return None
                data[n:] = np.nan if theirs is None else theirs.to_numpy(dtype=data.dtype)
                out[name] = data
            else:  # text (Arrow chunks: the old ones kept), or another kind (that column copied)
                added = theirs if theirs is not None else pd.Series(index=range(k), dtype=mine.dtype)
                out[name] = pd.concat([mine, added], ignore_index=True).array
        for name in tail.columns:
            if name not in out:
                added = tail[name]
                if isinstance(added.dtype, np.dtype) and added.dtype.kind in "iub":
                    return None  # no missing value for the old rows
                out[name] = pd.concat([pd.Series(index=range(n), dtype=added.dtype), added], ignore_index=True).array
        return pd.DataFrame(out, copy=False)


def _address(mapped) -> int:
    """Where an mmap starts in memory."""
    import numpy as np

    return int(np.frombuffer(mapped, dtype=np.uint8, count=1).ctypes.data)


def _same_kind(mine, theirs) -> bool:
    """Whether a column of ``theirs`` type joins one of ``mine`` as a full load would join them."""
    import pandas as pd

    if isinstance(mine, pd.CategoricalDtype) or isinstance(theirs, pd.CategoricalDtype):
        return isinstance(mine, pd.CategoricalDtype) and isinstance(theirs, pd.CategoricalDtype)
    return mine == theirs


def read(path: Path) -> Cached | None:
    """The warm cache at ``path``; None when there is none, or one of another perflab, pandas
    or layout. A damaged file raises ValueError (it is rebuilt)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    try:
        with open(path, "rb") as f:
            whole = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (FileNotFoundError, ValueError):  # none, or empty
        return None
    mapped = np.frombuffer(whole, dtype=np.uint8)  # writable: a write goes to a private copy of its page
    try:
        reader = pa.ipc.open_file(pa.py_buffer(mapped))
        meta = json.loads(reader.schema.metadata[b"perflab"])
        if meta.get("key") != _key():
            return None
        if not isinstance(meta.get("sources"), dict):
            raise ValueError("no sources")
        batch = reader.get_batch(0) if reader.num_record_batches == 1 else None
        n, capacity = int(meta["rows"]), int(meta["capacity"])
        if batch is None or batch.num_rows != capacity or not 0 <= n <= capacity:
            raise ValueError("not one batch of the rows it says")
        base = mapped.ctypes.data

        def view(i: int, dtype):
            """Column ``i``'s values, all ``capacity`` of them, as a view of the mapping."""
            buf, size = batch.column(i).buffers()[1], np.dtype(dtype).itemsize
            if batch.column(i).null_count or buf.address < base or buf.address + capacity * size > base + len(mapped):
                raise ValueError("a column outside the file")
            start = buf.address - base + batch.column(i).offset * size
            return np.asarray(mapped[start : start + capacity * size]).view(dtype)

        out, room, i = {}, {}, 0
        for c in meta["columns"]:
            name, kind, dtype = c["name"], c["kind"], pd.api.types.pandas_dtype(c["dtype"])
            if kind == "numpy":
                room[name] = [view(i, dtype)]
                out[name] = room[name][0][:n]
            elif kind == "masked":
                cls = {"b": pd.arrays.BooleanArray, "f": pd.arrays.FloatingArray}.get(
                    dtype.kind, pd.arrays.IntegerArray
                )
                room[name] = [view(i, dtype.numpy_dtype), view(i + 1, bool)]
                out[name] = cls(room[name][0][:n], room[name][1][:n], copy=False)
                i += 1
            elif kind == "category":
                room[name] = [view(i, batch.column(i).type.to_pandas_dtype())]
                kept = pd.CategoricalDtype(c["categories"], ordered=c["ordered"])
                out[name] = pd.Categorical.from_codes(room[name][0][:n], dtype=kept, validate=False)
            elif kind == "arrow":  # the column's own dtype (pandas 3's str, or string): its missing value kept
                out[name] = dtype.__from_arrow__(batch.column(i).slice(0, n))
            else:
                out[name] = batch.column(i).slice(0, n).to_pandas().astype(dtype)
            i += 1
        df = pd.DataFrame(out, copy=False)
    except (pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as err:
        raise ValueError(f"warm cache {path} unreadable: {err}") from err
    bad = [c for c, want in zip(meta["columns"], df.dtypes) if str(want) != c["dtype"]]
    if bad:
        raise ValueError(f"warm cache {path}: {bad[0]['name']} read as another type")
    span, empty = meta.get("span"), meta.get("empty")
    return Cached(
        df,
        meta["sources"],
        tuple(span) if isinstance(span, list) else None,
        empty if isinstance(empty, dict) else {},
        room,
        capacity,
        whole,
    )
