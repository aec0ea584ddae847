"""The book's claims and their verdicts, on rows the tests build (no measuring): each check's
four outcomes, each experiment's claims, the CPU's datasheet peak, the chapter's plan."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perflab.analysis import checks, claims
from perflab.analysis.claims import INVALID, NOT_APPLICABLE, UNDERPOWERED, VALID, Tree
from perflab.measure import flops

_ids = itertools.count()
BUSY = "the machine was busy: other processes used 70% of the CPUs meanwhile"


def row(measurement: str, samples=None, **columns) -> dict:
    """A result row; ``samples`` (seconds) become its raw samples and its median."""
    r = {"row_id": f"r{next(_ids)}", "run_id": "run1", "experiment": "x", "measurement": measurement, "status": "ok"}
    if samples is not None:
        r["median_s"] = float(np.median(samples))
        r["_samples"] = np.asarray(samples, float)
    r.update(columns)
    return r


def tree(*rows: dict) -> tuple[pd.DataFrame, Tree]:
    samples = {r["row_id"]: r.pop("_samples") for r in rows if "_samples" in r}
    df = pd.DataFrame(list(rows))
    return df, Tree(df, samples)


def spread(center: float, n: int = 30, rel: float = 0.02, seed: int = 0) -> np.ndarray:
    return center * (1 + rel * np.random.default_rng(seed).standard_normal(n))


def outcome():
    return checks.claim("13.1", "B is faster than A", "the book says so", "> 1x", "the 95% CI above 1")


# --- the checks -------------------------------------------------------------------------------


def test_faster_is_valid_invalid_or_underpowered_as_the_samples_say():
    a = row("a", spread(1.0))
    fast, slow = row("b", spread(0.5, seed=1)), row("c", spread(2.0, seed=2))
    same = row("d", spread(1.0, n=4, rel=0.3, seed=3))
    _, t = tree(a, fast, slow, same)
    assert checks.faster(outcome(), t, a, fast).verdict == VALID
    bad = checks.faster(outcome(), t, a, slow)
    assert bad.verdict == INVALID and "below 1.05x" in bad.why and "x (95% CI" in bad.measured
    doubt = checks.faster(outcome(), t, a, {**slow, "suspect": BUSY})
    assert doubt.verdict == UNDERPOWERED and "not clean" in doubt.why and "busy" in doubt.why, (
        "a busy machine never refutes"
    )
    weak = checks.faster(outcome(), t, a, same)
    assert weak.verdict == UNDERPOWERED and "more samples a side" in weak.why


def test_faster_with_too_few_samples_says_how_many():
    a, b = row("a", [1.0, 1.1, 0.9]), row("b", [0.5, 0.6, 0.4])
    _, t = tree(a, b)
    c = checks.faster(outcome(), t, a, b)
    assert c.verdict == UNDERPOWERED and "at least 4 a side" in c.why


def test_same_accuracy_needs_learning_settling_and_enough_test_images():
    def acc(p: float) -> dict:
        return row("train", test_acc=p)

    ok = checks.same_accuracy(outcome(), acc(0.80), acc(0.81), n_base=5000, n_new=5000, classes=10)
    assert ok.verdict == VALID and "+0.010" in ok.measured
    chance = checks.same_accuracy(outcome(), acc(0.11), acc(0.10), n_base=5000, n_new=5000, classes=10)
    assert chance.verdict == UNDERPOWERED and "chance" in chance.why
    unsettled = checks.same_accuracy(
        outcome(), acc(0.8), acc(0.8), n_base=5000, n_new=5000, classes=10, unsettled="still learning"
    )
    assert (unsettled.verdict, unsettled.why) == (UNDERPOWERED, "still learning")
    apart = checks.same_accuracy(outcome(), acc(0.80), acc(0.60), n_base=5000, n_new=5000, classes=10)
    assert apart.verdict == INVALID
    few = checks.same_accuracy(outcome(), acc(0.80), acc(0.78), n_base=300, n_new=300, classes=10)
    assert few.verdict == UNDERPOWERED and "test images would decide" in few.why


def test_share_flags_a_figure_above_its_reference_and_never_shows_it_plain():
    above = checks.share(outcome(), 1.12, 1.0, floor=0.8, doubt="", above_why="the peak was measured smaller")
    assert above.verdict == UNDERPOWERED and "suspect" in above.measured and above.why
    flagged = checks.share(outcome(), 1.04, 1.0, floor=0.5, ceiling=1.5, doubt="", above_why="turbo")
    assert flagged.verdict == VALID and "above 100 %, flagged: turbo" in flagged.measured
    assert checks.share(outcome(), 0.9, 1.0, floor=0.8, doubt="", above_why="").verdict == VALID
    assert checks.share(outcome(), 0.3, 1.0, floor=0.8, doubt="", above_why="").verdict == INVALID
    assert checks.share(outcome(), 0.3, 1.0, floor=0.8, doubt=BUSY, above_why="").verdict == UNDERPOWERED


def test_a_line_fit_judges_the_ring_model():
    sizes = [4096 * 4**i for i in range(6)]
    line = [100e-6 + s / 1e9 for s in sizes]
    c = checks.affine(outcome(), sizes, line, doubt="", describe=lambda a, b: f"{a:.3g} {b:.3g}")
    assert c.verdict == VALID and "R² 1.000" in c.measured
    flat = [1e-3, 5e-3, 1e-3, 5e-3, 1e-3, 5e-3]
    assert checks.affine(outcome(), sizes, flat, doubt="", describe=lambda a, b: "").verdict == INVALID
    assert checks.affine(outcome(), sizes[:3], line[:3], doubt="", describe=lambda a, b: "").verdict == UNDERPOWERED


# --- each experiment's claims ------------------------------------------------------------------


def test_concurrency_near_the_device_count_and_impossible_figures():
    from perflab.book import auto_parallel

    def run(together_s: float, suspect: str = ""):
        rows = [
            row("cpu#0 alone", spread(1.0, seed=4), devices="cpu#0"),
            row("cpu#1 alone", spread(1.0, seed=5), devices="cpu#1"),
            row("cpu#0 + cpu#1 together", spread(together_s, seed=6), devices="cpu#0+cpu#1", suspect=suspect),
            row("compute + copy to CPU", status="skipped", error="needs a CUDA device"),
        ]
        df, t = tree(*rows)
        return auto_parallel.claims(df, t)

    near, copy = run(1.05)
    assert near.verdict == VALID and float(near.measured.split()[0]) == pytest.approx(2 / 1.05, rel=0.03)
    assert near.section == "13.3"
    assert copy.verdict == NOT_APPLICABLE and "CUDA" in copy.why
    assert run(2.0)[0].verdict == INVALID
    assert run(2.0, suspect=BUSY)[0].verdict == UNDERPOWERED
    impossible = run(0.8)[0]
    assert impossible.verdict == UNDERPOWERED and "impossible" in impossible.measured


def test_compile_claims_judge_each_compiled_mode_against_eager():
    from perflab.book import compile as compile_experiment

    common = {"model": "mlp", "cfg.experiment.batch": 1}
    df, t = tree(
        row("eager", spread(50e-6, n=200), **common),
        row("torchscript", spread(40e-6, n=200, seed=1), break_even_calls=3000, **common),
        row("compile-default", spread(80e-6, n=200, seed=2), **common),
    )
    script, compiled = compile_experiment.claims(df, t)
    assert script.verdict == VALID and "pays off after 3000 calls" in script.measured and "batch 1)" in script.statement
    assert compiled.verdict == INVALID and "never pays off" in compiled.measured


def test_asynchrony_is_not_applicable_on_a_cpu_and_says_why():
    from perflab.book import async_compute

    df, t = tree(
        row("numpy (CPU)", spread(2e-3)),
        row("torch cpu, no sync (host dispatch)", spread(1e-3), devices="cpu"),
        row("torch cpu, synced (device time)", spread(1e-3, seed=1), devices="cpu"),
    )
    found = async_compute.claims(df, t)
    assert [c.verdict for c in found] == [NOT_APPLICABLE] * 2
    assert all("synchronously" in c.why and "x (" in c.measured for c in found)


def test_training_claims_pair_each_device_count_with_one():
    from perflab.book import train

    def summary(n: int, acc: float, batch: int, lr: float, run: str, devices: str) -> dict:
        setup = {"cfg.model.name": "lenet", "cfg.trainer.batch_size": 256, "cfg.data.test_size": 5000}
        return row(
            "train",
            spread(1.0, n=5),
            run_id=run,
            n_devices=n,
            test_acc=acc,
            global_batch=batch,
            lr=lr,
            strategy="scratch",
            model="lenet",
            items_per_s=1000.0 * (1 + n) / 2,
            devices=devices,
            **{"cfg.devices.count": n, **setup},
        )

    df, t = tree(summary(1, 0.80, 256, 0.2, "a", "cpu"), summary(2, 0.81, 256, 0.2, "b", "cpu#0+cpu#1"))
    speed, accuracy = train.claims(df, t)
    assert speed.verdict == NOT_APPLICABLE and "CPU workers" in speed.why and "1.50x" in speed.measured
    assert accuracy.verdict == VALID and accuracy.section == "13.5"

    def epoch(run: str, n: int, e: int, acc: float) -> dict:
        return row("epoch", run_id=run, epoch=e, test_acc=acc, n_devices=n)

    weak = [summary(1, 0.60, 256, 0.1, "c", "cuda:0"), summary(2, 0.55, 512, 0.2, "d", "cuda:0+cuda:1")]
    epochs = [epoch("c", 1, 1, 0.40), epoch("c", 1, 2, 0.60), epoch("d", 2, 1, 0.50), epoch("d", 2, 2, 0.55)]
    df, t = tree(*weak, *epochs)
    _, rule = train.claims(df, t)
    assert rule.verdict == UNDERPOWERED and "still learning" in rule.why and "256 -> 512" in rule.statement


def test_hardware_claims_judge_the_peak_against_the_datasheet():
    from perflab.book import hardware

    basis = f"2 cores x 2.60 GHz ...; clock: cpu MHz ({flops.TURBO_UNKNOWN})"
    common = {"devices": "cpu", "device_name": "CPU (2 threads)", "cfg.experiment.cpu_matmul_size": 1024}
    df, t = tree(
        row("cpu peak matmul float32", peak_tflops=0.35, datasheet_tflops=0.333, datasheet_basis=basis, **common),
        row("cpu op dispatch latency", latency_us=1.8, **common),
    )
    peak, launch = hardware.claims(df, t)
    assert peak.verdict == VALID and "flagged" in peak.measured, "above 100 % of a derived peak: said, not hidden"
    assert launch.verdict == NOT_APPLICABLE and "1.8 us" in launch.measured
    df, t = tree(row("cpu peak matmul float32", peak_tflops=0.1, datasheet_tflops=0.333, **common))
    assert hardware.claims(df, t)[0].verdict == INVALID


def test_a_matmul_above_the_measured_peak_is_never_valid():
    from perflab.book import matmul

    common = {"cfg.experiment.size": 1024, "cfg.experiment.dtype": "float32", "device_name": "CPU (2 threads)"}
    df, t = tree(row("cpu alone", tflops=0.37, pct_of_peak=112.0, **common))
    (above,) = matmul.claims(df, t)
    assert above.verdict == UNDERPOWERED and "112%" in above.measured and "suspect" in above.measured
    df, t = tree(row("cpu alone", tflops=0.3, pct_of_peak=90.0, **common))
    assert matmul.claims(df, t)[0].verdict == VALID
    df, t = tree(row("cpu alone", tflops=0.3, **common))
    assert matmul.claims(df, t)[0].verdict == NOT_APPLICABLE


def test_comm_claims_fit_the_ring_and_reproduce_the_book():
    from perflab.book import comm
    from perflab.measure import costmodel

    cases = [row(f"model: {c.name}", model_s=c.model_s, book_s=c.book_s) for c in costmodel.book_cases()]
    sizes = [4096 * 4**i for i in range(5)]
    measured = [row(f"allreduce {s}", spread(50e-6 + s / 2e9, n=5), bytes_per_rank=s, world_size=2) for s in sizes]
    df, t = tree(*cases, *measured)
    book, ring = comm.claims(df, t)
    assert book.verdict == VALID and ring.verdict == VALID and "GB/s" in ring.measured


def test_judge_reads_each_experiments_hook_and_orders_by_section(monkeypatch):
    from perflab.book import comm, matmul

    common = {"cfg.experiment.size": 1024, "cfg.experiment.dtype": "float32", "device_name": "CPU (2 threads)"}
    rows = [
        row("allreduce", status="skipped", error="needs 2 or more workers", experiment="comm"),
        row("cpu alone", tflops=0.3, pct_of_peak=90.0, experiment="matmul", **common),
    ]
    df, t = tree(*rows)
    found = claims.judge(df, t.samples)
    assert [(c.section, c.experiment, c.verdict) for c in found] == [
        ("13.4", "matmul", VALID),
        ("13.7", "comm", NOT_APPLICABLE),
    ]

    def broken(rows, tree):
        raise RuntimeError("a bug")

    monkeypatch.setattr(comm, "claims", broken)
    assert [c.experiment for c in claims.judge(df, t.samples)] == ["matmul"], "one hook's bug costs its own claims"
    assert matmul.claims  # the other hook stands


def test_the_summary_has_a_line_per_claim_with_its_verdict():
    from perflab.report import reproducibility

    common = {"cfg.experiment.size": 1024, "cfg.experiment.dtype": "float32", "device_name": "CPU (2 threads)"}
    df, t = tree(
        row("cpu alone", tflops=0.37, pct_of_peak=112.0, experiment="matmul", **common),
        row("cpu alone", tflops=0.3, pct_of_peak=90.0, experiment="matmul", run_id="run2", **common),
    )
    df["cfg.results.note"] = "sized so"
    html = reproducibility.summary(df, t.samples)
    assert html.count('data-verdict="UNDERPOWERED"') == 1 and html.count('data-verdict="VALID"') == 1
    assert "Why these sizes" in html and "sized so" in html and 'href="#sec-matmul"' in html


# --- the CPU's datasheet peak -----------------------------------------------------------------


@pytest.mark.parametrize(
    "cpu_flags, dtype, per_cycle",
    [
        ("avx512f avx2 fma", "float32", 16 * 2 * 2),
        ("avx2 avx fma", "float32", 8 * 2 * 2),
        ("avx sse2", "float32", 8 * 2 * 1),
        ("avx512f fma", "float64", 8 * 2 * 2),
        ("avx512f fma amx_bf16 avx512_bf16", "bfloat16", 1024),
        ("avx512f fma avx512_bf16", "bfloat16", 2 * 16 * 2 * 2),
        ("avx avx2 fma", "bfloat16", 8 * 2 * 2),
        ("avx avx2 fma", "float16", None),
        ("avx avx2 fma", "tf32", None),
    ],
)
def test_a_cpus_datasheet_peak_is_cores_clock_simd_and_fma(cpu_flags, dtype, per_cycle):
    cpu = flops.CpuDescription(frozenset(cpu_flags.split()), cores=4, ghz=2.5, clock_source="a test")
    peak = flops.cpu_datasheet(dtype, threads=8, cpu=cpu)
    if per_cycle is None:
        assert peak is None
        return
    assert peak is not None and peak.tflops == pytest.approx(4 * 2.5e9 * per_cycle / 1e12), "8 threads, 4 cores"
    assert "4 cores x 2.50 GHz" in peak.basis and "clock: a test" in peak.basis and "assumed:" in peak.basis


def test_mfu_on_a_cpu_is_against_its_derived_datasheet_peak():
    out = flops.utilization(0.1, ["CPU (2 threads)"], "fp32", measured_peak=0.2)
    assert out["pct_of_peak"] == pytest.approx(50.0)
    sheet = flops.cpu_datasheet_of("CPU (2 threads)", "float32")
    if sheet is None:
        pytest.skip("the kernel does not describe this CPU")
    assert out["mfu"] == pytest.approx(0.1 / sheet.tflops) and out["datasheet_basis"] == sheet.basis


# --- the chapter's plan -----------------------------------------------------------------------


def machine(**kw):
    from perflab.measure.sizing import Calibration

    fields = dict(
        kind="cpu", count=2, name="CPU (2 threads)", matmul_tflops=0.3, copy_gbps=50.0, op_us=2.0,
        others_pct=0.0, seconds=1.0,
        probes={"lenet training, batch 256 (images/s)": 5000.0, "resnet18 training, batch 32 (images/s)": 90.0},
    )  # fmt: skip
    return Calibration(**{**fields, **kw})


def test_the_plan_covers_every_section_and_fits_its_seconds():
    from perflab import chapter

    points, seconds = chapter.plan(machine(), 360.0)
    assert sorted({p.section for p in points}) == ["13.1", "13.2", "13.3", "13.4", "13.5", "13.6", "13.7"]
    assert points[0].preset == "hardware", "the machine's ceilings are measured before what is judged against them"
    assert sum(seconds.values()) == pytest.approx(360.0)
    assert sum(p.estimate_s for p in points) <= 1.2 * 360.0
    assert all(p.why and p.module for p in points)
    lenet = [p for p in points if p.preset == "lenet_scratch"]
    assert [p.label for p in lenet] == ["1 device", "2 devices"] and lenet[0].overrides[:-1] == lenet[1].overrides[:-1]


def test_the_rest_is_resized_to_the_time_left_but_never_half_a_comparison():
    from perflab import chapter

    points, seconds = chapter.plan(machine(), 360.0)
    plan = chapter.Chapter(8, "host", "now", machine(), points, seconds)
    pairs = [
        [i for i, p in enumerate(points) if p.group == g] for g in dict.fromkeys(p.group for p in points if p.group)
    ]
    first, second = pairs  # the two training comparisons, the larger first
    assert len(first) == len(second) == 2 and first[0] < first[1] < second[0] < second[1]
    started = set(range(first[0] + 1))  # up to the first run of the first pair
    before = [list(p.overrides) for p in plan.points]
    what = [(p.preset, p.label) for p in plan.points]
    fixed = points[first[1]].estimate_s  # the started run's pair
    need = sum(p.estimate_s for i, p in enumerate(points) if i not in started) - fixed
    on_time = (fixed + 1.1 * need) / chapter.MARGIN  # what is left fills 1/1.1 of the time
    assert chapter.resize(plan, started, left_s=on_time, late=1.0) == 1.0, "on time: nothing changes"
    assert chapter.resize(plan, started, left_s=60.0, late=2.0) < 1.0
    after = [list(p.overrides) for p in plan.points]
    assert after[: first[1] + 1] == before[: first[1] + 1], "started points, and the started one's pair, stay"
    assert after[second[0]] != before[second[0]] and after[second[0]][:-1] == after[second[1]][:-1]
    shrunk = plan.seconds["train"]
    for _ in range(3):  # well ahead of time: the rest grows, 1.5x a step
        assert chapter.resize(plan, started, left_s=3000.0, late=0.5) == chapter.GROW_MAX
    assert plan.seconds["train"] == pytest.approx(shrunk * chapter.GROW_MAX**3)
    assert [(p.preset, p.label) for p in plan.points] == what, "each point resized as itself, in its place"
    assert after[second[0]] != [list(p.overrides) for p in plan.points][second[0]]


def test_the_same_command_continues_the_newest_chapter_of_its_host_and_budget_only_if_it_did_not_end(tmp_path):
    import socket

    from perflab import chapter

    def saved(name: str, budget: float, finished: str = "", host: str = socket.gethostname()) -> Path:
        folder = tmp_path / "sweeps" / name
        folder.mkdir(parents=True)
        chapter.Chapter(budget, host, "then", machine(), [], {}, finished=finished).save(folder)
        return folder

    assert chapter.unfinished(tmp_path, 8) is None
    stopped = saved("2026-01-01_10-00-00_chapter-aa", 8)
    saved("2026-01-01_11-00-00_chapter-bb", 8, host="elsewhere")
    saved("2026-01-01_12-00-00_chapter-cc", 10)
    found = chapter.unfinished(tmp_path, 8)
    assert found is not None and found[0] == stopped
    saved("2026-01-01_13-00-00_chapter-dd", 8, finished="now")
    assert chapter.unfinished(tmp_path, 8) is None, "the newest ended: a new chapter measures anew"


def test_each_job_says_how_much_work_it_timed_beside_the_book():
    from perflab import chapter

    common = {"cfg.experiment.size": 768, "cfg.experiment.iterations": 10, "cfg.experiment.dtype": "float32"}
    assert chapter.work_line("matmul", [row("cpu alone", experiment="matmul", **common)]) == (
        "work per call: 10 x 768² float32 matmuls per device"
    )
    auto = {"cfg.experiment.cpu_size": 768, "cfg.experiment.cpu_matmuls": 10, "devices": "cpu#0", "status": "ok"}
    line = chapter.work_line("auto_parallel", [row("cpu#0 alone", experiment="auto_parallel", **auto)])
    assert "768" in line and "the book: 50 matmuls of 4000 x 4000" in line, "its report hook's setup line says it"
    train = {"cfg.trainer.epochs": 3, "cfg.data.train_size": 1024, "global_batch": 256, "n_devices": 2}
    line = chapter.work_line("train", [row("train", experiment="lenet_scratch", batch_unit="images", **train)])
    book = "the book: 10 epochs at global batch 256 on 1 and on 2 GPUs"
    assert line == f"work: 3 epochs of 1024 images at global batch 256 on 2 devices; {book}"
    tokens = {**train, "cfg.trainer.epochs": 1, "n_devices": 1, "batch_unit": "sequences", "items_unit": "tokens"}
    line = chapter.work_line("train", [row("train", experiment="train", **tokens)])
    assert line.startswith("work: 1 epoch of 1024 sequences at global batch 256 on 1 device"), line
    sizes = {"cfg.experiment.min_bytes": 4096, "cfg.experiment.max_bytes": 65536}
    assert "4 KiB to 64 KiB per rank (3 sizes)" in chapter.work_line("comm", [row("allreduce", **sizes)])


def test_no_mfu_above_100_percent_is_shown_a_peak_is_a_maximum(monkeypatch):
    """The bug: a quick/matmul row with MFU 105 % against a peak counted at the VM's 2.30 GHz (a
    TSC rate, no turbo clock), not flagged. A peak is a maximum: where the clock is none, the
    measured peak if higher, else no MFU at all, said in ``mfu_note``; above a true peak (cpufreq's
    maximum), an MFU above 1 is flagged."""
    from perflab.job.context import beyond_peak

    def cpu(source: str) -> flops.CpuDescription:
        return flops.CpuDescription(frozenset({"avx2", "avx", "fma"}), cores=1, ghz=2.3, clock_source=source)

    floor = cpu(f"cpu MHz in /proc/cpuinfo, a VM's TSC rate ({flops.TURBO_UNKNOWN})")
    monkeypatch.setattr(flops, "cpu_description", lambda: floor)
    sheet = flops.cpu_datasheet("float32", threads=1, cpu=floor)
    assert sheet is not None and flops.is_lower_bound(sheet.basis)
    above = flops.utilization(1.05 * sheet.tflops, ["CPU (1 thread)"], "fp32", None)
    assert "mfu" not in above and above["mfu_note"].startswith("no MFU: ") and "no maximum" in above["mfu_note"]
    below = flops.utilization(0.5 * sheet.tflops, ["CPU (1 thread)"], "fp32", None)
    assert below["mfu"] == pytest.approx(0.5) and "mfu_note" not in below  # an upper bound on the true MFU
    measured = flops.utilization(1.05 * sheet.tflops, ["CPU (1 thread)"], "fp32", 1.2 * sheet.tflops)
    assert measured["mfu"] == pytest.approx(1.05 / 1.2) and measured["datasheet_basis"].startswith("the measured peak")
    assert not flops.is_lower_bound(measured["datasheet_basis"]) and beyond_peak(measured) == ""
    ceiling = cpu("cpufreq's maximum, a single-core turbo")
    monkeypatch.setattr(flops, "cpu_description", lambda: ceiling)
    over = flops.utilization(1.05 * sheet.tflops, ["CPU (1 thread)"], "fp32", None)
    assert over["mfu"] == pytest.approx(1.05) and beyond_peak(over).startswith("MFU 105%: above the datasheet peak")
    assert beyond_peak({**over, "mfu": 0.9}) == ""


def test_a_line_with_a_negative_latency_is_no_valid_ring_model():
    """A fit of ``-636 us + S / 0.719 GB/s`` (a 2-core VM's) explains the times well but its
    latency is below 0: not VALID, and the measured cell says why."""
    sizes = [4096 * 4**i for i in range(6)]
    line = [-636e-6 + s / 0.719e9 * (1 + 0.01 * (-1) ** i) for i, s in enumerate(sizes)]
    c = checks.affine(outcome(), sizes, line, doubt="", describe=lambda a, b: f"{b * 1e6:.3g} us", intercept="latency")
    assert c.verdict == UNDERPOWERED and "a negative latency is no latency" in c.measured
    assert "below 0" in c.why and "more small sizes" in c.why
    positive = [100e-6 + s / 1e9 for s in sizes]
    assert (
        checks.affine(outcome(), sizes, positive, doubt="", describe=lambda a, b: "", intercept="latency").verdict
        == VALID
    )
