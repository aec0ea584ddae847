"""Public names that moved keep their old imports for one release, with a DeprecationWarning
that names the new import (CHANGELOG.md lists every move and the release that drops it)."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable, Sequence

FACE = "perflab.experiment"  # where an experiment's author imports from now


def forward(old: str, new: str | Sequence[str], dropped_in: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for the old module ``old``: each name comes from the face when
    the face has it, else from its new home ``new`` (of several, the first that has it: a module
    split in parts); the warning says the release that drops it."""
    homes = [new] if isinstance(new, str) else list(new)

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        face = importlib.import_module(FACE)
        has = [m for m in homes if hasattr(importlib.import_module(m), name)]
        if name not in face.__all__ and not has:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        where = FACE if name in face.__all__ else has[0]
        value = getattr(importlib.import_module(where), name)
        warnings.warn(
            f"{old}.{name} moved: use 'from {where} import {name}' (the old import goes in perflab {dropped_in})",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__
