"""Moved to ``perflab.measure.instruments.energy`` (0.5.0). This old import keeps working until
perflab 0.6.0, with a DeprecationWarning."""

from perflab.moved import forward

__getattr__ = forward(__name__, "perflab.measure.instruments.energy", dropped_in="0.6.0")
