"""What perflab's own bookkeeping costs the work it measures: LeNet training (images/s) with
the per-sample memory and machine watchers on vs off, in the same process, in rounds whose
order alternates (on off, off on, ...), so that neither side always runs first. Goal
(issue 10): the watchers cost <= 2 % of images/s.

    python benchmarks/overhead.py [--rounds 4] [--out benchmarks/results/overhead.csv]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import perflab
from perflab.measure.instruments import Machine, Memory

TRAIN = ["data.train_size=8192", "data.test_size=256", "trainer.epochs=3", "data.on_device=true", "results.table=false"]


@contextlib.contextmanager
def watchers_off():
    """Memory.sample and Machine as no-ops: what perflab would be without them."""

    @contextlib.contextmanager
    def no_sample(self, name=""):
        yield

    class NoMachine(Machine):
        def __enter__(self):
            self.wall_s = self.busy_s = self.own_s = self.load_before = self.load_after = 0.0
            return self

        def __exit__(self, *exc):
            return None

    saved = Memory.sample, Machine
    Memory.sample = no_sample
    import perflab.train.loop as loop

    loop.Machine = NoMachine
    try:
        yield
    finally:
        Memory.sample = saved[0]
        loop.Machine = saved[1]


def images_per_s() -> float:
    df = perflab.run("train", TRAIN)
    return float(df[df["measurement"] == "train"]["items_per_s"].iloc[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "overhead.csv")
    args = parser.parse_args()
    on, off = [], []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for r in range(args.rounds):
            for watching in (True, False) if r % 2 == 0 else (False, True):
                if watching:
                    on.append(images_per_s())
                else:
                    with watchers_off():
                        off.append(images_per_s())
            print(f"round {r + 1}: watchers on {on[-1]:.0f} images/s, off {off[-1]:.0f} images/s")
    cost = 1 - statistics.median(on) / statistics.median(off)
    print(
        f"median: on {statistics.median(on):.0f}, off {statistics.median(off):.0f} images/s: the watchers "
        f"cost {cost:.1%} (goal <= 2%)"
    )
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        f.write("timestamp,host,round,watchers_on_images_per_s,watchers_off_images_per_s,cost\n")
        for i, (a, b) in enumerate(zip(on, off)):
            f.write(f"{when},{platform.node()},{i + 1},{a},{b},{cost}\n")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
