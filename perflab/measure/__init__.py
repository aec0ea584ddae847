"""Timing on devices: the benchmark loop, devices, the machine's identity and ceilings, FLOPs and memory."""
