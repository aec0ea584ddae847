"""perflab's per-sample overhead on short calls: a bare loop (``t0 = perf_counter(); fn();
t1 = perf_counter()``) against perflab's measure loop with the job's watchers as
``Context.measure`` sets them (peak RSS and energy read around a part's run of samples;
GPU state and the status line per sample), and against the watchers read around every sample
(perflab before issue 30), in one process, in blocks of samples whose order turns each round,
so that a busy machine falls on every path alike. Calls: a 128x128 and a 384x384 matmul (about
50 us and 1 ms on one core) and a tiny Llama (2 layers, 64 wide, random weights, batch 1,
16 tokens). One intra-op thread.

Printed and written per call, path and clock (wall, and the thread's CPU time, which a busy
machine inflates less): best, 10th percentile and median in us, and each minus the bare loop's.

    OMP_NUM_THREADS=1 python benchmarks/bench_overhead.py [--samples 100] [--rounds 8] [--out CSV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from _results import append

from perflab.job.context import Status
from perflab.measure import bench
from perflab.measure.devices import Device
from perflab.measure.instruments import Instruments

ROOT = Path(__file__).resolve().parents[1]
CPU = Device("cpu", "cpu", None, 1)


def calls() -> dict[str, Callable[[], object]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    out: dict[str, Callable[[], object]] = {}
    for n in (128, 384):
        a, b = torch.randn(n, n), torch.randn(n, n)
        out[f"matmul {n}"] = lambda a=a, b=b: a @ b
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
    )
    llama, ids = LlamaForCausalLM(cfg).eval(), torch.randint(0, 256, (1, 16))
    out["tiny llama b1x16"] = lambda: llama(ids)
    return out


def watchers(per_sample: bool) -> dict[str, Any]:
    """``around`` and ``around_run`` as Context.measure_rounds builds them from the registered
    instruments; ``per_sample``: their runs' readers around every sample, as before issue 30."""
    instruments, status = Instruments([CPU]), Status("x")
    after_sample = [*instruments.after_sample, status.sampled]

    @contextlib.contextmanager
    def around(name: str) -> Iterator[None]:
        with instruments.run(name) if per_sample else contextlib.nullcontext():
            yield
        for after in after_sample:
            after()

    return {"around": around, "around_run": None if per_sample else instruments.run}


def paths(fn: Callable[[], object], n: int, clock: Callable[[], float]) -> dict[str, Callable[[], list[float]]]:
    def bare() -> list[float]:
        out = []
        for _ in range(n):
            t0 = clock()
            fn()
            t1 = clock()
            out.append(t1 - t0)
        return out

    def perflab(per_sample: bool) -> list[float]:
        v = {"": bench.Variant(fn, [CPU])}
        return bench.measure_rounds(v, warmup=0, repeats=n, clock=clock, **watchers(per_sample))[""].samples

    return {"bare": bare, "perflab": lambda: perflab(False), "perflab, watchers per sample": lambda: perflab(True)}


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").exists() else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100, help="samples per block")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/bench_overhead.csv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rows = []
    with torch.inference_mode():
        for call, fn in calls().items():
            for _ in range(20):
                fn()  # warm
            for clock_name, clock in (("wall", time.perf_counter), ("thread cpu", time.thread_time)):
                ways = paths(fn, args.samples, clock)
                got: dict[str, list[float]] = {w: [] for w in ways}
                names, before = list(ways), load()
                for r in range(args.rounds):
                    for w in names[r % len(names) :] + names[: r % len(names)]:
                        got[w] += ways[w]()
                after = load()
                base = sorted(got["bare"])
                for w, s in got.items():
                    s = sorted(s)
                    row = {
                        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "commit": commit.stdout.strip(),
                        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
                        "cpus": os.cpu_count(),
                        "torch": torch.__version__,
                        "call": call,
                        "clock": clock_name,
                        "path": w,
                        "samples": len(s),
                        "best_us": s[0] * 1e6,
                        "p10_us": s[len(s) // 10] * 1e6,
                        "median_us": statistics.median(s) * 1e6,
                        "best_over_bare_us": (s[0] - base[0]) * 1e6,
                        "p10_over_bare_us": (s[len(s) // 10] - base[len(base) // 10]) * 1e6,
                        "median_over_bare_us": (statistics.median(s) - statistics.median(base)) * 1e6,
                        "load_before": before,
                        "load_after": after,
                    }
                    rows.append(row)
                    print(
                        f"{call:17s} {clock_name:10s} {w:29s} best {row['best_us']:8.1f} p10 {row['p10_us']:8.1f} "
                        f"median {row['median_us']:8.1f} us; over bare: best {row['best_over_bare_us']:+6.1f} "
                        f"p10 {row['p10_over_bare_us']:+6.1f} (load {before:.1f}-{after:.1f})"
                    )
    append(args.out, rows)


if __name__ == "__main__":
    main()
