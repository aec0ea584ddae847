"""Moved to ``perflab.models`` (the models home, which training, inference and generation
share). This old import keeps working until perflab 0.5.0, with a DeprecationWarning."""

from perflab.moved import forward

__getattr__ = forward(__name__, "perflab.models", dropped_in="0.5.0")
