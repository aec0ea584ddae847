"""perflab: a config-driven lab for measuring the computational performance of PyTorch work."""

__version__ = "0.1.0"
