"""What the installation itself must get right before any job: a torch and a torchvision built
for each other. A mismatched pair imports torch fine and then fails deep inside a job
(``operator torchvision::nms does not exist``); read from the packages' metadata, it is one line
at start, without importing either."""

from __future__ import annotations

from importlib import metadata

from perflab.errors import ConfigError

# torchvision 0.N pairs with torch 2.(N-15): 0.29 with 2.14, 0.26 with 2.11 (torchvision's
# compatibility table); the C++ operators of one are built against the other's ABI.
TORCHVISION_MINOR_OFFSET = 15


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``2.14.1+cu130``."""
    parts = version.split("+")[0].split(".")
    return int(parts[0]), int(parts[1])


def torchvision_for(torch_version: str) -> str:
    major, minor = release(torch_version)
    return f"0.{minor + TORCHVISION_MINOR_OFFSET}.*" if major == 2 else "the release its table pairs with it"


def check_torch_pair() -> None:
    """Refuse a torch / torchvision pair that was not built together (torchvision absent: fine)."""
    try:
        torch, vision = metadata.version("torch"), metadata.version("torchvision")
    except metadata.PackageNotFoundError:
        return
    t, v, wanted = release(torch), release(vision), torchvision_for(torch)
    if t[0] == 2 and v[0] == 0 and v[1] == t[1] + TORCHVISION_MINOR_OFFSET:
        return
    raise ConfigError(
        "torchvision",
        vision,
        f"torchvision {wanted} beside torch {torch} (pip install 'torchvision=={wanted}'), "
        "or the torch its release pairs with",
        problem=f"not built for the installed torch {torch}",
    )
