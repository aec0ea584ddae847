"""Precision settings shared by training and the compile experiment.

fp32        plain float32 (TF32 off)
tf32        float32 storage, TF32 tensor-core matmuls and convolutions: CUDA only
bf16-mixed  torch.autocast to bfloat16 (CPU and CUDA)
fp16-mixed  torch.autocast to float16, with a GradScaler for training (CPU and CUDA)
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from perflab.errors import ConfigError

AUTOCAST = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}


def check(key: str, precision: str, devices: Sequence[Any]) -> None:
    """Refuse what these devices cannot do, before anything runs."""
    if precision == "tf32" and any(d.type != "cuda" for d in devices):
        raise ConfigError(
            key,
            precision,
            "fp32, bf16-mixed or fp16-mixed on this device",
            problem="TF32 is a mode of NVIDIA tensor cores (CUDA only)",
        )


@contextlib.contextmanager
def applied(precision: str, device_type: str) -> Iterator[None]:
    """Run a block in ``precision``: autocast for the mixed ones, the TF32 switches for tf32."""
    import torch

    if precision in AUTOCAST:
        with torch.autocast(device_type, dtype=getattr(torch, AUTOCAST[precision])):
            yield
        return
    if device_type != "cuda":
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def scaler(precision: str, device_type: str) -> Any:
    """A GradScaler for fp16-mixed (float16 gradients underflow without one); else a no-op one."""
    import torch

    return torch.amp.GradScaler(device_type, enabled=precision == "fp16-mixed")
