"""Does a FAIL name what moved? A user's small model with one thing changed on the new side,
judged by ``perflab ab`` (its why pass) and by ``perflab compare --why`` of the two profiled
trees that pass wrote; and the same model unchanged (A/A).

The model (a package this script writes to a scratch folder, on ``PYTHONPATH``): tokens from a
linear layer, blocks of layer norm, attention (``scaled_dot_product_attention``), layer norm,
linear, GELU, linear; ``inject`` changes one thing on the new side only: ``perflab ab --new
+model.inject=CASE`` (both sides in one process, in turns), ``WHY_INJECT=CASE`` in the
profiled trees' new side (a config key would set its points apart from the base's):

- ``linear``: every linear layer's matrix product gets 25 % more work (one more ``aten::addmm``
  a call, for a quarter of its outputs, held: no other operator); about half of the
  model's time, so the point moves ~15 %. Measured apart (``--truth``), the products' time
  moves +33..+38 %: the extra call's own cost weighs more than its work (a sixth of the
  outputs moves it as much);
- ``gelu``: GELU gets 25 % more work (one more call per block on a held tensor a quarter of its
  input's size: aten::gelu only); GELU is ~10 % of the model: the point moves ~2 %, under a
  gate of a few percent, so no FAIL is expected, only the operators' rows;
- ``copy``: a new copy of 1.5 MB a block (``target.copy_(source)``, held buffers: one more
  aten::copy_ a block, no allocation);
- ``graph_break``: ``torch._dynamo.graph_break()`` in each block (after attention) and between
  the blocks, the model compiled by Inductor (``experiment.compile=true``: ~5 s a side and
  process here with its cache warm, ~20 s cold), batches of 2: a break costs ~75 us a call on
  this CPU (a 3 ms call of 32 moves ~3 %, one of 2 ~20 %; under ``aot_eager`` nothing measurable).

Per case: two profiled trees (``bench.processes`` a side, ``bench.profile=true``) judged by
``perflab compare --why`` (``tool=compare``) and every point's operators whatever its verdict
(``tool=operators``: what a FAIL would name); with ``--ab``, ``perflab ab --why`` too. Per run:
the verdict, the operators named (first, its change, the others), the injected change, the
profiled call's cost against the timed one, seconds and the load; to ``--out``.

Goals (#44): the FAIL names the changed operator first (``linear``), its change within +-10 points
of the injected one (``--truth``: what the injection does to its operator, measured apart in one
process), no other operator named; the same for the copy and the graph break (named as
appeared, or called more); A/A: none named; the profiled pass <= 1.5x the timed one.

    python benchmarks/why.py [--runs 1] [--processes 3] [--ab --budget 2 --gate 5] [--no-trees] [--busy] [--train]
                             [--truth] [--cases aa,linear,gelu,copy,graph_break] [--out benchmarks/results/why.csv]

``--busy``: a process spins on a CPU the whole time (a CI runner's neighbour); ``--no-trees``:
``perflab ab --why`` only (the goal's runs), not the two profiled trees of ``bench.processes``;
``--train``: also ``quick/train`` under ``bench.profile=true``, each measurement's profiled call
against its timed median and its whole pass (``profile_s``) against the timed samples (``tool=train``);
``--truth``: each case's change to its operator, in one process (``tool=truth``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _neighbours import spinning
from _results import append

ROOT = Path(__file__).resolve().parents[1]
MODEL = '''
import os

import torch
from torch import nn
from torch.nn import functional as F


class Held(dict):
    """Tensors an injection works on, made in the warm-up: never in a timed or profiled call."""

    def of(self, key, make):
        if key not in self:
            self[key] = make()
        return self[key]


class MoreGelu(nn.Module):
    """GELU with 25 % more work: one more call on a held tensor a quarter of its input's size."""

    def __init__(self) -> None:
        super().__init__()
        self.held = Held()

    def forward(self, x):
        F.gelu(self.held.of(x.shape, lambda: torch.randn(*x.shape[:-1], x.shape[-1] // 4)))
        return F.gelu(x)


class MoreLinear(nn.Linear):
    """A linear layer whose matrix product has 25 % more work: one more aten::addmm a call, for a
    quarter of its outputs (the weight's columns held, beta=0: no bias copied), no other operator."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held = Held()

    def forward(self, x):
        rows = self.held.of(x.shape, lambda: x.reshape(-1, x.shape[-1]).clone())
        quarter = self.held.of("weight", lambda: self.weight.detach()[: self.out_features // 4 or 1].t().contiguous())
        out = self.held.of((x.shape, "out"), lambda: torch.empty(rows.shape[0], quarter.shape[1]))
        torch.addmm(out, rows, quarter, beta=0, out=out)
        return super().forward(x)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, inject: str) -> None:
        super().__init__()
        linear = MoreLinear if inject == "linear" else nn.Linear
        self.heads, self.inject = heads, inject
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = linear(d, 3 * d), linear(d, d)
        self.up, self.down = linear(d, 4 * d), linear(4 * d, d)
        self.act = MoreGelu() if inject == "gelu" else nn.GELU()
        if inject == "copy":  # 1.5 MB copied a block: a user's new copy (a cache, a buffer)
            self.register_buffer("source", torch.randn(3 << 17), persistent=False)
            self.register_buffer("target", torch.empty(3 << 17), persistent=False)

    def forward(self, x):
        if self.inject == "copy":
            self.target.copy_(self.source)
        b, t, d = x.shape
        qkv = self.qkv(self.norm1(x)).split(d, -1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in qkv)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        if self.inject == "graph_break":  # a user's .item() or print: the block in two graphs
            torch._dynamo.graph_break()
        return x + self.down(self.act(self.up(self.norm2(x))))


class Model(nn.Module):
    """A user's small model: linear, attention, layer norm, GELU; ``inject`` (else WHY_INJECT)
    changes one thing."""

    def __init__(self, num_classes=10, in_channels=1, tokens=16, d=64, depth=2, inject=None):
        super().__init__()
        self.inject = inject = os.environ.get("WHY_INJECT", "") if inject is None else inject
        self.tokens, self.d = tokens, d
        linear = MoreLinear if inject == "linear" else nn.Linear
        self.inp = linear(in_channels * 28 * 28, tokens * d)  # quick/infer's images: 28 x 28
        self.blocks = nn.ModuleList(Block(d, 4, inject) for _ in range(depth))
        self.head = linear(d, num_classes)

    def forward(self, x):
        x = self.inp(x.flatten(1)).view(-1, self.tokens, self.d)
        for block in self.blocks:
            x = block(x)
            if self.inject == "graph_break":
                torch._dynamo.graph_break()
        return self.head(x.mean(1))
'''

CASES = {
    "aa": ("", [], 0.0, ""),
    "gelu": ("gelu", [], 25.0, "aten::gelu"),  # GELU is ~10 % of this model: the point moves ~2 %
    "linear": ("linear", [], 25.0, "aten::addmm"),  # the matrix products, ~half of it: ~12 %
    "copy": ("copy", [], None, "aten::copy_"),
    "graph_break": ("graph_break", ["experiment.compile=true", "experiment.batches=[2]"], None, "Torch-Compiled"),
}


def shared_of(case: str) -> list[str]:
    own = CASES[case][1]
    batches = [] if any(o.startswith("experiment.batches=") for o in own) else ["experiment.batches=[32]"]
    shared = ["+experiment=quick/infer", "model._target_=whymodel.Model", *batches]
    return [*shared, "results.table=false", "devices.threads=1", *own]


def by_ab(case: str, budget: float, gate: float, work: Path, env: dict[str, str]) -> list[dict[str, object]]:
    """``perflab ab --why``: its verdict and the operators its why pass named."""
    inject, _, injected_pct, target = CASES[case]
    out = work / f"ab-{case}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "perflab", "ab", *shared_of(case), "--budget", str(budget), "--max-processes", "6"]
    cmd += ["--out", str(out), "--format", "json", "--fail-if-slower", str(gate), "--why"]
    cmd += ["--new", f"+model.inject={inject}"] if inject else []
    load, start = os.getloadavg()[0], time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=budget * 60 + 600)
    rows = [judged("ab", case, points_of(done.stdout), injected_pct, target) | pass_cost(out / "why")]
    if done.returncode not in (0, 1, 3):  # no verdict: what ended it
        rows[0]["error"] = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return [dict(r, seconds=round(time.monotonic() - start, 1), load_before=round(load, 2)) for r in rows]


def by_trees(case: str, processes: int, gate: float, work: Path, env: dict[str, str]) -> list[dict[str, object]]:
    """Two profiled trees (``bench.processes`` a side, ``bench.profile=true``), judged by
    ``perflab compare --why``, and every point's operators (``attribution.explain(every=True)``),
    whatever the point's verdict."""
    inject = CASES[case][0]
    out = work / f"trees-{case}-{time.monotonic_ns()}"
    load, start = os.getloadavg()[0], time.monotonic()
    for side, value in (("base", ""), ("new", inject)):
        over = [*shared_of(case), "bench.profile=true", f"bench.processes={processes}", f"results.store={out / side}"]
        ran = subprocess.run(
            [sys.executable, "-m", "perflab", *over],
            capture_output=True,
            text=True,
            cwd=work,
            env={**env, "WHY_INJECT": value},
            timeout=1800,
        )
        if ran.returncode:
            return [{"tool": "trees", "case": case, "error": (ran.stderr.strip().splitlines() or [""])[-1]}]
    rows = [r | pass_cost(out) for r in by_compare(case, out, gate, work, env)]
    return [dict(r, seconds=round(time.monotonic() - start, 1), load_before=round(load, 2)) for r in rows]


def by_compare(case: str, trees: Path, gate: float, work: Path, env: dict[str, str]) -> list[dict[str, object]]:
    _, _, injected_pct, target = CASES[case]
    cmd = [sys.executable, "-m", "perflab", "compare", str(trees / "base"), str(trees / "new"), "--why"]
    cmd += ["--fail-if-slower", str(gate)]
    shown = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, cwd=work, env=env)
    rows = [judged("compare", case, points_of(shown.stdout), injected_pct, target)]
    sys.path.insert(0, str(ROOT))
    from perflab.analysis import attribution, comparison
    from perflab.compare import to_json

    table = comparison.ab(trees / "base", trees / "new", gate_pct=gate)
    table = attribution.explain(table[table["measurement"] != "load"], trees / "base", trees / "new", every=True)
    rows.append(judged("operators", case, points_of(to_json(table, two_trees=True)), injected_pct, target))
    return rows


def truth(case: str, work: Path, rounds: int = 15, calls: int = 20) -> list[dict[str, object]]:
    """What the injection does to its operator, measured apart: both models in this process (one
    thread, the same weights), profiled in turns, ``rounds`` of ``calls`` calls a side; the
    target's self time per call, median of the rounds' ratios (and their quartiles)."""
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    inject, _, _, target = CASES[case]
    if not target.startswith("aten::"):
        return []
    sys.path.insert(0, str(work))
    import whymodel

    torch.set_num_threads(1)
    x = torch.randn(32, 1, 28, 28)
    models = []
    for side in ("", inject):
        torch.manual_seed(0)
        models.append(whymodel.Model(inject=side).eval())

    def target_s(model) -> float:
        with profile(activities=[ProfilerActivity.CPU]) as p:
            for _ in range(calls):
                model(x)
        return sum(e.self_cpu_time_total for e in p.key_averages() if e.key == target) / calls / 1e6

    load, start = os.getloadavg()[0], time.monotonic()
    with torch.no_grad():
        for model in models:
            target_s(model)  # warm: the held tensors made, the profiler set up
        ratios = []
        for _ in range(rounds):  # base then new, each round: the machine's moment on both
            base_s = target_s(models[0])
            ratios.append(target_s(models[1]) / base_s)
    q1, mid, q3 = (100 * (v - 1) for v in np.percentile(ratios, [25, 50, 75]))
    return [
        {"tool": "truth", "case": case, "first_moved": target, "first_change_pct": mid}
        | {"why_moved": f"{rounds} rounds of {calls} calls a side: quartiles {q1:+.0f}..{q3:+.0f} %"}
        | {"seconds": round(time.monotonic() - start, 1), "load_before": round(load, 2)}
    ]


def pass_cost(trees: Path) -> dict[str, object]:
    """The profiled passes' seconds (``profile_s``) against the timed samples' (n x calls x mean)
    of the profiled trees under ``trees`` (a why pass's, or by_trees'): what profiling cost."""
    sys.path.insert(0, str(ROOT))
    from perflab.results import load

    try:
        rows = load(*(p for p in trees.iterdir() if p.is_dir()))
    except (FileNotFoundError, OSError):
        return {}
    rows = rows[rows["measurement"] != "load"] if "profile_s" in rows else rows.iloc[:0]
    timed = (rows["n"] * rows["calls_per_sample"] * rows["mean_s"]).sum()
    return {"pass_cost_x": rows["profile_s"].sum() / timed} if len(rows) and timed > 0 else {}


def training_cost(work: Path, env: dict[str, str]) -> list[dict[str, object]]:
    """The profiled pass's cost in training (goal <= 1.5x): ``quick/train`` with
    ``bench.profile=true``, per measurement: a profiled call against its timed median
    (``profile_cost_x``: what the profiler slows a call) and the whole pass (``profile_s``: its
    warm-up call, calls, trace) against the timed samples' seconds (``pass_cost_x``)."""
    out = work / f"train-{time.monotonic_ns()}"
    load, start = os.getloadavg()[0], time.monotonic()
    over = ["+experiment=quick/train", "bench.profile=true", "results.table=false", f"results.store={out}"]
    ran = subprocess.run([sys.executable, "-m", "perflab", *over], capture_output=True, text=True, cwd=work, env=env)
    if ran.returncode:
        return [{"tool": "train", "case": "profile", "error": (ran.stderr.strip().splitlines() or [""])[-1]}]
    sys.path.insert(0, str(ROOT))
    from perflab import results

    per_call = results.load_operators(out).groupby("measurement")[["profiled_s", "median_s"]].first()
    rows = results.load(out).set_index("measurement")
    timed = rows["n"] * rows["calls_per_sample"] * rows["mean_s"]  # the timed samples' seconds
    seconds = round(time.monotonic() - start, 1)
    return [
        {"tool": "train", "case": name, "profile_cost_x": r.profiled_s / r.median_s, "seconds": seconds}
        | {"pass_cost_x": rows.loc[name, "profile_s"] / timed[name], "load_before": round(load, 2)}
        for name, r in per_call.iterrows()
    ]


def points_of(stdout: str) -> list[dict]:
    try:
        return [p for p in json.loads(stdout)["points"] if p.get("measurement") != "load"]
    except (ValueError, KeyError):
        return []


def judged(tool: str, case: str, points: list[dict], injected_pct: float | None, target: str) -> dict[str, object]:
    """What a verdict said of the injected change: the point, the operators named, the cost."""
    p = points[0] if points else {}
    moved = [m for m in p.get("moved") or [] if m.get("kind") != "range" or "Compiled" in str(m.get("operator"))]
    first = moved[0] if moved else {}
    return {
        "tool": tool,
        "case": case,
        "verdict": p.get("verdict", ""),
        "change_pct": p.get("change_pct"),
        "processes": p.get("new_processes"),
        "first_moved": first.get("operator", ""),
        "first_verdict": first.get("verdict", ""),
        "first_change_pct": first.get("change_pct"),
        "first_calls": first.get("calls", ""),
        "injected_pct": injected_pct,
        "target_first": bool(target) and str(first.get("operator", "")).startswith(target),
        "others_named": "; ".join(str(m.get("operator")) for m in moved[1:]),
        "why_moved": p.get("why_moved", ""),
        "profile_cost_x": p.get("profile_cost_x"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--budget", type=float, default=2.0, help="minutes a perflab ab run")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--processes", type=int, default=3, help="a side, in the profiled trees")
    parser.add_argument("--ab", action="store_true", help="also perflab ab --why (minutes a run)")
    parser.add_argument("--gate", type=float, default=5.0, help="--fail-if-slower of ab and compare (percent)")
    parser.add_argument("--no-trees", action="store_true", help="not the two profiled trees: ab only")
    parser.add_argument("--busy", action="store_true", help="a process spins on a CPU the whole time")
    parser.add_argument("--train", action="store_true", help="also the profiled pass's cost in training")
    parser.add_argument("--truth", action="store_true", help="also each case's change to its operator, in-process")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "why.csv")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="why-"))
    (work / "whymodel.py").write_text(MODEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with spinning(int(args.busy), settle_s=2.0):
        for case in args.cases.split(","):
            for k in range(args.runs):
                rows = [] if args.no_trees else by_trees(case, args.processes, args.gate, work, env)
                rows += by_ab(case, args.budget, args.gate, work, env) if args.ab else []
                for row in rows:
                    row.update(run=k + 1, budget_min=args.budget, gate_pct=args.gate, busy=args.busy)
                    print(json.dumps(row), flush=True)
                append(args.out, rows)
        for case in args.cases.split(",") if args.truth else []:
            rows = [dict(r, busy=args.busy) for r in truth(case, work)]
            print(*map(json.dumps, rows), sep="\n", flush=True)
            append(args.out, rows)
        for k in range(args.runs if args.train else 0):
            rows = [dict(r, run=k + 1, busy=args.busy) for r in training_cost(work, env)]
            print(*map(json.dumps, rows), sep="\n", flush=True)
            append(args.out, rows)


if __name__ == "__main__":
    main()
