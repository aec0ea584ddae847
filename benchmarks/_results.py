"""Appending a benchmark's rows to its CSV in benchmarks/results/: a script that gained columns
since the file was written rewrites it with the union (older rows' new cells empty), so the file
always loads in pandas."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Mapping, Sequence


def append(out: Path, rows: Sequence[Mapping[str, object]]) -> None:
    before = list(csv.DictReader(out.open(newline=""))) if out.exists() else []
    columns = list(dict.fromkeys([*(c for r in before for c in r), *(c for r in rows for c in r)]))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")  # as pandas and git write lines
        writer.writeheader()
        writer.writerows([*before, *rows])
