"""perflab's generate call against the call torch.utils.benchmark's side of benchmarks/inference.py
times, in one process, alternated call by call (the order turned each time), so that a busy
machine falls on both alike: what perflab adds to a call of a small GPT-2 (4 layers, 256 wide,
64 random prompt ids, one thread), whatever the machine's load. Issue 30.

Three paths, one model instance, under inference_mode:
- torch: ``generate`` with perflab's kwargs, nothing more (benchmarks/inference.py's torch side);
- perflab: perflab's ``Generator.run`` (experiments/generate.py: the same kwargs and a streamer
  that reads each token's clock);
- perflab + around: that, with the measure loop's per-sample bookkeeping (peak RSS, energy
  counters, GPU state) around each call, outside the clock, as ``ctx.measure`` does.

Printed and written per path and clock (wall, and the thread's CPU time, which a busy machine
inflates less): best, the mean of the best 10 %, median, each over torch's, and the median of
the paired differences (call i of a path minus call i of torch's).

    python benchmarks/generate_overhead.py [--new-tokens 1 16] [--calls 200] [--out CSV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
from _results import append
from inference import GPT2, PROMPT, generate_kwargs

from perflab.experiments.generate import Generator
from perflab.measure.devices import Device
from perflab.measure.instruments import Energy, GpuState, Memory

ROOT = Path(__file__).resolve().parents[1]


Sample = tuple[Callable[[], object], Callable[[], Any]]  # the call, and what wraps it outside the clock


def paths(lm: Any, new: int) -> dict[str, Sample]:
    ids = torch.randint(0, GPT2["vocab_size"], (1, PROMPT))
    kwargs = generate_kwargs(ids)
    cpu = Device("cpu", "cpu", None, 1)
    gen = Generator(lm, cpu)
    memory, energy, gpu = Memory([cpu]), Energy([cpu]), GpuState([cpu])

    @contextlib.contextmanager
    def around() -> Any:
        with memory.sample("x"), energy.sample("x"):
            yield
        gpu.sampled()

    return {
        "torch": (lambda: lm.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs), contextlib.nullcontext),
        "perflab": (lambda: gen.run(ids, new), contextlib.nullcontext),
        "perflab + around": (lambda: gen.run(ids, new), around),
    }


def alternated(calls: dict[str, Sample], n: int) -> dict[str, dict[str, list[float]]]:
    """Seconds of each call, wall and thread CPU, ``n`` times each, the order turned each time."""
    names = list(calls)
    got: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in names}
    for call, _ in calls.values():
        for _ in range(3):
            call()
    for i in range(n):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            call, outside = calls[name]
            with outside():
                c0, t0 = time.thread_time(), time.perf_counter()
                call()
                wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            got[name]["wall"].append(wall)
            got[name]["cpu"].append(cpu)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "generate_overhead.csv"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoConfig, AutoModelForCausalLM

    rows = []
    with tempfile.TemporaryDirectory() as work:
        folder = str(Path(work) / "gpt2")
        config = AutoConfig.for_model("gpt2", **GPT2, bos_token_id=0, eos_token_id=0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config).save_pretrained(folder)
        lm = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
        for new in args.new_tokens:
            with torch.inference_mode():
                got = alternated(paths(lm, new), args.calls)
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            for clock in ("wall", "cpu"):
                base = got["torch"][clock]
                for name, by in got.items():
                    a = by[clock]
                    best10 = statistics.mean(sorted(a)[: max(1, len(a) // 10)])
                    base10 = statistics.mean(sorted(base)[: max(1, len(base) // 10)])
                    paired = statistics.median(x - y for x, y in zip(a, base))
                    print(
                        f"new_tokens {new:3} {clock:4} {name:17} "
                        f"best {min(a) * 1e3:8.3f} ms ({min(a) / min(base):.4f}), "
                        f"best 10% {best10 * 1e3:8.3f} ({best10 / base10:.4f}), median "
                        f"{statistics.median(a) * 1e3:8.3f} ({statistics.median(a) / statistics.median(base):.4f}); "
                        f"paired difference {paired * 1e3:+.3f} ms (load {load})"
                    )
                    rows.append(
                        {
                            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "new_tokens": new,
                            "clock": clock,
                            "path": name,
                            "best_s": f"{min(a):.6g}",
                            "best10_s": f"{best10:.6g}",
                            "median_s": f"{statistics.median(a):.6g}",
                            "ratio_best": f"{min(a) / min(base):.4f}",
                            "ratio_best10": f"{best10 / base10:.4f}",
                            "ratio_median": f"{statistics.median(a) / statistics.median(base):.4f}",
                            "paired_diff_median_s": f"{paired:.6g}",
                            "calls": args.calls,
                            "load": load,
                            "machine": platform.node(),
                        }
                    )
    append(Path(args.out), rows)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
