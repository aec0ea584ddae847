"""FLOPs and model FLOPs utilization (MFU).

FLOPs are counted once, outside any timed loop, by ``torch.utils.flop_counter.FlopCounterMode``
(what TorchBench uses): matmuls and convolutions, forward and backward, 2 FLOPs per
multiply-add; elementwise ops, pooling and the optimizer are not counted (they are memory-bound
and small next to the matmuls). Rows then carry:

  tflops        achieved model TFLOP/s: counted FLOPs per call / median seconds per call
  pct_of_peak   100 x tflops / the peak ``+experiment=hardware`` measured on that device and dtype
  mfu           tflops / the *dense* datasheet peak of that GPU and dtype (x devices), 0..1

Datasheet peaks below are NVIDIA's *dense* figures. NVIDIA's tables print Tensor-Core TF32 /
BF16 / FP16 "with sparsity" (2x the dense rate, marked with an asterisk); using those would
halve every MFU. CPUs have no entry: their MFU stays empty, their pct_of_peak still works.
"""

from __future__ import annotations

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

    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


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
    """Dense datasheet TFLOP/s of a GPU for a dtype (``float32``, ``tf32``, ``bfloat16`` ...)."""
    for fragments, peaks, _ in DATASHEET:
        if all(f in device_name for f in fragments):
            return peaks.get(dtype)
    return None


def utilization(tflops: float, device_names: list[str], precision: str, measured_peak: float | None) -> dict[str, Any]:
    """``pct_of_peak`` (vs the measured peak of one device) and ``mfu`` (vs the datasheet, summed
    over the devices); each left out when its peak is unknown."""
    dtype = PRECISION_DTYPE.get(precision, precision)
    out: dict[str, Any] = {}
    if measured_peak:
        out["pct_of_peak"] = 100 * tflops / (measured_peak * len(device_names))
    sheet = [datasheet_peak(n, dtype) for n in device_names]
    if sheet and all(sheet):
        total = sum(p for p in sheet if p)
        out["mfu"] = tflops / total
        out["datasheet_tflops"] = total
    return out
