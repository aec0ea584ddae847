"""SLURM facts a job needs about its own allocation."""

from __future__ import annotations

import re


def first_node(nodelist: str) -> str:
    """The first host of a SLURM hostlist: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    first = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not first:
        return ""
    prefix, ranges = first.group(1), first.group(2)
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]
