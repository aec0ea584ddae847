"""FLOPs and model FLOPs utilization (MFU).

FLOPs are counted once, outside any timed loop, by ``torch.utils.flop_counter.FlopCounterMode``
(what TorchBench uses): matmuls and convolutions, forward and backward, 2 FLOPs per
multiply-add; elementwise ops, pooling and the optimizer are not counted (they are memory-bound
and small next to the matmuls). Rows then carry:

  tflops        achieved model TFLOP/s: counted FLOPs per call / median seconds per call
  pct_of_peak   100 x tflops / the peak ``+experiment=hardware`` measured on that device and dtype
  mfu           tflops / the *dense* datasheet peak of that device and dtype (x devices), 0..1

GPU datasheet peaks below are NVIDIA's *dense* figures. NVIDIA's tables print Tensor-Core TF32 /
BF16 / FP16 "with sparsity" (2x the dense rate, marked with an asterisk); using those would
halve every MFU. A CPU's datasheet peak is derived from its own description
(:func:`cpu_datasheet`: cores x clock x SIMD width x FMA), with every assumption stated in the
row's ``datasheet_basis``.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# (name fragments that must all be in torch.cuda.get_device_name(), {dtype: dense TFLOP/s}, source)
DATASHEET: list[tuple[tuple[str, ...], dict[str, float], str]] = [
    (
        ("H200",),
        {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.5, "float16": 989.5},
        "https://www.nvidia.com/en-us/data-center/h200/ (SXM; table figures with sparsity halved)",
    ),
    (
        ("H100", "PCIe"),
        {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0},
        "https://www.nvidia.com/en-us/data-center/h100/ (PCIe; sparsity halved)",
    ),
    (
        ("H100", "NVL"),
        {"float32": 60.0, "tf32": 417.5, "bfloat16": 835.5, "float16": 835.5},
        "https://www.nvidia.com/en-us/data-center/h100/ (NVL; sparsity halved)",
    ),
    (
        ("H100",),
        {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.5, "float16": 989.5},
        "https://www.nvidia.com/en-us/data-center/h100/ (SXM; sparsity halved)",
    ),
    (
        ("A100",),
        {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
        "https://www.nvidia.com/en-us/data-center/a100/ (SXM and PCIe; dense)",
    ),
    (
        ("L40S",),
        {"float32": 91.6, "tf32": 183.0, "bfloat16": 366.0, "float16": 366.0},
        "https://www.nvidia.com/en-us/data-center/l40s/ (sparsity halved)",
    ),
    (
        ("L4",),
        {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0},
        "https://www.nvidia.com/en-us/data-center/l4/ (sparsity halved)",
    ),
    (
        ("A10",),
        {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0},
        "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (sparsity halved)",
    ),
    (
        ("V100",),
        {"float32": 15.7, "float16": 125.0},
        "https://www.nvidia.com/en-us/data-center/v100/ (SXM2; Tensor Core FP16; no TF32/BF16)",
    ),
    (
        ("T4",),
        {"float32": 8.1, "float16": 65.0},
        "https://www.nvidia.com/en-us/data-center/tesla-t4/ (FP16/FP32 mixed; no TF32/BF16)",
    ),
]

# The dtype whose peak bounds a precision setting.
PRECISION_DTYPE = {
    "fp32": "float32",
    "tf32": "tf32",
    "bf16-mixed": "bfloat16",
    "fp16-mixed": "float16",
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float64": "float64",
}


def count(fn: Callable[[], object]) -> float:
    """FLOPs of one call of ``fn`` (forward, and backward if ``fn`` runs it)."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_cpu_attention()
    counter = FlopCounterMode(display=False)
    if hasattr(counter, "mod_tracker"):  # totals only: no per-module attribution to track
        counter.mod_tracker = _TotalsOnly()  # type: ignore[assignment]
    with counter:
        fn()
    return float(counter.get_total_flops())


class _TotalsOnly:
    """FlopCounterMode's module tracker, for totals alone (every FLOP counts under "Global").
    torch's ModuleTracker hooks the gradient of each module's inputs that require one, which
    fails where gradients are off and a module is handed parameters: weight_norm's
    parametrization, in the positional convolution of Wav2Vec2, HuBERT and WavLM, left their
    inference rows without FLOPs ("'ParametrizedConv1d' object has no attribute 'weight'")."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _TotalsOnly:
        return self

    def __exit__(self, *args: object) -> None:
        return None


@functools.cache
def _count_cpu_attention() -> None:
    """Teach FlopCounterMode the CPU's fused attention (``scaled_dot_product_attention`` runs as
    ``_scaled_dot_product_flash_attention_for_cpu`` there, which it does not count: a
    transformer's attention went missing, -1.9 % of GPT-2's FLOPs at 128 tokens, more with
    longer ones), with torch's own formulas for its CUDA kernels: the same two matmuls."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None and forward not in fc.flop_registry:

        @fc.register_flop_formula(forward)
        def _forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return fc.sdpa_flop_count(query, key, value)  # type: ignore[no-any-return]

    if backward is not None and backward not in fc.flop_registry:

        @fc.register_flop_formula(backward)
        def _backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kw: Any) -> int:
            return fc.sdpa_backward_flop_count(grad, query, key, value)  # type: ignore[no-any-return]


def bytes_moved(model: Any, example: Any, precision: str = "fp32", training: bool = True) -> tuple[float, float]:
    """An *estimate* of the bytes one step moves to and from memory, as (fixed, per item):
    training reads the weights twice and writes their gradients, and the optimizer reads and
    writes weights, gradients and momentum (~8 passes over the parameters); every layer's
    output is written, read by the next layer and again by the backward pass, whose gradient
    is written and read (~4 passes over the activations). Inference: one pass over the
    weights, two over the activations. Caches are ignored: the real traffic is lower.

    ``example`` is an input batch of the data's real shape and dtype, best on the ``meta``
    device (nothing runs; two items or more, so that BatchNorm sees more than one value per
    channel); the model is copied to ``meta`` and run in eval mode."""
    import copy

    import torch
    from torch.utils._pytree import tree_leaves

    meta = copy.deepcopy(model).to("meta").eval()
    params = sum(p.numel() for p in meta.parameters()) * 4
    outputs: list[int] = []

    def count_outputs(module: Any, inputs: Any, output: Any) -> None:
        outputs.append(sum(t.numel() for t in tree_leaves(output) if isinstance(t, torch.Tensor)))

    hooks = [m.register_forward_hook(count_outputs) for m in meta.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            meta(example.to("meta"))
    finally:
        for h in hooks:
            h.remove()
    element = 2 if precision in ("bf16-mixed", "fp16-mixed") else 4
    activations = sum(outputs) * element / example.shape[0]
    return (8 * params, 4 * activations) if training else (params, 2 * activations)


def estimated(what: str, fn: Callable[[], Any]) -> tuple[Any, str]:
    """``(fn(), "")``, or ``(None, a note)`` when an estimate fails on a model it was not
    made for: the estimate costs its column, never the job."""
    try:
        return fn(), ""
    except Exception as err:  # any model: an estimate that cannot follow it is left out, saying so
        text = str(err).strip().splitlines()
        return None, f"{what} not estimated: {type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def datasheet_peak(device_name: str, dtype: str) -> float | None:
    """Dense datasheet TFLOP/s of a device for a dtype (``float32``, ``tf32``, ``bfloat16`` ...):
    a GPU's from the table above, a CPU's (``CPU (N threads)``) derived by :func:`cpu_datasheet`."""
    cpu = cpu_datasheet_of(device_name, dtype)
    if cpu is not None:
        return cpu.tflops
    for fragments, peaks, _ in DATASHEET:
        if all(f in device_name for f in fragments):
            return peaks.get(dtype)
    return None


def utilization(tflops: float, device_names: list[str], precision: str, measured_peak: float | None) -> dict[str, Any]:
    """``pct_of_peak`` (vs the measured peak of one device) and ``mfu`` (vs the datasheet, summed
    over the devices); each left out when its peak is unknown. ``datasheet_basis``: how a CPU's
    datasheet peak was derived."""
    dtype = PRECISION_DTYPE.get(precision, precision)
    out: dict[str, Any] = {}
    if measured_peak:
        out["pct_of_peak"] = 100 * tflops / (measured_peak * len(device_names))
    sheet = [datasheet_peak(n, dtype) for n in device_names]
    if sheet and all(sheet):
        total = sum(p for p in sheet if p)
        cpus = [c for c in (cpu_datasheet_of(n, dtype) for n in device_names) if c is not None]
        basis = cpus[0].basis + (f"; x {len(cpus)} workers" if len(cpus) > 1 else "") if cpus else ""
        if is_lower_bound(basis) and measured_peak and measured_peak * len(device_names) > total:
            # a peak is a maximum: where the clock counted is none, the measured peak, if higher
            total = measured_peak * len(device_names)
            basis = (
                f"the measured peak, {measured_peak:.3g} TFLOP/s a device (results.peaks), above the datasheet's "
                f"{sum(p for p in sheet if p):.3g} counted at a clock that is no maximum "
                f"({basis.replace(f' ({TURBO_UNKNOWN})', '')})"
            )
        out["datasheet_tflops"] = total
        if basis:
            out["datasheet_basis"] = basis
        if is_lower_bound(basis) and tflops > total:  # a floor, not a peak: no MFU above 100 % is shown
            out["mfu_note"] = (
                f"no MFU: {tflops:.3g} TFLOP/s is above the datasheet peak {total:.3g}, counted at a clock that is no "
                "maximum (the CPU ran faster): +experiment=hardware measures a peak to count MFU against"
            )
        else:
            out["mfu"] = tflops / total
    return out


# --- a CPU's datasheet peak, from its own description -------------------------------------------

# float32 lanes of the widest vector unit a flag announces (x86), widest first.
SIMD_FP32_LANES = (("avx512f", 16, "AVX-512"), ("avx", 8, "AVX/AVX2"), ("sse2", 4, "SSE2"), ("asimd", 4, "NEON"))
AMX_FLOPS_PER_CYCLE = 1024  # Intel AMX (TMUL): 1024 bf16/fp16 operations per cycle per core, Intel's own figure
TURBO_UNKNOWN = "turbo may run higher"  # said of a clock that is no maximum: the derived peak may be low


def is_lower_bound(basis: object) -> bool:
    """Whether a CPU peak's ``datasheet_basis`` counted with a clock that is no maximum (a VM's
    TSC rate, the clock now, a base clock): such a peak is a floor, and a measurement above it
    says the CPU ran faster than reported, not that the measurement is wrong."""
    return TURBO_UNKNOWN in str(basis or "")


def mfu_words(mfu: float, basis: object) -> str:
    """ "MFU 42.0%", said beside a peak that is a floor (:func:`is_lower_bound`) as a share of
    that floor: an MFU above 100 % there says the clock was low, not the measurement wrong."""
    words = f"MFU {mfu:.1%}"
    if is_lower_bound(basis):
        words += " of a lower bound on the datasheet peak (its clock is no maximum): the true MFU is lower"
    return words


@dataclass(frozen=True)
class CpuPeak:
    tflops: float
    basis: str  # every factor, where it came from, and what was assumed


@dataclass(frozen=True)
class CpuDescription:
    """What the kernel says about the CPU: ``/proc/cpuinfo`` and ``/sys/devices/system/cpu``."""

    flags: frozenset[str]
    cores: int  # physical cores this process may use (hyperthreads share a core's vector units)
    ghz: float
    clock_source: str  # where ``ghz`` came from, and what that means for the peak


CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")


@functools.cache
def cpu_description() -> CpuDescription | None:
    """The running CPU as the kernel describes it, or None where it does not (macOS, Windows)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return None
    blocks = [b for b in text.split("\n\n") if b.strip()]
    fields = [dict(_field(line) for line in b.splitlines() if ":" in line) for b in blocks]
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(len(fields)))
    mine = [f for f in fields if int(f.get("processor", "-1") or -1) in usable] or fields
    if not mine:
        return None
    flags = frozenset((mine[0].get("flags") or mine[0].get("Features") or "").split())
    cores = {(f.get("physical id", "0"), f.get("core id", f.get("processor", ""))) for f in mine}
    ghz, source = _clock(mine[0])
    if not ghz:
        return None
    return CpuDescription(flags, len(cores), ghz, source)


def _field(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _clock(fields: dict[str, str]) -> tuple[float, str]:
    """The clock to count with: cpufreq's maximum where the kernel has it (the single-core turbo:
    an all-core clock is lower, so the peak is an upper bound), else the ``cpu MHz`` of
    /proc/cpuinfo (the current clock, or a virtual machine's TSC rate: turbo may run higher)."""
    try:
        khz = int((SYS_CPU / "cpu0" / "cpufreq" / "cpuinfo_max_freq").read_text())
        return khz / 1e6, "cpufreq's maximum, a single-core turbo (all cores together run lower)"
    except (OSError, ValueError):
        pass
    mhz = re.sub(r"[^0-9.]", "", fields.get("cpu MHz", ""))
    if mhz:
        return float(mhz) / 1e3, f"cpu MHz in /proc/cpuinfo, the clock now or a VM's TSC rate ({TURBO_UNKNOWN})"
    model = re.search(r"@\s*([\d.]+)\s*GHz", fields.get("model name", ""))
    if model:
        return float(model.group(1)), f"the model name's base clock ({TURBO_UNKNOWN})"
    return 0.0, ""


def cpu_datasheet(dtype: str, threads: int, cpu: CpuDescription | None = None) -> CpuPeak | None:
    """A CPU's datasheet peak for ``dtype`` on ``threads`` threads: cores x clock x FLOPs per
    cycle per core, where FLOPs per cycle = SIMD lanes x 2 (an FMA is a multiply and an add) x
    FMA units per core. Assumptions, each said in ``basis``:

    - cores: the physical cores the threads can occupy (hyperthreads share vector units);
    - clock: cpufreq's maximum, else the reported ``cpu MHz`` (see :func:`_clock`);
    - FMA units per core: 2 with AVX-512 or AVX2+FMA (Xeon Scalable Gold/Platinum and every
      core since Haswell; some Xeon Silver/Bronze and client parts have 1), 2 on Arm NEON;
      without FMA, a multiply and an add unit (counted as one FMA unit);
    - float64: half the float32 lanes; bfloat16/float16: AMX tiles (1024 FLOPs per cycle per
      core, Intel's figure) where ``amx_bf16`` / ``amx_fp16`` is set, else twice float32 with
      ``avx512_bf16`` / ``avx512_fp16``, else bfloat16 at the float32 rate (converted) and no
      float16 peak (emulated); no TF32 on a CPU.

    None where the kernel does not describe the CPU or the dtype has no peak here.
    """
    cpu = cpu or cpu_description()
    if cpu is None or threads < 1:
        return None
    simd = next(((lanes, name) for flag, lanes, name in SIMD_FP32_LANES if flag in cpu.flags), None)
    if simd is None:
        return None
    lanes, isa = simd
    fma = "fma" in cpu.flags or "avx512f" in cpu.flags or isa == "NEON"
    units = 2 if fma and (isa in ("AVX-512", "NEON") or "avx2" in cpu.flags) else 1
    assumed = f"{units} FMA unit{'s' if units > 1 else ''} per core" if fma else "a multiply and an add unit per core"
    if units == 2 and isa != "NEON":
        assumed += " (some parts have 1)"
    per_cycle = float(lanes * 2 * units)
    op = "FMA" if fma else "mul + add"
    units_words = f"{units} {'FMA ' if fma else ''}unit{'s' if units > 1 else ''}"
    what = f"{lanes} float32 lanes ({isa}) x 2 ({op}) x {units_words}"
    if dtype == "float64":
        per_cycle, what = per_cycle / 2, f"{lanes // 2} float64 lanes ({isa}) x 2 ({op}) x {units_words}"
    elif dtype in ("bfloat16", "float16"):
        short = "bf16" if dtype == "bfloat16" else "fp16"
        if f"amx_{short}" in cpu.flags:
            per_cycle, what = float(AMX_FLOPS_PER_CYCLE), f"{AMX_FLOPS_PER_CYCLE} {short} FLOPs per cycle (AMX tiles)"
            assumed = f"AMX's {AMX_FLOPS_PER_CYCLE} {short} FLOPs per cycle per core (Intel's figure)"
        elif f"avx512_{short}" in cpu.flags:
            per_cycle, what = 2 * per_cycle, f"2 (avx512_{short}) x {what}"
        elif dtype == "bfloat16":
            assumed += "; bfloat16 converted to float32, at its rate"
        else:
            return None  # float16 arithmetic is emulated: no peak to speak of
    elif dtype != "float32":
        return None
    cores = min(threads, cpu.cores)
    tflops = cores * cpu.ghz * 1e9 * per_cycle / 1e12
    basis = (
        f"{cores} core{'s' if cores > 1 else ''} x {cpu.ghz:.2f} GHz x {what} = {tflops:.3g} TFLOP/s; "
        f"clock: {cpu.clock_source}; assumed: {assumed}"
    )
    return CpuPeak(tflops, basis)


def cpu_datasheet_of(device_name: str, dtype: str) -> CpuPeak | None:
    """:func:`cpu_datasheet` for a device named as perflab names CPUs: ``CPU (N threads)``."""
    found = re.fullmatch(r"CPU \((\d+) threads?\)", device_name.strip())
    return cpu_datasheet(dtype, int(found.group(1))) if found else None
