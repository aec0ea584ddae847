"""A GPU's clocks, temperature, power and throttle reasons while it is measured, where
``nvidia-ml-py`` is installed (``pip install 'perflab[gpu]'``), read after samples."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

from perflab.measure.instruments.base import Instrument

# NVML's clock event (throttle) reasons, by bit (nvml.h: nvmlClocksEventReason*).
THROTTLE_REASONS = {
    0x1: "gpu idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}


def throttle_words(mask: int) -> str:
    """NVML's throttle-reason bits as words ("none" for 0; idle is not a throttle under load)."""
    words = [w for bit, w in THROTTLE_REASONS.items() if mask & bit and bit != 0x1]
    return ", ".join(words) or "none"


class GpuState(Instrument):
    """A GPU's clocks, temperature, power and throttle reasons while it is measured, read through
    NVML (``pip install 'perflab[gpu]'``: nvidia-ml-py) after samples, at most ten times a second,
    outside the clock. Without NVML or a CUDA device it reads nothing and adds no column."""

    COLUMNS = ("gpu_sm_clock_mhz", "gpu_mem_clock_mhz", "gpu_temp_c", "gpu_power_w", "gpu_throttle")
    SHARED = True

    def __init__(self, devices: Sequence[Any] = ()) -> None:
        self.handles: list[Any] = []
        self.reads: list[tuple[float, float, float, float, int]] = []
        self._last = 0.0
        cuda = [d for d in devices if getattr(d, "type", "") == "cuda"]
        if not cuda:
            return
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            for d in cuda:
                uuid = str(torch.cuda.get_device_properties(d.index).uuid)  # NVML's own order may differ
                self.handles.append(
                    pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
                )
            self._nvml = pynvml
        except Exception:  # no nvidia-ml-py, no driver: the columns stay out, never guessed
            self.handles = []

    def sampled(self) -> None:
        now = time.monotonic()
        if not self.handles or now - self._last < 0.1:
            return
        self._last = now
        nv = self._nvml
        reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        for h in self.handles:
            with contextlib.suppress(Exception):
                self.reads.append(
                    (
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
                        nv.nvmlDeviceGetPowerUsage(h) / 1000,
                        int(reasons(h)),
                    )
                )

    def columns(self) -> dict[str, Any]:
        """Lowest clocks, highest temperature and power, and every throttle reason seen."""
        if not self.reads:
            return {}
        mask = 0
        for *_, m in self.reads:
            mask |= m
        return {
            "gpu_sm_clock_mhz": min(r[0] for r in self.reads),
            "gpu_mem_clock_mhz": min(r[1] for r in self.reads),
            "gpu_temp_c": max(r[2] for r in self.reads),
            "gpu_power_w": max(r[3] for r in self.reads),
            "gpu_throttle": throttle_words(mask),
        }

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return self.columns()
