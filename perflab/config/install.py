"""What the installation itself must get right before any job: a torch and a torchvision built
for each other. A mismatched pair imports torch fine and then fails deep inside a job
(``operator torchvision::nms does not exist``); read from the packages' metadata, it is one line
at start, without importing either.

The pair the tests passed on is written once, as the upper bounds of ``torch`` and
``torchvision`` in pyproject.toml (``torch<2.15`` allows 2.14 at most): pip installs the newest
pair below them, and this module reads them back from perflab's own metadata to name that pair.
"""

from __future__ import annotations

import re
from importlib import metadata

from perflab.errors import ConfigError

# torchvision 0.N pairs with torch 2.(N-15): 0.29 with 2.14, 0.26 with 2.11 (torchvision's
# compatibility table); the C++ operators of one are built against the other's ABI.
TORCHVISION_MINOR_OFFSET = 15


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``2.14.1+cu130``."""
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def tested_pair() -> tuple[str, str] | None:
    """The newest (torch, torchvision) releases perflab's install allows, as ``2.14`` and
    ``0.29``: one below each upper bound perflab declares. None when perflab's metadata cannot
    be read or declares no bound."""
    try:
        requires = metadata.requires("perflab") or []
    except metadata.PackageNotFoundError:
        return None
    caps = {}
    for line in requires:
        found = re.match(r"(torchvision|torch)(?![\w.-])[^;]*?<\s*(\d+)\.(\d+)", line)
        if found and "extra ==" not in line and int(found.group(3)) > 0:  # <3.0 names no release below it
            name, major, minor = found.group(1), int(found.group(2)), int(found.group(3))
            caps[name] = f"{major}.{minor - 1}"
    return (caps["torch"], caps["torchvision"]) if len(caps) == 2 else None


def pair_command(pair: tuple[str, str]) -> str:
    return f"pip install 'torch=={pair[0]}.*' 'torchvision=={pair[1]}.*'"


def check_torch_pair() -> None:
    """Refuse a torch / torchvision pair that was not built together (torchvision absent: fine)."""
    try:
        torch, vision = metadata.version("torch"), metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return
    t, v = release(torch), release(vision)
    if t[0] == 2 and v[0] == 0 and v[1] == t[1] + TORCHVISION_MINOR_OFFSET:
        return
    tested = tested_pair()
    options = []
    if t[0] == 2 and (tested is None or t <= release(tested[0])):  # its torchvision existed when perflab was tested
        wanted = f"0.{t[1] + TORCHVISION_MINOR_OFFSET}.*"
        options.append(f"torchvision {wanted} beside torch {torch} (pip install 'torchvision=={wanted}')")
    if tested is not None:
        options.append(f"the pair perflab is tested with ({pair_command(tested)})")
    raise ConfigError(
        "torchvision",
        vision,
        ", or ".join(options) or "the torchvision release built for it",
        problem=f"not built for the installed torch {torch}",
    )
