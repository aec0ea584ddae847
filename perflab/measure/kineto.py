"""A profile's events summed per operator straight from the profiler's C++ results, as torch's
``key_averages`` sums them, without its Python object per event.

Reading a profile back, torch builds a ``FunctionEvent`` per event and the tree of them in
Python (~80 us an event on a 2-core CPU: most of a short call's profiled pass); here each
event's few fields are read once into arrays and the tree is built over them. The rules are
``key_averages``' own (torch 2.14, ``torch.autograd.profiler_util``):

- the profiler's bookkeeping ops are left out, and hidden and Python-function events;
- the schedule's step marks (``ProfilerStep#3``) are one key, ``ProfilerStep*``;
- an event's parent is the innermost event on its thread whose span holds it (CPU events, not
  async: started and ended on one thread); a host event a device's runtime made (a kernel
  launch) is on the thread of the op that made it;
- an event named as its parent, that parent's only child, is merged into it (one call);
- self time on the host: an event's span less its children's spans; on a device: its span.

Private torch API (``_KinetoEvent``): :func:`averages` raises where it is not as expected, and
the caller falls back to ``key_averages``.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pandas as pd

FIELDS = ("key", "device", "annotation", "count", "self_us", "total_us")
HIDDEN = frozenset(  # torch.autograd.profiler_util._filter_name (memory records: perflab profiles no memory)
    {
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    }
)


def averages(result: Any) -> pd.DataFrame:
    """``FIELDS`` a (key, device, annotation) of a profile's ``kineto_results``: ``device`` the
    event's device type's name in lower case (``cpu``, ``cuda``), ``annotation`` whether it is
    a ``record_function`` range, ``count`` its events, ``self_us`` their self time (host or
    device, as ``self_cpu_time_total`` / ``self_device_time_total``) and ``total_us`` their
    host spans (``cpu_time_total``).

    Python's cyclic garbage collector is paused meanwhile: the reading makes ~10 objects an
    event, none in a cycle, and each collection they set off walked the whole process's heap
    (torch, pandas, Hydra: a third of a data loader's reading, 38k events, went there)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _averages(result)
    finally:
        if enabled:
            gc.enable()


def _averages(result: Any) -> pd.DataFrame:
    from torch.autograd import DeviceType

    events = [e for e in result.events() if not e.is_hidden_event() and not e.is_python_function()]
    fields = [
        (e.name(), e.start_ns(), e.end_ns(), e.start_thread_id(), e.end_thread_id())
        + (e.device_type(), e.is_async(), e.linked_correlation_id(), e.is_user_annotation())
        for e in events
    ]  # one pass, each event's fields at once: most of the time here is these calls
    shown = np.fromiter((f[0] not in HIDDEN for f in fields), bool, len(fields))
    events, fields = [events[i] for i in np.flatnonzero(shown)], [fields[i] for i in np.flatnonzero(shown)]
    n = len(events)
    if not n:
        return pd.DataFrame(columns=list(FIELDS))
    names, starts, ends, threads, end_threads, types, is_async, links, annotation = (list(c) for c in zip(*fields))
    start, end, thread, linked = (np.array(c, np.int64) for c in (starts, ends, threads, links))
    on_cpu = np.array([t == DeviceType.CPU for t in types], bool)
    sync = ~np.array(is_async, bool) & (thread == np.array(end_threads, np.int64))
    span = (end - start) / 1e3  # us, as FunctionEvent's time range
    _on_their_ops_threads(events, thread, on_cpu, sync, linked)

    parent = _parents(start, end, thread, np.flatnonzero(on_cpu & sync), n)
    renamed = {k: _key(k) for k in set(names)}
    key = np.array([renamed[k] for k in names], object)
    child = np.flatnonzero(parent >= 0)
    only = np.bincount(parent[child], minlength=n) == 1
    merged = child[(key[child] == key[parent[child]]) & only[parent[child]]]  # into its parent: one call
    kept = np.ones(n, bool)
    kept[merged] = False
    up = np.arange(n)  # a merged event's children are its nearest kept ancestor's
    up[merged] = parent[merged]
    while not np.array_equal(up[up], up):
        up = up[up]
    parent = np.where(parent >= 0, up[np.maximum(parent, 0)], -1)
    has = kept & (parent >= 0)
    children_us = np.zeros(n)
    np.add.at(children_us, parent[has], span[has])  # children: host events, as their parents
    self_us = np.where(sync, np.where(on_cpu, span - children_us, span), 0.0)
    named = {t: t.name.lower() for t in set(types)}
    groups: dict[tuple[str, str, bool], int] = {}  # (key, device, annotation): its group, in order met
    keys = key.tolist()
    rows = np.flatnonzero(kept).tolist()
    of = np.array([groups.setdefault((keys[i], named[types[i]], annotation[i]), len(groups)) for i in rows], np.int64)
    return pd.DataFrame(list(groups), columns=list(FIELDS[:3])).assign(
        count=np.bincount(of, minlength=len(groups)),
        self_us=np.bincount(of, weights=self_us[kept], minlength=len(groups)),
        total_us=np.bincount(of, weights=np.where(on_cpu, span, 0.0)[kept], minlength=len(groups)),
    )


def _key(name: str) -> str:
    """key_averages' name of an event: demangled (a kernel's), the schedule's steps as one."""
    import torch

    return "ProfilerStep*" if name.startswith("ProfilerStep#") else torch._C._demangle(name) if len(name) > 1 else name


def _on_their_ops_threads(
    events: list[Any], thread: np.ndarray, on_cpu: np.ndarray, sync: np.ndarray, linked: np.ndarray
) -> None:
    """A host event linked to an op (a kernel's launch) takes the op's thread (in place)."""
    if not (linked > 0).any():
        return
    ops = np.flatnonzero(on_cpu & sync & (linked == 0))
    of = dict(zip((events[i].correlation_id() for i in ops), thread[ops].tolist()))
    for i in np.flatnonzero(on_cpu & (linked > 0)):
        thread[i] = of.get(int(linked[i]), thread[i])


def _parents(start: np.ndarray, end: np.ndarray, thread: np.ndarray, tree: np.ndarray, n: int) -> np.ndarray:
    """Each event's innermost enclosing event on its thread (-1: none, or not in ``tree``): the
    events by thread, start, longest first, each on a stack of the spans still open."""
    parent = np.full(n, -1, np.int64)
    order = tree[np.lexsort((-end[tree], start[tree], thread[tree]))]
    open_: list[tuple[int, int]] = []  # (event, its end)
    last = None
    for i, t, s, e in zip(order.tolist(), thread[order].tolist(), start[order].tolist(), end[order].tolist()):
        if t != last:
            open_, last = [], t
        while open_ and (s >= open_[-1][1] or e > open_[-1][1]):
            open_.pop()
        if open_:
            parent[i] = open_[-1][0]
        open_.append((i, e))
    return parent
