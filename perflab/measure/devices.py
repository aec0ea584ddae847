"""Device specs: resolve them against the machine, synchronize them, use CPU workers.

A CPU "device" may be split into several *workers* (``devices.spec=cpu devices.count=2``):
each worker is a thread with its share of the intra-op threads, so experiments that compare
"one device alone" with "all devices together" run on a CPU-only machine too, labelled so.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

import torch

from perflab.config.schema import DevicesConfig
from perflab.errors import ConfigError, MissingDevice


@dataclass(frozen=True)
class Device:
    """One device a job runs on. ``threads`` is set for CPU devices and workers."""

    name: str  # label in result rows: cuda:0, cpu, cpu#1 (worker 1 of the CPU)
    type: str  # cpu | cuda | mps
    index: int | None = None
    threads: int | None = None

    @property
    def torch(self) -> torch.device:
        return torch.device(self.type, self.index) if self.index is not None else torch.device(self.type)

    def description(self) -> str:
        if self.type == "cuda":
            return torch.cuda.get_device_name(self.index)
        if self.type == "cpu":
            return f"CPU ({self.threads} thread{'s' if self.threads != 1 else ''})"
        return self.type


@dataclass(frozen=True)
class Inventory:
    """What the machine has; injectable so resolution is testable without the hardware."""

    cuda: int
    mps: bool
    cpu_threads: int  # the job's intra-op threads, which CPU workers split
    cpus: int = 0  # the CPUs this process may use, one worker each at most (0: as many as cpu_threads)

    @classmethod
    def detect(cls) -> "Inventory":
        mps = getattr(torch.backends, "mps", None)
        return cls(
            cuda=torch.cuda.device_count() if torch.cuda.is_available() else 0,
            mps=bool(mps and mps.is_available()),
            cpu_threads=torch.get_num_threads(),
            cpus=allowed_cpus(),
        )


@dataclass(frozen=True)
class Resolved:
    devices: list[Device]
    fallback: str = ""  # non-empty when ``auto`` fell back to the CPU: said in every row

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.devices]


def resolve(cfg: DevicesConfig, inventory: Inventory | None = None) -> Resolved:
    """Turn a device spec into devices, or raise ConfigError / MissingDevice in one line."""
    inv = inventory or Inventory.detect()
    spec, count = cfg.spec, cfg.count
    if isinstance(spec, str) and spec == "auto":
        if inv.cuda:
            return Resolved(_cuda_devices(inv, count, spec))
        return Resolved(_cpu_workers(inv, count or 1), fallback="no CUDA device: ran on the CPU")
    if isinstance(spec, str) and spec == "cuda":
        return Resolved(_cuda_devices(inv, count, spec))
    if isinstance(spec, str) and spec == "cpu":
        return Resolved(_cpu_workers(inv, count or 1))
    try:
        parsed = cfg.parsed()
    except ConfigError as err:  # checked with the schema already; named in full here too
        raise type(err)(f"devices.{err.key}", err.value, err.allowed, err.problem) from None
    return Resolved(_from_names(parsed, inv, spec))


def _cuda_devices(inv: Inventory, count: int | None, spec: object) -> list[Device]:
    want = count or max(inv.cuda, 1)
    if inv.cuda < want:
        raise MissingDevice(
            "devices.count" if count else "devices.spec",
            count or spec,
            f"at most {inv.cuda}" if inv.cuda else "cpu or auto",
            problem=_have_cuda(inv),
        )
    return [Device(f"cuda:{i}", "cuda", i) for i in range(want)]


def _have_cuda(inv: Inventory) -> str:
    if not inv.cuda:
        return "this machine has no CUDA device"
    return f"this machine has {inv.cuda} CUDA device{'s' if inv.cuda > 1 else ''}"


def _cpu_workers(inv: Inventory, n: int) -> list[Device]:
    """``n`` workers of the CPU, at most one per CPU this process may use (more would time the
    OS scheduler, not the work), splitting the job's threads: under ``OMP_NUM_THREADS=1`` two
    workers are two CPUs of one thread each, not refused."""
    cpus = inv.cpus or inv.cpu_threads
    if n > cpus:
        raise MissingDevice(
            "devices.count",
            n,
            f"at most {cpus} CPU workers (one per core)",
            problem=f"this process may use {cpus} CPU{'s' if cpus != 1 else ''}",
        )
    if n == 1:
        return [Device("cpu", "cpu", threads=inv.cpu_threads)]
    share = max(1, inv.cpu_threads // n)
    return [Device(f"cpu#{i}", "cpu", threads=share) for i in range(n)]


def _from_names(parsed: list[tuple[str, int | None]], inv: Inventory, spec: object) -> list[Device]:
    """An explicit list (DevicesConfig.parsed); each ``cpu`` in it is one CPU worker (``[cpu,cpu]``: two)."""
    accelerators = [p for p in parsed if p[0] != "cpu"]
    cpu_workers = iter(_cpu_workers(inv, len(parsed) - len(accelerators)) if len(accelerators) < len(parsed) else [])
    devices = []
    for kind, index in parsed:
        if kind == "cuda":
            if index is None or index >= inv.cuda:
                allowed = f"cpu, cuda:0..cuda:{inv.cuda - 1}" if inv.cuda else "cpu or auto"
                raise MissingDevice("devices.spec", spec, allowed, problem=_have_cuda(inv))
            devices.append(Device(f"cuda:{index}", "cuda", index))
        elif kind == "mps":
            if not inv.mps:
                raise MissingDevice(
                    "devices.spec", spec, "cpu, cuda:N or auto", problem="this machine has no MPS device"
                )
            devices.append(Device("mps", "mps"))
        else:
            devices.append(next(cpu_workers))
    return devices


def allowed_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a container's cpuset),
    every CPU where the OS keeps none."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def intra_op_threads(setting: int | None, cpus: int | None = None, env: Mapping[str, str] = os.environ) -> int:
    """torch's intra-op threads for a job: ``devices.threads`` where set (refused above the
    CPUs this process may use), else ``OMP_NUM_THREADS`` where set, else every CPU this process
    may use; never more than those CPUs, whose threads would wait for each other at every
    barrier (docs/running.md#what-omp_num_threads-does)."""
    cpus = cpus or allowed_cpus()
    if setting is not None:
        if setting > cpus:
            raise MissingDevice(
                "devices.threads",
                setting,
                f"null or at most {cpus}",
                problem=f"this process may use {cpus} CPU{'s' if cpus != 1 else ''} (its affinity mask)",
            )
        return setting
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP allows a list per nesting level
    if first.isdigit() and int(first) >= 1:
        return min(int(first), cpus)
    return cpus


def use_threads(setting: int | None) -> int:
    """Set torch's intra-op threads to :func:`intra_op_threads` (a job does, before its work)."""
    n = intra_op_threads(setting)
    torch.set_num_threads(n)
    return n


def synchronize(devices: Sequence[Device]) -> None:
    """Wait until every queued kernel on every given device has finished."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d.index)
        elif d.type == "mps":
            torch.mps.synchronize()


@contextlib.contextmanager
def cpu_threads(n: int | None) -> Iterator[None]:
    """Run a block with ``n`` intra-op threads (a CPU worker's share), then restore."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def on_device(device: Device) -> Iterator[None]:
    """Make ``device`` current for the block: its CUDA index, or its CPU thread share."""
    if device.type == "cuda":
        with torch.cuda.device(device.index):
            yield
    elif device.type == "cpu":
        with cpu_threads(device.threads):
            yield
    else:
        yield


class Together:
    """Issue one function per device so that all devices work at the same time.

    CUDA work is queued from the calling thread (launches are asynchronous); each CPU
    device/worker runs in its own thread, since CPU ops block until they finish (torch
    releases the GIL inside them). Callers synchronize afterwards, as every timer does.
    """

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices = list(devices)
        self.cpus = [d for d in self.devices if d.type == "cpu"]
        self.pool = ThreadPoolExecutor(len(self.cpus)) if self.cpus else None
        self._threads_before = torch.get_num_threads()

    def run(self, fn: Callable[[Device], object]) -> None:
        futures = [self.pool.submit(_in_worker, fn, d) for d in self.cpus] if self.pool else []
        for d in self.devices:
            if d.type != "cpu":
                with on_device(d):
                    fn(d)
        for f in futures:
            f.result()

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown()
        torch.set_num_threads(self._threads_before)

    def __enter__(self) -> "Together":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _in_worker(fn: Callable[[Device], object], device: Device) -> object:
    torch.set_num_threads(device.threads or allowed_cpus())
    return fn(device)
