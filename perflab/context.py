"""What an experiment gets: its typed params, the resolved devices, and ways to record rows."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from perflab import peaks
from perflab.bench import Stats, measure
from perflab.devices import Device, Resolved
from perflab.results import STATUSES, ResultsWriter, human_time, throughput
from perflab.schema import PerflabConfig

log = logging.getLogger("perflab")


@dataclass
class Context:
    settings: PerflabConfig
    resolved: Resolved
    writer: ResultsWriter
    base_row: dict[str, Any]  # identity, environment and flattened config, shared by every row

    @property
    def params(self) -> Any:
        """The experiment's own typed config (a subclass of ExperimentConfig)."""
        return self.settings.experiment

    @property
    def peaks_file(self) -> Path | None:
        return Path(self.settings.results.peaks) if self.settings.results.peaks else None

    @property
    def devices(self) -> list[Device]:
        return self.resolved.devices

    def measure(
        self,
        name: str,
        fn: Callable[[], object],
        devices: Sequence[Device] | None = None,
        *,
        sync: bool = True,
        number: int = 1,
        items: float | None = None,
        flops: float | None = None,
        bytes: float | None = None,
        timer: str | None = None,
        peak: str | None = None,
        derive: Callable[[Stats], dict[str, Any]] | None = None,
        **extra: Any,
    ) -> Stats:
        """Time ``fn`` with the job's bench settings, record a row, and return the stats.

        ``items``/``flops``/``bytes`` are per call; they become items/s, TFLOP/s and GB/s.
        ``derive(stats)`` adds columns that depend on the measured time (e.g. a ratio).
        ``peak`` names a quantity the ``hardware`` experiment measured on this device (e.g.
        ``matmul_float32``): the row then gets ``pct_of_peak``.
        """
        b = self.settings.bench
        devices = self.devices if devices is None else list(devices)
        stats = measure(fn, devices, warmup=b.warmup, repeats=b.repeats, min_time_s=b.min_time_s,
                        number=number, timer=timer or b.timer, sync=sync, noise_threshold=b.noise_threshold)
        derived = {}
        if items is not None:
            derived["items_per_s"] = items / stats.median
        if flops is not None:
            derived["tflops"] = flops / stats.median / 1e12
        if bytes is not None:
            derived["gbps"] = bytes / stats.median / 1e9
        if derive is not None:
            derived.update(derive(stats))
        if peak and len(devices) == 1:
            ceiling = peaks.lookup(self.peaks_file, devices[0].description(), peak)
            value = derived.get("tflops", derived.get("gbps"))
            if ceiling and value is not None:
                derived["pct_of_peak"] = 100 * value / ceiling
        self.record(name, stats, devices=devices, **{**extra, **derived})  # derived values win
        return stats

    def record(self, name: str, stats: Stats | None = None, *, status: str = "ok", error: str = "",
               devices: Sequence[Device] | None = None, **fields: Any) -> dict[str, Any]:
        """Write one row (and its raw samples) now, so a later crash cannot lose it."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r}: one of {', '.join(STATUSES)}")
        devices = self.devices if devices is None else list(devices)
        row = {
            **self.base_row,
            "measurement": name,
            "status": status,
            "error": error,
            "devices": "+".join(d.name for d in devices),
            "device_name": " + ".join(dict.fromkeys(d.description() for d in devices)),
            **(stats.as_row() if stats else {}),
            **fields,
        }
        row = self.writer.add(row, stats.samples if stats else (), stats.warmup if stats else ())
        log.info("  %s", _progress_line(row))
        return row

    def skip(self, name: str, reason: str, devices: Sequence[Device] | None = None) -> None:
        """A part that cannot run here (e.g. needs a GPU): say so in a ``skipped`` row."""
        self.record(name, status="skipped", error=reason, devices=devices)


def _progress_line(row: dict[str, Any]) -> str:
    if "epoch" in row and row["status"] == "ok":
        return (f"epoch {row['epoch']}: {row['train_s']:.2f} s train, {row['eval_s']:.2f} s eval, "
                f"{row['items_per_s']:.4g} images/s, loss {row['train_loss']:.4f}, "
                f"train acc {row['train_acc']:.3f}, test acc {row['test_acc']:.3f}, lr {row['lr']:.4g}")
    if row["status"] != "ok" or "median_s" not in row:
        return f"{row['measurement']}: {row['status']} {row.get('error') or row.get('note') or ''}".rstrip()
    spread = row["iqr_s"] / row["median_s"] if row["median_s"] else math.nan
    rate = throughput(row)
    return (f"{row['measurement']}: median {human_time(row['median_s'])}, IQR {spread:.1%} of median, "
            f"n={row['n']} ({row['timer']}){', ' + rate if rate else ''}")
