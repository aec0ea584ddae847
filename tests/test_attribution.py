"""Why a point moved: its operators judged one by one by the point's own statistics model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab.analysis import attribution

OPS = {"aten::addmm": 2e-3, "aten::gelu": 1e-3, "aten::native_layer_norm": 4e-4, "aten::add": 2e-4}


def side(rng, ops: dict[str, float], processes: int = 6, cv: float = 0.03, tag: str = "a") -> pd.DataFrame:
    """Operator lines of one point's processes, as operators.csv holds them."""
    lines = []
    for k in range(1, processes + 1):
        times = {name: t * rng.lognormal(0, cv) for name, t in ops.items()}
        wall = sum(times.values()) * 1.05
        for name, t in times.items():
            lines.append(
                dict(
                    row_id=f"{tag}{k}#1",
                    run_id=f"{tag}{k}",
                    process=str(k),
                    operator=name,
                    kind="op",
                    device="cpu",
                    calls=1.0,
                    self_s=t,
                    share=t / wall,
                    profiled_s=wall,
                    median_s=wall / 1.2,
                )
            )
        lines.append(
            dict(
                row_id=f"{tag}{k}#1",
                run_id=f"{tag}{k}",
                process=str(k),
                operator="forward",
                kind="range",
                device="cpu",
                calls=1.0,
                self_s=sum(times.values()),
                share=0.95,
                profiled_s=wall,
                median_s=wall / 1.2,
            )
        )
    return pd.DataFrame(lines)


def test_the_slowed_operator_is_named_first_with_its_change():
    rng = np.random.default_rng(1)
    base, new = side(rng, OPS), side(rng, {**OPS, "aten::gelu": 1.25e-3}, tag="b")
    found = attribution.attribute(base, new, paired=True)
    ops = found.moved[found.moved["kind"] == "op"]
    assert ops["operator"].tolist() == ["aten::gelu"], "the slowed op, and no other op"
    (gelu,) = ops.to_dict("records")
    assert gelu["verdict"] == "slower" and 15 <= gelu["change_pct"] <= 35
    assert gelu["ci_low"] > 1 and gelu["p_adjusted"] < 0.05
    assert abs(found.unexplained_pct) < 50, "the slowed op explains most of the point's change"
    assert found.cost_x == pytest.approx(1.2)
    assert "aten::gelu +2" in found.line()


def test_a_new_operator_is_named_as_appeared():
    rng = np.random.default_rng(2)
    base, new = side(rng, OPS), side(rng, {**OPS, "aten::copy_": 5e-4}, tag="b")
    found = attribution.attribute(base, new, paired=True)
    first = found.moved.iloc[0]
    assert (first["operator"], first["verdict"]) == ("aten::copy_", "appeared")
    assert set(found.moved.loc[found.moved["kind"] == "op", "operator"]) == {"aten::copy_"}
    assert "aten::copy_ appeared" in found.line()


def test_a_side_effect_that_moved_the_point_little_is_counted_not_named():
    """A new copy (most of the change) makes the next op a little slower, for real (tight, every
    process): under ``MIN_PART`` of the point's change it is minor, not a second culprit."""
    rng = np.random.default_rng(7)
    base = side(rng, OPS, cv=0.005)
    new = side(rng, {**OPS, "aten::copy_": 6e-4, "aten::add": 2.2e-4}, cv=0.005, tag="b")  # add +10 %
    found = attribution.attribute(base, new, paired=True)
    assert set(found.moved.loc[found.moved["kind"] == "op", "operator"]) == {"aten::copy_"}
    assert found.minor == 1 and "1 minor (under 5 % of the change each)" in found.line()
    assert found.records()["minor"] == 1
    assert abs(found.unexplained_pct) < 10, "the minor op's time is explained, only not named"
    # the same +10 % as the point's whole change is named
    alone = attribution.attribute(base, side(rng, {**OPS, "aten::add": 2.2e-4}, cv=0.005, tag="c"), paired=True)
    assert alone.moved["operator"].tolist()[:1] == ["aten::add"] and alone.minor == 0


def test_an_operator_called_more_is_named_where_it_takes_a_share_of_the_call():
    """Counts are exact, but an op of under ``MIN_SHARE`` of the call called more (the
    ``aten::resolve_conj`` of a matrix product with ``out=``) is not what moved the point."""
    rng = np.random.default_rng(5)
    ops = {**OPS, "aten::resolve_conj": 2e-6, "aten::copy_": 2e-4}
    base, new = side(rng, ops), side(rng, {**ops, "aten::copy_": 4e-4}, tag="b")
    for lines in (new.loc[new["operator"] == "aten::resolve_conj"], new.loc[new["operator"] == "aten::copy_"]):
        new.loc[lines.index, "calls"] = 2.0
    moved = attribution.attribute(base, new, paired=True).moved.set_index("operator")
    assert moved.loc["aten::copy_", "calls"] == "1 -> 2"
    assert moved.loc["aten::copy_", "verdict"] in ("slower", "more calls")
    assert "aten::resolve_conj" not in moved.index


def test_a_graph_break_names_the_compiled_region_that_appeared_first():
    """A graph break: a second compiled region a call, a second Dynamo cache lookup, and its
    cost spread over ops; the region that appeared is what the rest follows from."""
    rng = np.random.default_rng(6)
    lookup = "TorchDynamo Cache Lookup"
    base = side(rng, {**OPS, lookup: 1e-4})
    new = side(rng, {**OPS, "aten::addmm": 2.4e-3, lookup: 2e-4}, tag="b")
    new.loc[new["operator"] == lookup, "calls"] = 2.0

    def regions(lines: pd.DataFrame, *names: str) -> pd.DataFrame:  # ranges holding the forward
        forward = lines[lines["operator"] == "forward"]
        held = [
            forward.assign(operator=f"Torch-Compiled Region: {n}", self_s=forward["self_s"] / len(names)) for n in names
        ]
        return pd.concat([lines, *held], ignore_index=True)

    moved = attribution.attribute(regions(base, "0/0"), regions(new, "0/0", "1/0"), paired=True).moved
    assert moved.iloc[0][["operator", "verdict"]].tolist() == ["Torch-Compiled Region: 1/0", "appeared"]
    assert {"aten::addmm", lookup} <= set(moved["operator"])


def test_a_vanished_operator_is_named_as_disappeared():
    rng = np.random.default_rng(3)
    base, new = side(rng, OPS), side(rng, {k: v for k, v in OPS.items() if k != "aten::gelu"}, tag="b")
    found = attribution.attribute(base, new)
    assert found.moved.iloc[0][["operator", "verdict"]].tolist() == ["aten::gelu", "disappeared"]


def test_aa_names_no_operator_beyond_alpha():
    named = 0
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        found = attribution.attribute(side(rng, OPS), side(rng, OPS, tag="b"), paired=True)
        named += len(found.moved)
        assert "no operator changed beyond alpha" in found.line() or len(found.moved)
    assert named <= 2, f"{named} operators named in 20 A/A points"


def test_one_process_a_side_is_judged_against_the_floor():
    rng = np.random.default_rng(4)
    slowed = {**OPS, "aten::gelu": 1.25e-3}
    base, new = side(rng, OPS, processes=1, cv=0.01), side(rng, slowed, processes=1, cv=0.01, tag="b")
    found = attribution.attribute(base, new)
    assert found.moved.empty, "one process a side: a 25 % change is within what a 10 % floor leaves"
    quiet = attribution.attribute(base, new, floor=0.02)  # --process-cv 2: as quiet as they are
    assert quiet.moved["operator"].tolist() == ["aten::gelu"]


def test_points_to_explain():
    assert attribution.wanted({"verdict": "FAIL"})
    assert attribution.wanted({"verdict": "PASS", "significant": True, "speedup": 1.3})
    assert not attribution.wanted({"verdict": "PASS", "significant": False, "speedup": 1.3})
    assert not attribution.wanted({"verdict": "PASS", "significant": True, "speedup": 1.3}, faster=False)
    assert attribution.wanted({"verdict": "PASS"}, every=True)
    assert not attribution.wanted({"verdict": None}, every=True)


def tree(root, slowed: bool, rng, processes: int = 4) -> None:
    """A results tree of one point in ``processes`` runs, each with its operators.csv, numbers by hand:
    ``slowed``, its GELU twice as long (a 2 ms call of 3 ms)."""
    for k in range(1, processes + 1):
        one_process(root, f"{root.name}{k}", k, slowed, rng)


def one_process(root, name: str, k: int, slowed: bool, rng) -> None:
    """One run (process ``k``) of the point, its operators.csv beside its row."""
    from perflab.measure import operators
    from perflab.store.rundir import RunWriter

    ops = {**OPS, "aten::gelu": 2e-3 if slowed else 1e-3}
    times = {op: t * rng.lognormal(0, 0.02) for op, t in ops.items()}
    wall = sum(times.values())
    samples = list(wall * rng.lognormal(0, 0.01, 8))
    row = RunWriter(root / name).add(
        {
            "run_id": name,
            "process": k,
            "experiment": "matmul",
            "measurement": "cpu alone",
            "status": "ok",
            "n": 8,
            "median_s": float(np.median(samples)),
            "device_name": "CPU (2 threads)",
            "num_threads": 2,
            "cfg.experiment.size": 256,
        },
        samples=samples,
    )
    lines = pd.DataFrame(
        {"operator": list(times), "kind": "op", "device": "cpu", "calls": 1.0, "self_s": list(times.values())}
    )
    operators.write(root / name, row, lines.assign(share=lines["self_s"] / wall, profiled_s=wall * 1.1))


def test_compare_why_names_the_moved_operator_in_every_format(tmp_path, capsys):
    import json

    from perflab import compare

    rng = np.random.default_rng(5)
    for name, slowed in (("base", False), ("same", False), ("slow", True)):
        tree(tmp_path / name, slowed, rng)
    paths = [str(tmp_path / "base"), str(tmp_path / "slow")]
    assert compare.main([*paths, "--why"]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("why ")]
    assert line.split(": ", 1)[1].startswith("aten::gelu +") and "slower" in line, line
    assert "aten::addmm" not in line and "x the timed one" in line
    compare.main([*paths, "--why", "--format", "json"])
    (point,) = json.loads(capsys.readouterr().out)["points"]
    assert point["verdict"] == "FAIL" and point["why_moved"].startswith("aten::gelu")
    (gelu,) = point["moved"]
    assert gelu["operator"] == "aten::gelu" and 80 < gelu["change_pct"] < 120 and point["profile_cost_x"] > 1
    compare.main([*paths, "--why", "--format", "github"])
    (entry,) = json.loads(capsys.readouterr().out)["customSmallerIsBetter"]
    assert "moved: aten::gelu" in entry["extra"]
    compare.main([str(tmp_path / "base"), str(tmp_path / "same"), "--why"])
    said = [x for x in capsys.readouterr().out.splitlines() if x.startswith("why ")]
    assert not said, "A/A: no point FAILs, none is explained"
    assert compare.main([str(tmp_path / "base"), "--why"]) == 2, "--why judges two trees"


def test_without_operators_the_why_says_how_to_get_them(tmp_path, capsys):
    from perflab import compare

    rng = np.random.default_rng(6)
    for name, slowed in (("base", False), ("slow", True)):
        tree(tmp_path / name, slowed, rng)
    (tmp_path / "slow" / "slow1" / "operators.csv").unlink()
    for k in range(2, 5):
        (tmp_path / "slow" / f"slow{k}" / "operators.csv").unlink()
    compare.main([str(tmp_path / "base"), str(tmp_path / "slow"), "--why"])
    assert "bench.profile=true" in capsys.readouterr().out


@pytest.mark.slow
def test_live_profiled_runs_name_the_slowed_gelu(work, monkeypatch, one_thread):
    """Real jobs under bench.profile=true, a GELU called 4x in NEW: whatever the point's verdict
    on a shared machine (its times can swing 100x at a load of 10), its operators name the GELU
    (its calls, exactly) and no matmul."""
    import perflab
    from perflab.analysis import comparison

    from conftest import FAST

    over = ["model._target_=slowed.Slowed", "+model.width=32", "data.shape=[32]", "experiment.batches=[2048]"]
    for _ in range(3):  # A B A B ...: a machine whose load drifts slows both sides alike
        for side, slowed in (("base", ""), ("new", "gelu")):
            monkeypatch.setenv("WHY_SLOWED", slowed)
            perflab.run("quick/infer", [*over, *FAST, "bench.profile=true", f"results.store={work / side}"])
    table = comparison.ab(work / "base", work / "new", experiment="infer")
    table = attribution.explain(table[table["measurement"] != "load"], work / "base", work / "new", every=True)
    (found,) = table["_moved"].dropna()
    gelu = found.moved.set_index("operator").loc["aten::gelu"]
    assert gelu["calls"] == "1 -> 4" and gelu["verdict"] in ("slower", "more calls")
    assert not found.moved["operator"].str.contains("addmm").any(), "the matmuls did not move"


def test_ab_measures_a_failed_point_again_under_the_profiler_and_explains_it(tmp_path):
    from perflab import compare, why
    from perflab.ab import Side

    rng = np.random.default_rng(7)
    sides = [Side("base", tmp_path / "base"), Side("new", tmp_path / "new")]
    for side in sides:  # the timed run: no operators
        for k in range(1, 5):
            one_process(side.tree, f"{side.name}{k}", k, side.name == "new", rng)
            (side.tree / f"{side.name}{k}" / "operators.csv").unlink()
    table = compare.ab(sides[0].tree, sides[1].tree, paired=True)
    assert why.wanted(table, faster=False) and table["verdict"].tolist() == ["FAIL"]
    asked = []

    def measure(side, k):  # a profiled process, as bench.profile=true writes it
        asked.append((side.name, k, side.overrides))
        one_process(side.tree, f"why-{side.name}{k}", k, side.name == "new", rng)
        return 0

    said = []
    out = why.explain(table, sides, ["+experiment=quick/matmul"], measure, alpha=0.05, process_cv=None, say=said.append)
    assert [(n, k) for n, k, _ in asked] == [("base", 1), ("new", 1), ("new", 2), ("base", 2), ("base", 3), ("new", 3)]
    assert all(o == ["bench.profile=true"] for _, _, o in asked)
    assert (tmp_path / "why" / "base").is_dir(), "the profiled processes have trees of their own"
    assert out["why_moved"].iloc[0].startswith("aten::gelu +"), out["why_moved"].iloc[0]
    (line,) = said
    assert "3 profiled processes a side" in line and "x a timed one" in line


def test_the_report_shows_where_the_time_went_and_what_moved(tmp_path):
    from perflab import report

    rng = np.random.default_rng(8)
    for name, slowed in (("base", False), ("slow", True)):
        tree(tmp_path / name, slowed, rng)
    page = report.build(tmp_path / "base", tmp_path / "slow")
    assert '<section id="operators"><h2>Where the time went</h2>' in page
    assert "aten::gelu" in page and "self µs / call" in page
    assert "aten::gelu +" in page.split('<section id="operators">')[1], "the FAIL's moved operators under it"
    assert 'data-plot="operators"' in page and 'aria-label="Operators that moved: ' in page, "a titled bar"
    one = report.build(tmp_path / "base")
    assert "Where the time went" in one and "Operators that moved" not in one, "one tree: no verdict to explain"


@pytest.mark.parametrize("flag, explained", [([], True), (["--no-why"], False)])
def test_perflab_ab_explains_a_fail_unless_told_not_to(work, monkeypatch, capsys, flag, explained):
    from perflab import ab, compare, why

    rng = np.random.default_rng(9)

    def timed(shared, base, new, **options):  # the timed processes: no profiler, no operators
        for side in (base, new):
            for k in range(1, 5):
                one_process(side.tree, f"{side.name}{k}", k, side.name == "new", rng)
                (side.tree / f"{side.name}{k}" / "operators.csv").unlink()
        table = compare.ab(base.tree, new.tree, paired=True)
        return table, compare.verdict_of(table)

    def profiled(side, k):
        assert "bench.profile=true" in side.overrides
        one_process(side.tree, f"p-{side.name}{k}", k, side.name == "new", rng)
        return 0

    monkeypatch.setattr(ab, "run", timed)
    monkeypatch.setattr(why, "fresh", lambda shared: profiled)
    code = ab.main(["+experiment=quick/matmul", "--new-env", "X=1", "--out", str(work / "out"), *flag])
    ran = capsys.readouterr()
    assert code == 1
    assert any(x.startswith("why matmul") and "aten::gelu +" in x for x in ran.out.splitlines()) is explained
    assert ("the why pass: 3 profiled processes a side" in ran.err) is explained
    assert (work / "out" / "why").is_dir() is explained


def test_a_profiled_pass_sees_the_training_phases_as_ranges():
    """optim.Ranges: the step's phase marks open and close profiler ranges under perflab's
    names, each phase once a step, the optimizer's closed by its own mark."""
    import torch
    from torch.profiler import profile

    from perflab.train import optim

    phases = optim.Ranges()
    with profile() as prof:
        for _ in range(2):
            phases.start()
            torch.ones(8) * 2
            phases.mark("forward")
            torch.ones(8) + 1
            phases.mark("backward")
            phases.mark("optimizer")
    counts = {e.key: e.count for e in prof.key_averages() if e.key.startswith("train: ")}
    assert counts == {"train: forward": 2, "train: backward": 2, "train: optimizer": 2}
    assert phases.open is None


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [["strategy=single"], ["strategy=ddp", "devices.count=2"]], ids=["single", "ddp"])
def test_training_under_bench_profile_keeps_its_trace_and_operators_per_step(cli, strategy):
    """A real quick/train run with bench.profile=true: the train row has its trace, and
    operators.csv holds, keyed by that row, the step's aten ops and its phases as ranges, per
    step, beside the timed step (so compare --why can explain a training point). Under DDP every
    rank runs the profiled steps (their collectives need all ranks) and rank 0 writes them."""
    from perflab import results
    from perflab.measure import operators

    cli(
        "+experiment=quick/train",
        *strategy,
        "data.train_size=256",
        "trainer.batch_size=64",
        "data.test_size=64",
        "trainer.epochs=2",
        "bench.profile=true",
    )
    rows = results.load("outputs")
    (train,) = rows[rows["measurement"] == "train"].to_dict("records")
    ops = results.load_operators("outputs")
    mine = ops[ops["row_id"] == train["row_id"]]
    ranges = set(mine.loc[mine["kind"] == "range", "operator"])
    assert {"train: forward", "train: backward", "train: optimizer"} <= ranges
    assert mine["operator"].str.startswith("aten::").any()
    if "strategy=ddp" in strategy:  # the step's gradient all-reduce is in it, as the ranks ran it
        assert "c10d::allreduce_" in set(mine["operator"])
    step_s = float(mine["median_s"].iloc[0])
    assert 0 < step_s < float(train["median_s"]), "the timed step, not the epoch"
    assert list(Path("outputs").glob(f"**/{train['trace']}")), train["trace"]
    assert train["profile_s"] >= operators.ACTIVE_CALLS * step_s * 0.5, "its profiled steps' cost, said"
