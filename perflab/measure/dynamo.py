"""torch.compile's side: which backends exist, and what it did (graphs compiled, graph breaks)
from dynamo's own counters."""

from __future__ import annotations

from perflab.errors import ConfigError


def check_backend(key: str, backend: str) -> None:
    """A backend torch.compile knows, refused in one line before anything runs (it would
    otherwise fail at the first compiled call, after the job started)."""
    import torch._dynamo

    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        shown = [b for b in known if "TESTING" not in b and "minifier" not in b]
        raise ConfigError(key, backend, ", ".join(shown), problem="not a torch.compile backend")


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
