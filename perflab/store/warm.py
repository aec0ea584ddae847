"""The warm cache of a results tree's index: the frame a full load built, kept beside the
segments as one uncompressed Arrow IPC file (``.perflab/index/warm.arrow``), so that the
next load of the same segments decodes nothing. The file is mapped copy-on-write
(``np.memmap`` mode ``c``): each column's pandas array is a view of the mapping (a page is
read when touched, and a write goes to a private copy of that page, never to the file);
Arrow-backed text columns hold the mapping's buffers. It is derived, safe to delete, and
replaced whole (a new file renamed over it: a frame still mapping the old one keeps it).

Disk cost: about what the frame holds in memory (1M rows of ~180 columns: ~1.7 GB)."""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

from perflab.store.tree import folders_unchanged

log = logging.getLogger("perflab")

NAME = "warm.arrow"
VERSION = 2  # of this file's layout (2: the folders it was built on)
# Fewer rows than this are not kept: Parquet decodes them in a few tenths of a second (100k rows:
# 0.35 s), and the cache's disk, about the frame's memory, would buy nothing a user notices.
MIN_ROWS = 100_000


def _key(segments: list[str]) -> str:
    """What the kept frame stands on: these segments, read by this perflab into this pandas."""
    import pandas as pd

    from perflab.version import __version__

    return json.dumps(
        {"version": VERSION, "perflab": __version__, "pandas": pd.__version__, "segments": sorted(segments)}
    )


def write(path: Path, df, segments: list[str], folders: dict[str, list[int]]) -> None:
    """``df`` (load_tree's rows of ``segments``, before their run dirs are placed) as the warm
    cache of those segments, with ``folders``: the folders the walk listed -> their
    tree.folder_stamp (a read checks them before it maps anything); not written for fewer than
    MIN_ROWS rows, nor (said in the debug log) where it cannot be."""
    import pyarrow as pa

    if len(df) < MIN_ROWS:
        return

    try:
        columns, arrays = [], []
        for name in df.columns:
            kind, parts, extra = _parts(df[name])
            columns.append({"name": name, "kind": kind, "dtype": str(df[name].dtype), **extra})
            arrays += parts
        meta = {"key": _key(segments), "folders": folders, "columns": columns, "rows": len(df)}
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


def _parts(column) -> tuple[str, list, dict[str, Any]]:
    """How one column is kept: its kind, its Arrow arrays (each one contiguous buffer where a
    view is read back), and what else rebuilds it."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    values = column.array
    if isinstance(column.dtype, np.dtype) and column.dtype.kind in "fiub":
        data = np.ascontiguousarray(column.to_numpy())
        return "numpy", [pa.array(data.view(np.uint8) if data.dtype == bool else data)], {}
    if isinstance(values, (pd.arrays.IntegerArray, pd.arrays.FloatingArray, pd.arrays.BooleanArray)):
        kind = values.dtype.numpy_dtype
        data = values.to_numpy(dtype=kind, na_value=kind.type(0))  # a copy, written once: reads are views
        mask = values.isna()
        return (
            "masked",
            [pa.array(data.view(np.uint8) if data.dtype == bool else data), pa.array(mask.view(np.uint8))],
            {},
        )
    if isinstance(column.dtype, pd.CategoricalDtype) and pd.api.types.is_string_dtype(column.cat.categories):
        extra = {"categories": [str(c) for c in column.cat.categories], "ordered": bool(column.cat.ordered)}
        return "category", [pa.array(column.cat.codes.to_numpy())], extra
    if isinstance(values, pd.arrays.ArrowStringArray):
        text = pa.array(values)  # Arrow's own buffers (pandas' __arrow_array__)
        return "arrow", [text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text], {}
    return "other", [pa.array(column, from_pandas=True)], {}


def read(path: Path, segments: list[str], root: Path):
    """The frame kept for ``segments``; None when there is none for them, or when a folder of
    ``root`` it was built on changed (an entry came or went there, most likely a run dir: then
    the segments are better decoded beside the walk, which decides). A damaged file raises
    ValueError (it is rebuilt)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    try:
        mapped = np.memmap(path, mode="c")
    except (FileNotFoundError, ValueError):  # none, or empty
        return None
    try:
        reader = pa.ipc.open_file(pa.py_buffer(mapped))
        meta = json.loads(reader.schema.metadata[b"perflab"])
        if meta.get("key") != _key(segments):
            return None
        if not isinstance(meta.get("folders"), dict):
            raise ValueError("no folders")
        if not folders_unchanged(root, meta["folders"]):
            return None
        batch = reader.get_batch(0) if reader.num_record_batches == 1 else None
        n = int(meta["rows"])
        if batch is None or batch.num_rows != n:
            raise ValueError("not one batch of the rows it says")
        base = mapped.ctypes.data

        def view(i: int, dtype):
            buf = batch.column(i).buffers()[1]
            if (
                batch.column(i).null_count
                or buf.address < base
                or buf.address + n * np.dtype(dtype).itemsize > base + len(mapped)
            ):
                raise ValueError("a column outside the file")
            start = buf.address - base + batch.column(i).offset * np.dtype(dtype).itemsize
            return np.asarray(mapped[start : start + n * np.dtype(dtype).itemsize]).view(dtype)

        out, i = {}, 0
        for c in meta["columns"]:
            name, kind, dtype = c["name"], c["kind"], pd.api.types.pandas_dtype(c["dtype"])
            if kind == "numpy":
                out[name] = view(i, dtype)
            elif kind == "masked":
                cls = {"b": pd.arrays.BooleanArray, "f": pd.arrays.FloatingArray}.get(
                    dtype.kind, pd.arrays.IntegerArray
                )
                out[name] = cls(view(i, dtype.numpy_dtype), view(i + 1, bool), copy=False)
                i += 1
            elif kind == "category":
                codes = view(i, batch.column(i).type.to_pandas_dtype())
                kept = pd.CategoricalDtype(c["categories"], ordered=c["ordered"])
                out[name] = pd.Categorical.from_codes(codes, dtype=kept, validate=False)
            elif kind == "arrow":  # the column's own dtype (pandas 3's str, or string): its missing value kept
                out[name] = dtype.__from_arrow__(batch.column(i))
            else:
                out[name] = batch.column(i).to_pandas().astype(dtype)
            i += 1
        df = pd.DataFrame(out, copy=False)
    except (pa.ArrowException, ValueError, TypeError, KeyError, IndexError) as err:
        raise ValueError(f"warm cache {path} unreadable: {err}") from err
    bad = [c for c, want in zip(meta["columns"], df.dtypes) if str(want) != c["dtype"]]
    if bad:
        raise ValueError(f"warm cache {path}: {bad[0]['name']} read as another type")
    return df
