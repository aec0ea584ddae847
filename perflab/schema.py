"""Moved to ``perflab.config.schema``; experiments import from ``perflab.experiment``. This old import keeps
working until perflab 0.4.0, with a DeprecationWarning."""

from perflab.moved import forward

__getattr__ = forward(__name__, "perflab.config.schema")
