"""The row format: tidy CSV, one row per measurement, columns in a stable order.

Writing: every cell on one line (newlines become spaces), so a physical line is a record.
Reading: a torn or malformed line (a short write, binary junk) is skipped and counted, never
fatal to the whole file.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from perflab.store import columns, files
from perflab.store.layout import RESULTS as RESULTS  # the tree's names, said once there
from perflab.store.layout import SAMPLES as SAMPLES

log = logging.getLogger("perflab")


SAMPLE_COLUMNS = ("row_id", "run_id", "experiment", "measurement", "phase", "i", "seconds")


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


def order_columns(given: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(given))
    lead = [c for c in columns.LEADING if c in names]
    cfg = [c for c in names if c.startswith("cfg.")]
    rest = [c for c in names if c not in lead and not c.startswith("cfg.")]
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
    """The first line of a CSV file as column names ([] if empty, unreadable as text, or not a
    regular file)."""
    try:
        with files.open_regular(path) as f:
            return next(csv.reader([f.readline().decode("utf-8", errors="strict")]), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return []


# Every file of rows perflab writes (results.csv, samples.csv, sweep.csv, a ledger, an export)
# starts with these columns: a file that does not is someone else's, and is not read.
OWN_HEADER = ("row_id", "run_id")


def is_ours(header: Sequence[str]) -> bool:
    return tuple(header[: len(OWN_HEADER)]) == OWN_HEADER


def cut_header(text: str) -> bool:
    """A file of ours cut short inside its header line: perflab ends every line it writes."""
    own = ",".join(OWN_HEADER)
    return bool(text) and "\n" not in text and (own.startswith(text) or text.startswith(own))


class Notes:
    """What a reader skipped or rebuilt, said as one line per kind (not one per file).

    ``add(kind, place)`` records one occurrence (``count`` for lines); ``lines()`` words
    them: ``skipped 3 torn or malformed lines in 2 files: a/results.csv, b/results.csv``.
    """

    def __init__(self) -> None:
        self.kinds: dict[str, dict[str, int]] = {}  # kind -> place -> count

    def add(self, kind: str, place: object, count: int = 1) -> None:
        places = self.kinds.setdefault(kind, {})
        places[str(place)] = places.get(str(place), 0) + count

    def of(self, place: object) -> dict[str, int]:
        """What was noted about one place: kind -> count."""
        return {kind: places[str(place)] for kind, places in self.kinds.items() if str(place) in places}

    def lines(self) -> list[str]:
        out = []
        for kind, places in self.kinds.items():
            n, shown = sum(places.values()), list(places)
            listed = ", ".join(shown[:3]) + (f" (+{len(shown) - 3} more)" if len(shown) > 3 else "")
            out.append(kind.format(n=n, s="" if n == 1 else "s") + f": {listed}")
        return out

    def say(self, who: str = "reading results") -> None:
        for line in self.lines():
            log.warning("%s: %s", who, line)


TORN = "skipped {n} torn or malformed line{s}"
UNREADABLE = "skipped {n} file{s} that could not be read ({why})"
FOREIGN = "skipped {n} file{s} that perflab did not write (no row_id,run_id header)"


def read_csv(
    path: Path,
    columns_required: Sequence[str] = OWN_HEADER,
    text: bool = False,
    notes: Notes | None = None,
    as_text: Sequence[str] = (),
):
    """A perflab CSV as a DataFrame; torn or malformed lines are skipped and reported.

    ``df.attrs["skipped_lines"]`` counts them; a file whose header does not start with
    perflab's own columns (and has ``columns_required``) is not ours: an empty frame, and a
    note. A last line without its newline is torn (perflab ends every line it writes).
    ``text=True`` keeps every cell as the exact text it was (empty cells as ""), for rewriting
    a file without changing a digit. ``notes``: where to say what was skipped (default: a
    warning per file). ``as_text``: more columns read as text (``_text_dtypes``).
    """
    import pandas as pd

    own = notes if notes is not None else Notes()
    lines = files.read_regular(path).decode("utf-8", errors="replace").splitlines(keepends=True)
    if not lines:
        return pd.DataFrame()
    cut = cut_header(lines[0])
    header = None if cut else _fields(lines[0])
    if header is None or not is_ours(header) or not set(columns_required) <= set(header):
        own.add(TORN if cut else FOREIGN, path)
        if notes is None:
            own.say()
        return pd.DataFrame()
    good, bad = [lines[0]], 0
    for i, line in enumerate(lines[1:], start=1):
        fields = _fields(line)
        torn = i == len(lines) - 1 and not line.endswith("\n")
        clean = "\ufffd" not in line and "\x00" not in line
        if not torn and clean and fields is not None and len(fields) == len(header):
            good.append(line)
        elif line.strip():
            bad += 1
    if bad:
        own.add(TORN, path, count=bad)
        if notes is None:
            own.say()
    if text:
        df = pd.read_csv(io.StringIO("".join(good)), low_memory=False, dtype=str, keep_default_na=False)
    else:
        dtype = _text_dtypes(header, as_text)
        df = type_config(pd.read_csv(io.StringIO("".join(good)), low_memory=False, dtype=dtype))
    df.attrs["skipped_lines"] = bad
    return df


def _text_dtypes(header: Sequence[str], as_text: Sequence[str] = ()) -> dict[str, str]:
    """Columns parsed as text: the text columns, the config keys (typed from their text by
    type_config, so that an integer key with empty cells stays an integer) and ``as_text``
    (a file's own text columns: a process number with gaps read as 1, not 1.0)."""
    return {c: "string" for c in header if c in columns.TEXT or c.startswith("cfg.") or c in as_text}


def read_many(
    paths: Sequence[Path],
    labels: Sequence[str],
    column: str,
    notes: Notes | None = None,
    columns_required: Sequence[str] = OWN_HEADER,
    text: Sequence[str] = (),
):
    """Many results (or samples, operators) files at once, each row labelled (``column``) with its file's label.

    Files that share a header are parsed together, from their bytes, in one pass (``_parsed``:
    Arrow's CSV reader for most columns, pandas' C parser for the rest): tens of thousands of
    small files load in seconds. A group that does not parse cleanly (a torn or
    malformed line somewhere) falls back to reading its files one by one, line-checked. A file
    without perflab's header (or without ``columns_required``) is skipped, and a torn last line
    dropped (``notes`` says so). ``text``: columns read as text besides perflab's own (``_text_dtypes``).
    """
    import numpy as np
    import pandas as pd

    notes = notes if notes is not None else Notes()
    groups: dict[str, list[tuple[str, bytes, int]]] = {}  # kept as bytes: pandas parses them without a re-encoding
    by_label = dict(zip(labels, paths))
    for path, label in zip(paths, labels):
        try:
            data = files.read_regular(path)
        except FileNotFoundError:  # removed since the walk found it
            continue
        except OSError as err:  # a directory where the file belongs, an I/O error
            notes.add(UNREADABLE.replace("{why}", err.strerror or type(err).__name__), path)
            continue
        first, ended, body = data.partition(b"\n")  # a newline byte is never inside a UTF-8 character
        header = first.decode("utf-8", errors="replace")
        if not ended and cut_header(header):
            notes.add(TORN, path)
            continue
        fields = _fields(header) or []
        if not is_ours(fields) or not set(columns_required) <= set(fields):
            if data.decode("utf-8", errors="replace").strip():
                notes.add(FOREIGN, path)
            continue
        if body and not body.endswith(b"\n"):  # perflab ends every line: this one was cut short
            body, _, torn = body.rpartition(b"\n")
            body = body + b"\n" if body else b""
            notes.add(TORN, path)
        if _blank(body):
            continue
        groups.setdefault(header, []).append((label, body, body.count(b"\n")))
    frames = []
    for header, parts in groups.items():
        fields = _fields(header) or []
        try:
            if any(not b.isascii() and "\ufffd" in b.decode("utf-8", errors="replace") for _, b, _ in parts):
                raise ValueError("undecodable bytes")
            joined = b"".join([(header + "\n").encode(), *(b for _, b, _ in parts)])  # the group's one copy
            df = _parsed(io.BytesIO(joined), fields, text)
            if len(df) != sum(n for *_, n in parts):
                raise ValueError("lines and rows differ")
            df = type_config(df)
            df[column] = np.repeat(np.array([label for label, _, _ in parts], dtype=object), [n for *_, n in parts])
        except (ValueError, pd.errors.ParserError):
            each = [
                read_csv(by_label[label], columns_required, notes=notes, as_text=text).assign(**{column: label})
                for label, _, _ in parts
            ]
            df = concat([p for p in each if not p.empty])
        frames.append(df)
    return concat(frames)


def _parsed(data: io.BytesIO, fields: list[str], as_text: Sequence[str] = ()):
    """A group's rows as pandas' C parser reads them (``_text_dtypes``, blank lines as rows),
    most columns parsed by Arrow's CSV reader instead (several times faster on numbers): text
    and config keys, and the columns it reads as pandas would (integers without gaps, floats,
    booleans without gaps, empty throughout), and timestamps as text (pandas' own text type, where
    a ':' somewhere makes the column text to pandas too); pandas parses the rest (text perflab does
    not know, timestamps without a ':') from the same bytes. A file Arrow cannot parse (a short
    line, a blank one) is pandas' alone."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    from pandas._libs.parsers import STR_NA_VALUES  # what pandas reads as missing: Arrow is told the same

    text = _text_dtypes(fields, as_text)
    stamps = [c for c in fields if c == "timestamp"]  # read as text: pandas' own type, if text to pandas too
    try:
        if len(set(fields)) != len(fields) or not all(fields):  # pandas renames these: its own names
            raise ValueError("names pandas would change")
        table = pacsv.read_csv(
            data,
            read_options=pacsv.ReadOptions(use_threads=False),  # two threads: twice the CPU, no less time
            parse_options=pacsv.ParseOptions(ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in [*text, *stamps]},
                null_values=sorted(STR_NA_VALUES),
                true_values=["True", "TRUE", "true"],
                false_values=["False", "FALSE", "false"],
                strings_can_be_null=True,
            ),
        )
        if table.column_names != fields:
            raise ValueError("names differ")
    except (pa.ArrowInvalid, ValueError):
        data.seek(0)
        return pd.read_csv(data, low_memory=False, dtype=text, skip_blank_lines=False)
    columns: dict[str, Any] = {}
    for name, column in zip(table.column_names, table.columns):
        kind = column.type
        if name in text:
            columns[name] = pd.api.types.pandas_dtype("string").__from_arrow__(column)
        elif name in stamps and pa.types.is_string(kind) and pc.any(pc.match_substring(column, ":")).as_py():
            columns[name] = _as_pandas_text(column)
        elif pa.types.is_null(kind):
            columns[name] = np.full(len(column), np.nan)
        elif (pa.types.is_floating(kind) and _exact_floats() and not _unsigned(column)) or (
            pa.types.is_integer(kind) and column.null_count
        ):
            columns[name] = column.to_numpy().astype("float64")  # an integer column with gaps: floats, as in pandas
        elif (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and not column.null_count:
            columns[name] = column.to_numpy().copy()  # writable, as pandas' own
    rest = [c for c in fields if c not in columns]
    if rest:
        data.seek(0)
        others = pd.read_csv(data, low_memory=False, usecols=rest, dtype=text, skip_blank_lines=False)
        columns.update({c: others[c] for c in rest})
    return pd.DataFrame({c: columns[c] for c in fields}, copy=False)  # fresh arrays: no copy of them


def _as_pandas_text(column):
    """A column Arrow read as text, as pandas' C parser reads a column of text (its default
    text type: ``str`` in pandas 3, Python strings with NaN for empty cells in pandas 2)."""
    import numpy as np

    kind = _default_text()
    if not isinstance(kind, np.dtype):  # pandas 3's str
        return kind.__from_arrow__(column)
    values = column.to_numpy(zero_copy_only=False)
    values[column.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return values


@functools.cache
def _default_text():
    """The type pandas gives a column of text it infers (``str`` in pandas 3, object in pandas 2)."""
    import pandas as pd

    return pd.Series(["x"]).dtype


def _unsigned(column) -> bool:
    """Whether a column Arrow read as floats may hold integers from 2**63 on, which pandas reads
    as unsigned integers (Arrow's integers end there): pandas' to parse."""
    import pyarrow.compute as pc

    top = pc.max(column).as_py()
    return top is not None and top >= 2**63


@functools.cache
def _exact_floats() -> bool:
    """Whether pandas' C parser reads a float as Python does, to the last bit (pandas 3 does, as
    Arrow's reader does; pandas 2 reads ``0.30000000000000004`` as 0.3): only then does Arrow
    parse float columns in its place, so that a float is what pandas alone would give."""
    import pandas as pd

    return bool(pd.read_csv(io.StringIO("x\n0.30000000000000004\n"))["x"][0] == 0.30000000000000004)


def _blank(data: bytes) -> bool:
    """Whether text is whitespace only, as ``str.strip`` sees it; decoded only when its first byte
    could be whitespace (a row starts with its row id: nothing to decode)."""
    if data and 0x20 < data[0] < 0x80:
        return False
    return not data.decode("utf-8", errors="replace").strip()


def _fields(line: str) -> list[str] | None:
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return None


_INTEGER = re.compile(r"[-+]?\d+")


def type_config(df):
    """The ``cfg.*`` columns typed from their text: integers as (nullable) integers even with
    empty cells, other numbers as floats, True/False as booleans, the rest as text. Decided on
    the column's distinct values, so it costs little however many rows there are."""
    import pandas as pd

    for col in [c for c in df.columns if c.startswith("cfg.")]:
        codes, uniques = pd.factorize(df[col])
        values = [str(u) for u in uniques]
        if not values:
            continue
        if all(_INTEGER.fullmatch(v) for v in values) and all(abs(int(v)) < 2**63 for v in values):
            typed = pd.array([int(v) for v in values], dtype="Int64")
        elif all(v in ("True", "False") for v in values):
            typed = pd.array([v == "True" for v in values], dtype="boolean")
        else:
            try:
                typed = pd.array([float(v) for v in values], dtype="float64")
            except ValueError:
                continue  # text
        df[col] = pd.Series(typed.take(codes, allow_fill=True), index=df.index)
    return df


def concat(frames: Sequence[Any]):
    """Frames of rows as one, each column keeping its type: a column a frame lacks, or holds
    no value of, takes no part in deciding the type (pandas would turn an integer key of one
    run into floats as soon as another run lacks it: ``1024.0``, ``NaN`` labels). Columns keep
    their first-seen order."""
    import pandas as pd

    frames = [f for f in frames if len(f.columns)]
    if not frames:
        return pd.DataFrame()
    if len(frames) == 1:
        return frames[0]
    order = list(dict.fromkeys(c for f in frames for c in f.columns))
    trimmed = []
    for f in frames:
        empty = [c for c in f.columns if f[c].isna().all()] if len(f) else []
        trimmed.append(f.drop(columns=empty) if empty else f)
    df = pd.concat(trimmed, ignore_index=True, sort=False)
    for col in [c for c in df.columns if c.startswith("cfg.") and df[c].dtype == "float64"]:
        kinds = {f[col].dtype.kind for f in trimmed if col in f}
        if kinds == {"i"}:  # integers in every run that has the key, absent from the others
            df[col] = df[col].astype("Int64")
    return df.reindex(columns=order)


def fix_dtypes(df):
    """Types a user expects in pandas: categories, nullable ints and booleans, timestamps. A
    column already of its type is left as it is (rows from the index are: nothing to redo)."""
    import pandas as pd

    stamped = (
        isinstance(df["timestamp"].dtype, pd.DatetimeTZDtype) and str(df["timestamp"].dtype.tz) == "UTC"
        if "timestamp" in df
        else True
    )
    if not stamped:
        df["timestamp"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601", errors="coerce")
    for col in columns.CATEGORIES:
        if col in df and not isinstance(df[col].dtype, pd.CategoricalDtype):
            df[col] = df[col].astype("category")
    for col in columns.FLAGS:
        if col in df and df[col].dtype != "boolean":
            df[col] = df[col].map({"True": True, "False": False, True: True, False: False}).astype("boolean")
    for col in columns.INTS:
        if col in df and df[col].dtype != "Int64":
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("Int64")
    for col in columns.FLOATS:  # a hand-edited or damaged cell reads as missing, not as text
        if col in df and not pd.api.types.is_numeric_dtype(df[col]):
            df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in columns.TEXT:
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
