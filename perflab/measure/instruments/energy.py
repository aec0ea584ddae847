"""Energy beside time, where the machine exposes it: Intel/AMD RAPL on the CPU (the kernel's
``/sys/class/powercap/intel-rapl:N/energy_uj``, one counter per package) and NVML on a GPU
(``nvmlDeviceGetTotalEnergyConsumption``, ``pip install 'perflab[gpu]'``). Counters are read
before and after each sample, outside the clock; a row gets ``joules_per_call`` (and
``joules_per_item`` where it counts items: per image, per token) or, where nothing can be read,
``energy_note`` with the reason, never a guess.

RAPL counts a whole CPU package: other processes' work on it is in the figure (the rows'
``others_cpu_pct`` says how busy the machine was). NVML counts the whole GPU.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Sequence

from perflab.measure.instruments.base import Instrument

POWERCAP = Path("/sys/class/powercap")
# Why a part has no joules where the counters can be read: the only loop perflab does not run.
NOT_SAMPLED = (
    "no counter read around its samples: bench.timer=torch_utils_benchmark times them in "
    "torch.utils.benchmark's own loop (its calls are not perflab's to count)"
)


def rapl_packages(root: Path = POWERCAP) -> list[Path]:
    """The RAPL package domains (``intel-rapl:0``, not its sub-domains ``intel-rapl:0:0``)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1 and (p / "energy_uj").exists())


class Energy(Instrument):
    """Joules spent per named part, summed over its samples (see the module's docstring); none
    over a loop perflab does not sample (``NOT_SAMPLED``)."""

    COLUMNS = ("joules_per_call", "joules_per_item", "energy_note")

    def __init__(self, devices: Sequence[Any] = (), root: Path | None = None) -> None:
        root = POWERCAP if root is None else root
        self.readers: list[Callable[[], float]] = []  # cumulative joules, one per counter
        self.wraps: list[float] = []  # where each counter wraps around (joules)
        self.why = ""
        self.spent: dict[str, float] = {}
        kinds = {getattr(d, "type", "") for d in devices}
        reasons = []
        if "cpu" in kinds:
            reasons.append(self._rapl(root))
        if "cuda" in kinds:
            reasons.append(self._nvml([d for d in devices if getattr(d, "type", "") == "cuda"]))
        self.why = "; ".join(r for r in reasons if r)

    def _rapl(self, root: Path) -> str:
        packages = rapl_packages(root)
        if not packages:
            return f"no RAPL counters here ({root}/intel-rapl:N: a virtual machine, or not Intel/AMD)"
        try:
            for p in packages:
                (p / "energy_uj").read_text()
                wrap = float((p / "max_energy_range_uj").read_text()) / 1e6
                self.readers.append(_rapl_reader(p / "energy_uj"))
                self.wraps.append(wrap)
        except (OSError, ValueError) as err:
            self.readers, self.wraps = [], []
            return f"RAPL's energy_uj cannot be read ({type(err).__name__}: root only on Linux >= 5.10)"
        return ""

    def _nvml(self, cuda: Sequence[Any]) -> str:
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            for d in cuda:
                uuid = str(torch.cuda.get_device_properties(d.index).uuid)
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
                pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # millijoules since the driver loaded
                self.readers.append(_nvml_reader(pynvml, handle))
                self.wraps.append(math.inf)
        except Exception as err:  # no nvidia-ml-py, no driver, a GPU without the counter
            return f"no NVML energy counter ({type(err).__name__}; pip install 'perflab[gpu]')"
        return ""

    def read(self) -> list[float]:
        return [r() for r in self.readers]

    @contextlib.contextmanager
    def sample(self, name: str = "") -> Iterator[None]:
        if not self.readers or self.why:
            yield
            return
        before = self.read()
        yield
        after = self.read()
        used = sum(b - a if b >= a else b + wrap - a for a, b, wrap in zip(before, after, self.wraps))
        self.spent[name] = self.spent.get(name, 0.0) + used

    def run(self, name: str) -> ContextManager[None]:
        return self.sample(name)

    def row(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        return self.columns(name, calls, items_per_call)

    def columns(self, name: str, calls: int, items_per_call: float | None = None) -> dict[str, Any]:
        """``joules_per_call`` (and ``joules_per_item``) of the part, or ``energy_note``: why none."""
        if self.why:
            return {"energy_note": self.why}
        if not self.readers:
            return {}  # no device with a counter to read (neither CPU nor CUDA)
        if name not in self.spent or calls < 1:
            return {"energy_note": NOT_SAMPLED}
        per_call = self.spent[name] / calls
        out: dict[str, Any] = {"joules_per_call": per_call}
        if items_per_call:
            out["joules_per_item"] = per_call / items_per_call
        return out


def _rapl_reader(path: Path) -> Callable[[], float]:
    return lambda: float(path.read_text()) / 1e6  # microjoules


def _nvml_reader(nvml: Any, handle: Any) -> Callable[[], float]:
    return lambda: float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) / 1e3  # millijoules
