"""Measured peaks of this machine (written by the ``hardware`` experiment) as the denominators
of ``pct_of_peak`` in other experiments' rows: {hostname: {device: {quantity: value}}}."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from filelock import FileLock

from perflab.results import write_atomic


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, device: str, values: dict[str, float]) -> None:
    with FileLock(str(path) + ".lock"):
        data = _read(path)
        data.setdefault(socket.gethostname(), {}).setdefault(device, {}).update(values)
        write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def lookup(path: Path | None, device: str, quantity: str) -> float | None:
    if path is None:
        return None
    return _read(path).get(socket.gethostname(), {}).get(device, {}).get(quantity)
