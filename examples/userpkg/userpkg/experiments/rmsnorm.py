"""RMSNorm: my hand-written userpkg.ops.rms_norm against torch's fused F.rms_norm, in GB/s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from perflab.experiment import ExperimentConfig, Figure, Samples, Section, Setup, one_of, positive

if TYPE_CHECKING:  # torch and pandas only inside functions: a config mistake never waits for them
    from pandas import DataFrame

    from perflab.experiment import Context

METRIC = "gbps"  # what compare and the tables judge it by (higher is better: a rate)
EPS = 1e-6


@dataclass
class Config(ExperimentConfig):
    """Its knobs, with defaults: `perflab +experiment=rmsnorm` needs no YAML."""

    rows: int = 2048  # vectors normalized per call
    features: int = 1024  # their width
    dtype: str = "float32"  # float32 | bfloat16

    def __post_init__(self) -> None:  # a bad value is one line, before anything runs
        positive(self, "rows", "features")
        one_of(self, "dtype", ("float32", "bfloat16"))


def run(ctx: Context) -> None:
    """Mine and torch's, checked to agree, then timed in interleaved rounds, on each device."""
    for device in ctx.devices:
        mine_and_torchs(ctx, device)


def mine_and_torchs(ctx: Context, d: Any) -> None:
    import torch
    import torch.nn.functional as F

    from perflab.experiment import Part
    from userpkg.ops import rms_norm

    p = ctx.params
    x = torch.randn(p.rows, p.features, device=d.torch, dtype=getattr(torch, p.dtype))
    w = torch.rand(p.features, device=d.torch, dtype=x.dtype)
    torch.testing.assert_close(rms_norm(x, w, EPS), F.rms_norm(x, (p.features,), w, EPS))  # else an error row
    moved = 2 * x.numel() * x.element_size()  # x read once, the result written once
    columns = {"items_unit": "rows"}
    ctx.measure_rounds(
        {
            f"{d.name} mine": Part(lambda: rms_norm(x, w, EPS), [d], items=p.rows, bytes=moved, extra=columns),
            f"{d.name} torch": Part(
                lambda: F.rms_norm(x, (p.features,), w, EPS), [d], items=p.rows, bytes=moved, extra=columns
            ),
        }
    )


def headline(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Under the job's table: mine beside torch's, per device."""
    ok = {str(r["measurement"]): r for r in rows if r.get("status") == "ok"}
    lines = []
    for name, mine in ok.items():
        theirs = ok.get(name.removesuffix(" mine") + " torch")
        if name.endswith(" mine") and theirs:
            ratio = mine["gbps"] / theirs["gbps"]
            lines.append(f"{name}: {mine['gbps']:.3g} GB/s, torch's {theirs['gbps']:.3g} GB/s: {ratio:.2f}x")
    return lines


def report(rows: DataFrame, samples: Samples) -> Section:
    """Its section of `perflab report`: the reference (torch's op) beside mine, and a figure."""
    return Section(
        title="RMSNorm: mine against torch's",
        reference="torch's",
        setup=[Setup("kernel", "F.rms_norm: one fused op", "userpkg.ops.rms_norm: pow, mean, add, rsqrt, 2 muls")],
        notes=["Both move the same bytes (x read, the result written): GB/s says how close each gets to memory speed."],
        figures=[
            Figure(
                "rmsnorm_bandwidth",
                bandwidth,
                rows,
                caption="A sweep over experiment.rows draws a line each.",
                why_none="no ok rows",
            )
        ],
    )


def bandwidth(rows: DataFrame) -> Any:
    """Your own figure builder: GB/s of mine and torch's against the rows per call."""
    import matplotlib.pyplot as plt

    ok = rows[rows["status"] == "ok"].dropna(subset=["gbps"])
    if ok.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for name, part in ok.groupby("measurement"):
        part = part.sort_values("cfg.experiment.rows")
        ax.plot(part["cfg.experiment.rows"], part["gbps"], "o-", label=name)
    ax.set(xscale="log", xlabel="rows per call", ylabel="bandwidth (GB/s)", title="RMSNorm: GB/s against rows")
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)  # beside the axes: never over a point
    return fig
