"""A profile read from the profiler's C++ results (perflab.measure.kineto) gives key_averages'
own table: the same operators, calls and self times, on a small model of nested ops."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from perflab.measure import kineto, operators


class Block(nn.Module):
    """Linear, GELU, layer norm, attention; a user's range, and one nested in its namesake."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(d)
        self.qkv, self.up, self.down = nn.Linear(d, 3 * d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        with record_function("attention"):
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(self.norm(x)).split(d, -1))
            x = x + F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        with record_function("mlp"), record_function("mlp"):  # one call to key_averages: merged
            return x + self.down(F.gelu(self.up(x)))


def _profiled(devices: list[str]) -> object:
    device = devices[-1]
    model = Block().to(device).eval()
    compiled = torch.compile(Block().to(device).eval(), backend="eager")
    x = torch.randn(4, 8, 32, device=device)

    def call() -> None:
        with torch.no_grad():
            compiled(model(x))

    call()  # compiled, warm
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if "cuda" in devices else [])]
    with profile(activities=activities) as p:
        for _ in range(3):
            call()
        if device == "cuda":
            torch.cuda.synchronize()
    return p


def _theirs(p: object) -> pd.DataFrame:
    rows = [
        (e.key, e.device_type.name.lower(), e.is_user_annotation, e.count)
        + (e.self_device_time_total if e.device_type.name == "CUDA" else e.self_cpu_time_total, e.cpu_time_total)
        for e in p.key_averages()  # type: ignore[attr-defined]
    ]
    return pd.DataFrame(rows, columns=list(kineto.FIELDS))


def _same(ours: pd.DataFrame, theirs: pd.DataFrame) -> None:
    key = ["key", "device", "annotation"]
    ours, theirs = (t.sort_values(key, ignore_index=True) for t in (ours, theirs))
    pd.testing.assert_frame_equal(ours[key], theirs[key], check_dtype=False)
    assert ours["count"].tolist() == theirs["count"].tolist()
    for c in ("self_us", "total_us"):
        pd.testing.assert_series_equal(ours[c], theirs[c], check_dtype=False, atol=1e-3, rtol=1e-9)


@pytest.mark.parametrize(
    "devices",
    [["cpu"], pytest.param(["cpu", "cuda"], marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="a GPU"))],
)
def test_the_events_summed_as_key_averages_sums_them(devices):
    p = _profiled(devices)
    ours = kineto.averages(p.profiler.kineto_results)  # type: ignore[attr-defined]
    theirs = _theirs(p)
    _same(ours, theirs)
    by = ours.set_index("key")
    for op in ("aten::linear", "aten::addmm", "aten::gelu", "aten::layer_norm", "aten::scaled_dot_product_attention"):
        assert by.loc[op, "count"].sum() >= 6 and by.loc[op, "self_us"].sum() >= 0, op  # both blocks, 3 calls
    # the eager block's 3 calls (dynamo leaves a compiled block's ranges out), each's two nested ranges as one
    assert by.loc["mlp", "count"] == 3, "a range nested in its namesake, its only child: one call"
    assert by.index.str.startswith(operators.COMPILED_REGION).any()
    if "cuda" in devices:
        assert (ours["device"] == "cuda").any(), "the kernels, on the device"


def test_where_the_private_api_fails_key_averages_gives_the_same_table(monkeypatch):
    p = _profiled(["cpu"])
    fast = operators.averaged(p)

    def changed(result: object) -> pd.DataFrame:
        raise AttributeError("'_KinetoEvent' object has no attribute 'start_ns'")  # as a torch that renamed it

    monkeypatch.setattr(kineto, "averages", changed)
    slow = operators.averaged(p)
    _same(fast, slow)
    key = ["operator", "kind", "device"]
    a, b = (operators.reduce([t], 3, 1e-3, False).sort_values(key, ignore_index=True) for t in (fast, slow))
    pd.testing.assert_frame_equal(a, b, check_exact=False, atol=1e-9)
    assert set(a["kind"]) == {"op", "range"} and a["operator"].str.startswith(operators.COMPILED_REGION).any()


def test_the_reading_pauses_the_garbage_collector_and_gives_it_back(monkeypatch):
    import gc

    p = _profiled(["cpu"])
    seen = []
    real = kineto._averages
    monkeypatch.setattr(kineto, "_averages", lambda r: seen.append(gc.isenabled()) or real(r))
    kineto.averages(p.profiler.kineto_results)  # type: ignore[attr-defined]
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        kineto.averages(p.profiler.kineto_results)  # type: ignore[attr-defined]
        assert not gc.isenabled(), "a caller's own pause is left as it was"
    finally:
        gc.enable()
