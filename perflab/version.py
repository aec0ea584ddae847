"""perflab's own version, below everything that records it (pyproject.toml reads it from here)."""

__version__ = "0.4.0"
