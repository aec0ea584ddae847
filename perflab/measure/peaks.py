"""Measured peaks of this machine (written by the ``hardware`` experiment) as the denominators
of ``pct_of_peak`` in other experiments' rows: ``{hostname: {device: {quantity: value}}}``;
a matmul peak records the size it was measured at beside it (``matmul_float32_n``), so a job
with larger matmuls does not take it as its peak, and a smaller run does not replace it.

A job opens the file once, before measuring: one that cannot be read as such is refused (exit
2) by a job that would rewrite it, and only warned about by a job that merely reads it (its
rows then leave ``pct_of_peak`` empty; its measurements are kept).
"""

from __future__ import annotations

import json
import logging
import math
import socket
from pathlib import Path

from filelock import FileLock

from perflab.errors import ConfigError
from perflab.store import files

log = logging.getLogger("perflab")
SIZE = "_n"  # <quantity>_n: the matrix size n a matmul peak was measured at (a smaller run is no peak)
ALLOWED = "a peaks file written by +experiment=hardware, a new file path, or null"


class Peaks:
    def __init__(self, path: Path | None, data: dict | None = None) -> None:
        self.path, self.data = path, data or {}

    @classmethod
    def open(cls, path: Path | None, *, will_write: bool, key: str = "results.peaks") -> "Peaks":
        if path is None:
            return cls(None)
        kind = files.not_regular(path)
        if kind is not None:  # a FIFO would block its reader, a device never end: never a peaks file
            raise ConfigError(key, str(path), ALLOWED, problem=f"{kind}, not a regular file")
        exists = files.check_file(key, path, ALLOWED) if will_write else files.kind_of(path) != "missing"
        if not exists:
            return cls(path)
        try:
            data = files.read_json(path)
            problem = _layout_problem(data)
            if problem:
                raise ValueError(problem)
        except (OSError, ValueError) as err:
            problem = f"unreadable ({str(err).splitlines()[0]})"
            if will_write:
                raise ConfigError(key, str(path), ALLOWED, problem=problem) from None
            log.warning("%s=%s: %s; pct_of_peak stays empty in this job's rows", key, path, problem)
            return cls(None)
        return cls(path, data)

    def lookup(self, device: str, quantity: str) -> float | None:
        value = self.data.get(socket.gethostname(), {}).get(device, {}).get(quantity)
        return float(value) if isinstance(value, (int, float)) else None

    def measured_at(self, device: str, quantity: str) -> int | None:
        """The size n (an n x n matmul) a peak was measured at, where the file records it."""
        value = self.lookup(device, quantity + SIZE)
        return int(value) if value else None

    def save(self, device: str, values: dict[str, float]) -> None:
        """Merge ``values`` into the file under a lock (other jobs may be saving theirs). A peak
        measured at a size (``<quantity>_n``) smaller than the one on file does not replace it:
        a quick run never lowers the peak a full run measured."""
        if self.path is None:
            return
        real = files.target(self.path)
        with FileLock(str(real) + ".lock", timeout=60):
            current = files.read_json(real) if real.exists() and real.stat().st_size else {}
            here = current.setdefault(socket.gethostname(), {}).setdefault(device, {})
            for quantity, value in values.items():
                if quantity.endswith(SIZE):
                    continue
                size, kept = values.get(quantity + SIZE), here.get(quantity + SIZE)
                if size is not None and isinstance(kept, (int, float)) and kept > size:
                    log.info(
                        "%s: kept the %s peak measured at n=%d (this run's n=%d is smaller)",
                        device,
                        quantity,
                        kept,
                        size,
                    )
                    continue
                here[quantity] = value
                if size is not None:
                    here[quantity + SIZE] = size
            files.write_atomic(real, json.dumps(current, indent=2, sort_keys=True) + "\n")
        self.data = current


def _layout_problem(data: object) -> str:
    """What is wrong with a peaks file's layout, {host: {device: {quantity: peak > 0}}} ("" if nothing)."""
    if not isinstance(data, dict):
        return "not a JSON object"
    for host, devices in data.items():
        if not isinstance(devices, dict):
            return f"{host}: not an object of devices"
        for device, values in devices.items():
            if not isinstance(values, dict):
                return f"{host} / {device}: not an object of peaks"
            for quantity, value in values.items():
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not number or not math.isfinite(value) or value <= 0:
                    return f"{host} / {device} / {quantity}: {value!r} is not a peak (a number > 0)"
    return ""
