"""Moved to ``perflab.measure.instruments`` (0.5.0): ``memory`` (``Memory``, ``host_peak``),
``machine`` (``Machine``, ``busy_reason``, ``worst`` ...), ``gpu`` (``GpuState``,
``throttle_words``). These old imports keep working until perflab 0.6.0, with a
DeprecationWarning."""

from perflab.moved import forward

_PARTS = ("memory", "machine", "gpu")
__getattr__ = forward(__name__, [f"perflab.measure.instruments.{m}" for m in _PARTS], dropped_in="0.6.0")
