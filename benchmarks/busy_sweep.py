"""The first DDP sweep a student runs, beside a busy process: does any efficiency above 100 %
reach the report's headline or compare's table without its flag and its cause? (#41's goal.)

Runs ``perflab -m +experiment=quick/train trainer.batch_size=128,256 devices.count=1,2
strategy=ddp`` in a scratch folder, with a process spinning on a CPU the whole time (``--busy``),
then ``perflab compare outputs --format json`` and ``perflab report outputs``. A row per
compared point goes to ``--out``: its efficiency, what compare said of it (scaling note, suspect),
whether an efficiency above 100 % was flagged, the report's headline lines; the load beside it.

    python benchmarks/busy_sweep.py [--busy] [--repeats 1] [--out benchmarks/results/busy_sweep.csv]
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _neighbours import spinning
from _results import append

SWEEP = ["+experiment=quick/train", "trainer.batch_size=128,256", "devices.count=1,2", "strategy=ddp"]


def once(work: Path) -> list[dict[str, object]]:
    load = os.getloadavg()[0]
    start = time.monotonic()
    sweep = subprocess.run(
        [sys.executable, "-m", "perflab", "-m", *SWEEP], cwd=work, capture_output=True, text=True, timeout=1800
    )
    took = time.monotonic() - start
    report = [sys.executable, "-m", "perflab", "report", "outputs", "-o", "report.html"]
    subprocess.run(report, cwd=work, capture_output=True, timeout=600)
    page = (work / "report.html").read_text() if (work / "report.html").exists() else ""
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))  # the headline: "on 2 devices (...): 1.9x one device, ..."
    said = re.finditer(r"on \d+ devices \([^)]*\): \S+ one device, efficiency \d+%( \(SUSPECT)?", text)
    headline = [m.group(0) + (": ...)" if m.group(1) else "") for m in said]
    done = subprocess.run(
        [sys.executable, "-m", "perflab", "compare", "outputs", "--format", "json"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = json.loads(done.stdout)["rows"] if done.stdout.strip() else []
    out = []
    for r in rows:
        e = r.get("efficiency")
        said = "; ".join(str(r[k]) for k in ("scaling_note", "suspect") if r.get(k))
        out.append(
            {
                "batch": r.get("cfg.trainer.batch_size"),
                "devices": r.get("cfg.devices.count"),
                "items_per_s": r.get("items_per_s"),
                "efficiency": e,
                "said": said,
                # the goal: above 100 % never without its flag and its cause
                "above_100_flagged": None if e is None or e <= 1 else "above 100 %" in said,
                "headline": " | ".join(headline),
                "sweep_exit": sweep.returncode,
                "compare_exit": done.returncode,
                "sweep_s": round(took, 1),
                "load_before": round(load, 2),
                "load_after": round(os.getloadavg()[0], 2),
            }
        )
    return out or [{"sweep_exit": sweep.returncode, "compare_exit": done.returncode, "error": sweep.stderr[-300:]}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", action="store_true", help="a process spins on a CPU the whole time")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "busy_sweep.csv")
    args = parser.parse_args()
    with spinning(int(args.busy)):
        for k in range(args.repeats):
            rows = once(Path(tempfile.mkdtemp(prefix="busy-sweep-")))
            for row in rows:
                row.update(repeat=k + 1, busy=args.busy)
                print(json.dumps(row), flush=True)
            append(args.out, rows)


if __name__ == "__main__":
    main()
