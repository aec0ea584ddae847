"""13.1, compilers and interpreters: the book's setup beside the compile experiment's, its claim,
its size in the chapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.book import REFERENCE, SETUP_ONLY
from perflab.config.contract import Figure, Samples, Section, Setup

if TYPE_CHECKING:
    from pandas import DataFrame

    from perflab.analysis.claims import Claim, Tree
    from perflab.measure.sizing import Calibration, Point


def report(rows: DataFrame, samples: Samples) -> Section:
    """13.1: the book's network beside ours; when compiling pays off."""
    from perflab.analysis import plots
    from perflab.analysis.frames import per_run, with_samples

    def ours(r: Sequence[Mapping[str, Any]]) -> str:
        last = r[-1]
        return f"{last.get('model', '?')} on {last.get('input', '?')}, batch {last.get('cfg.experiment.batch', '?')}"

    return Section(
        number="13.1",
        title="Compilers",
        reference=REFERENCE,
        notes=[SETUP_ONLY],
        setup=[Setup("network", "MLP 512-256-128-2, one input of 512 values per call", per_run(rows, ours))],
        figures=[
            Figure(
                "compile_break_even",
                plots.compile_break_even,
                with_samples(rows, samples, "median_s"),
                caption="Dots: the call after which compiling has paid for itself.",
                why_none="compile break-even: needs an ok eager row and a compiled mode with its first call",
            )
        ],
    )


# --- the chapter (perflab chapter): its size and its claims -----------------------------------

CHAPTER_SHARE = 0.05
FIRST_COMPILE_S = 20.0  # torch.compile's first call on a cold cache: ~19 s measured on 2 busy cores ...
WARM_COMPILE_S = 6.0  # ... and on a warm one (inductor's FX graph cache): the job took 9-13 s, estimated 24 s at 20
SAMPLE_S = 1e-3  # a sample's cost beside the call: perflab's watchers, and stalls behind other processes
BOOK_CLAIM = "13.1: compiling (hybridizing) the network makes it run faster than imperative execution"
CLAIMED = {"torchscript": "TorchScript (torch.jit.script, the book's tool)", "compile-default": "torch.compile"}


def first_compile_s() -> float:
    """The first torch.compile call's seconds here: less where inductor's FX graph cache holds
    graphs already (a machine that compiled before), as it does after a first chapter. The cache
    is found where inductor puts it by default, without importing inductor (a second of imports,
    and it would create the folder) at every plan of the chapter."""
    import getpass
    import os
    import tempfile
    from pathlib import Path

    default = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"
    graphs = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default) / "fxgraph"
    return WARM_COMPILE_S if graphs.is_dir() and any(graphs.iterdir()) else FIRST_COMPILE_S


def chapter(machine: Calibration, seconds: float) -> list[Point]:
    """The book's setup (its MLP, one input per call) with eager, TorchScript and torch.compile;
    the first compile is a fixed cost, the samples fill the rest."""
    from perflab.measure import sizing

    call = max(20e-6, 15 * machine.op_us * 1e-6) + SAMPLE_S  # five small layers: a few framework calls each
    first = first_compile_s()
    spare = max(1.0, seconds - first - sizing.JOB_OVERHEAD_S)
    repeats = sizing.repeats_within(spare, 3 * call, lo=100, hi=1000)
    why = (
        f"{seconds:.0f} s of the budget: the book's setup (MLP, batch 1); ~{first:.0f} s for the first "
        f"torch.compile call, then {repeats} samples per mode (hundreds: calls of microseconds vary a lot)"
    )
    overrides = [
        "experiment.batch=1",
        "experiment.modes=[eager,torchscript,compile-default]",
        "experiment.serialize=false",
    ]
    estimate = first + repeats * 3 * call + sizing.JOB_OVERHEAD_S
    return [sizing.Point("13.1", "compile", overrides + sizing.bench(repeats, warmup=3), estimate, why)]


def claims(rows: DataFrame, tree: Tree) -> list[Claim]:
    """13.1: each compiled mode runs faster than eager, so its first call pays for itself after
    a finite number of calls (the break-even the row measured)."""
    from perflab.analysis import checks
    from perflab.store.rows import number

    out = []
    for _, run in rows.groupby("run_id", sort=False) if "run_id" in rows else [("", rows)]:
        records = run.to_dict("records")
        ok = {str(r["measurement"]): r for r in records if r.get("status") == "ok"}
        first = records[0]
        batch = number(first.get("cfg.experiment.batch")) or 0
        what = f"{first.get('model', 'the model')}, batch {batch:.0f}"
        for mode, tool in CLAIMED.items():
            statement = f"{tool} runs the network ({what}) faster than eager, so compiling pays off after N calls"
            if mode not in ok or "eager" not in ok:
                failed = next((r for r in records if r.get("measurement") in (mode, "eager", "job")), None)
                if failed is None or failed.get("status") == "ok":
                    continue  # not measured in this run
                why = f"{failed.get('measurement')}: {failed.get('status')}: {failed.get('error')}"
                out.append(checks.not_applicable("13.1", statement, BOOK_CLAIM, why))
                continue
            row = ok[mode]
            calls = number(row.get("break_even_calls"))
            pays = f"; pays off after {calls:.0f} calls" if calls is not None else "; never pays off"
            counts = {k: number(row.get(k)) for k in ("recompiles", "graph_breaks")}
            pays += "".join(f", {k.replace('_', ' ')} {v:.0f}" for k, v in counts.items() if v is not None)
            outcome = checks.claim(
                "13.1",
                statement,
                BOOK_CLAIM,
                "speedup > 1x; N = first call / time saved per call",
                "the 95% interval of the speedup above 1; below 1.05x at its top: not faster",
            )
            out.append(checks.faster(outcome, tree, ok["eager"], row, detail=pays))
    return out
