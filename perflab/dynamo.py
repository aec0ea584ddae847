"""What torch.compile did, from dynamo's own counters: graphs compiled and graph breaks."""

from __future__ import annotations


def unique_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    import torch

    try:
        return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError):
        return 0


def graph_breaks() -> int:
    """Graph breaks dynamo has met in this process so far."""
    import torch

    try:
        return int(sum(torch._dynamo.utils.counters["graph_break"].values()))
    except (AttributeError, KeyError):
        return 0
