"""History you can trust: series by subject per machine, a lone spike and a slow staircase are
no regression, a step is, and a real job whose code became 2x slower is caught between the
two subjects that bracket the change."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from perflab import history
from perflab.measure import alone_together as parallel
from perflab.store.rundir import RunWriter

from conftest import FAST, timed_row

IDENTITY = {"cpu_model": "Test CPU", "num_threads": 2, "torch": "2.14.1"}


def write_history(root, name, medians, *, seed, identity=IDENTITY, spread=0.01, size=256, suspect=(), n=12):
    """One run dir per subject (s00, s01, ...), as a matmul job writes it: raw sample times
    around each median, the rate the job reports, the subject's commit time in order; the
    subjects numbered in ``suspect`` measured on a busy machine (their rows flagged)."""
    rng = np.random.default_rng(seed)
    for i, median in enumerate(medians):
        times = median * (1 + rng.normal(0, spread, n))
        run = f"{name}-{i:02d}"
        RunWriter(root / run).add(
            timed_row(
                times,
                run_id=run,
                experiment="matmul",
                measurement="cpu alone",
                **{
                    "tflops": 1.0 / float(np.median(times)),
                    "device_name": "CPU (2 threads)",
                    "subject": f"{name}-s{i:02d}",
                    "subject_time": f"2026-01-{i + 1:02d}T00:00:00+00:00",
                    "timestamp": f"2026-02-01T00:00:{i:02d}+00:00",
                    "run_dir": str(root / run),
                    "cfg.experiment.size": size,
                    "suspect": "busy: other processes took 60% of the CPUs" if i in suspect else "",
                    **identity,
                },
            ),
            samples=list(times),
        )


def test_only_the_step_is_a_regression_not_a_spike_nor_a_staircase(tmp_path, capsys):
    write_history(tmp_path / "spike", "spike", [1.0] * 5 + [1.8] + [1.0] * 6, seed=1)  # one bad run
    stairs = list(np.repeat(1.03 ** np.arange(4), 3))  # +3 % every third subject
    write_history(tmp_path / "stairs", "stairs", stairs, seed=2, size=512)
    write_history(tmp_path / "step", "step", [1.0] * 6 + [1.1] * 6, seed=3, size=1024)  # 10 % slower from s06
    for name in ("spike", "stairs"):
        changes = history.judge(history.load_series([str(tmp_path / name)]))
        assert all(c.label != "regression" for c in changes), [(c.label, c.change_pct) for c in changes]
        assert history.main([str(tmp_path / name)]) == 0
    capsys.readouterr()
    (change,) = history.judge(history.load_series([str(tmp_path / "step")]))
    assert change.label == "regression" and change.change_pct == pytest.approx(-9.1, abs=1.5)  # tflops fell
    assert history.main([str(tmp_path / "step"), "--format", "json"]) == 1
    (out,) = json.loads(capsys.readouterr().out)["changes"]
    assert set(out) >= {"experiment", "measurement", "metric", "before", "after", "change_pct", "label", "run_dirs"}
    assert (out["before"]["subject"], out["after"]["subject"]) == ("step-s05", "step-s06")
    assert out["run_dirs"]["after"] == [str(tmp_path / "step" / "step-06")]
    # All three histories at once (three points: three series): the step alone is a regression.
    series = history.load_series([str(tmp_path)])
    assert sorted(s.point["experiment.size"] for s in series) == ["1024", "256", "512"]
    changes = history.judge(series)
    assert [c.series.point["experiment.size"] for c in changes if c.label == "regression"] == ["1024"]


def test_a_step_is_tested_on_subjects_not_on_their_samples(tmp_path):
    """A thousand samples of one process are one replicate: the p-value of a step is the same
    whether each subject kept 12 samples or 1200 (pooled samples gave p-values like 1e-78)."""
    medians = [1.0, 1.02, 0.99, 1.01, 1.0] + [1.12, 1.1, 1.13, 1.11, 1.12]
    p = {}
    for n in (12, 1200):
        write_history(tmp_path / str(n), "s", medians, seed=6, n=n, spread=0.005)
        (change,) = history.judge(history.load_series([str(tmp_path / str(n))]))
        assert change.label == "regression"
        p[n] = change.p_value
    assert 1e-6 < p[1200] < 0.05 and p[1200] == pytest.approx(p[12], rel=0.5)


def test_another_machine_is_another_series_and_too_little_history_is_exit_3(tmp_path, capsys):
    write_history(tmp_path / "a", "a", [1.0] * 3, seed=4)
    write_history(tmp_path / "b", "b", [2.0] * 3, seed=5, identity={**IDENTITY, "cpu_model": "Other CPU"})
    series = history.load_series([str(tmp_path)])
    assert sorted((s.identity["cpu_model"], len(s.names)) for s in series) == [("Other CPU", 3), ("Test CPU", 3)]
    assert history.main([str(tmp_path)]) == 3
    assert "too little history: the longest series has 3 subject(s); a change needs 3 on each side" in (
        capsys.readouterr().err
    )
    assert history.main([str(tmp_path / "nope")]) == 2
    assert history.main([str(tmp_path), "--min-segment", "1"]) == 2


def test_a_series_of_suspect_subjects_is_not_called_unchanged(tmp_path, capsys):
    write_history(tmp_path / "busy", "busy", [1.0] * 6, seed=6, suspect={0, 1, 2, 4, 5})
    assert history.main([str(tmp_path / "busy")]) == 3
    out, err = capsys.readouterr()
    assert "| matmul cpu alone | Test CPU, 2 threads | tflops | 6 | 5 |" in out
    assert (
        "perflab history: matmul cpu alone: 5 of 6 subjects' measurements were flagged suspect (busy: other "
        "processes took 60% of the CPUs): 1 clean, a change needs 6: not called unchanged"
    ) in err
    assert err.strip().endswith("1 series, no change point; 1 series too suspect to call unchanged -> exit 3")
    # Many series flagged for the same reason: the reason is said once, not on every line.
    for size in (64, 128, 1024):
        write_history(tmp_path / "busy", f"b{size}", [1.0] * 6, seed=size, suspect={0, 1, 2, 4, 5}, size=size)
    assert history.main([str(tmp_path / "busy")]) == 3
    err = capsys.readouterr().err
    assert err.count("busy: other processes took 60% of the CPUs") == 1
    assert "4 series have subjects flagged suspect, each for: busy: other processes" in err
    assert err.count("not called unchanged") == 4
    # Enough clean subjects: judged, and said; a regression among suspect subjects is still one.
    write_history(tmp_path / "some", "some", [1.0] * 6 + [1.3] * 6, seed=7, suspect={3, 7}, size=512)
    assert history.main([str(tmp_path / "some"), "--format", "json"]) == 1
    out, err = capsys.readouterr()
    (change,) = json.loads(out)["changes"]
    assert change["label"] == "regression" and "2 of 12 subjects' measurements were flagged suspect" in err
    # A subject whose metric is no number is left out, and said.
    results = tmp_path / "some" / "some-11" / "results.csv"
    table = pd.read_csv(results, dtype=str, keep_default_na=False).assign(tflops="abc")
    table.to_csv(results, index=False)
    notes: list[str] = []
    (series,) = history.load_series([str(tmp_path / "some")], notes=notes)
    assert len(series.names) == 11 and notes == [
        "matmul cpu alone: left out of 1 subject(s) rows or samples whose tflops is NaN, not a number or <= 0"
    ]


def test_a_crash_is_one_line_and_exit_3_never_the_1_of_a_regression(tmp_path, capsys, monkeypatch):
    write_history(tmp_path, "a", [1.0] * 6, seed=8)

    def broken(*args, **kwargs):
        raise ValueError("cannot convert float NaN to integer")

    monkeypatch.setattr(history, "judge", broken)  # a bug, or damage no reader foresaw
    monkeypatch.delenv("PERFLAB_DEBUG", raising=False)
    assert history.main([str(tmp_path)]) == 3
    assert capsys.readouterr().err.strip().splitlines() == [
        "perflab history: could not judge: ValueError: cannot convert float NaN to integer; "
        "PERFLAB_DEBUG=1 shows the traceback -> exit 3"
    ]


def test_its_lines_start_with_the_command_as_typed(cli, work):
    assert cli("history", str(work / "nowhere"), rc=2).err.startswith("perflab history: error: ")


@pytest.mark.slow
def test_eight_subjects_of_a_real_job_that_became_4x_slower(cli, work, monkeypatch, capsys, one_thread):
    """Eight subjects of quick/matmul, results.subject set per run, each measured in three runs
    (a change is judged on 3 subjects a side: one run each left a busy CI runner's spread
    between subjects too wide to call even 2x, and it said "suspicious"; with two, a CI run once
    put the step one subject late); from the fifth on the code under test does its matmuls four
    times (the same config: only the code changed). Not twice: this VM's unchanged 384² matmul
    runs at two speeds about 1.8x apart, run by run, so a 2x step could hide in them."""
    original = parallel.alone_then_together
    args = ["+experiment=quick/matmul", "experiment.size=384", *FAST, "bench.repeats=9", "results.table=false"]
    for i in range(8):
        if i == 4:
            monkeypatch.setattr(
                parallel,
                "alone_then_together",
                lambda ctx, work, **kw: original(ctx, lambda d: [work(d) for _ in range(4)], **kw),
            )
        for _ in range(3):
            cli(*args, f"results.subject=v{i + 1}")
    assert history.main(["outputs", "--format", "json"]) == 1
    changes = json.loads(capsys.readouterr().out)["changes"]
    regressions = [c for c in changes if c["label"] == "regression"]
    assert len(regressions) == 1, changes
    (r,) = regressions
    assert (r["before"]["subject"], r["after"]["subject"]) == ("v4", "v5")
    assert r["metric"] == "tflops" and r["change_pct"] < -40
    assert len(r["run_dirs"]["before"]) == 3 and "outputs/runs/" in r["run_dirs"]["after"][0]


def test_metric_is_refused_in_compares_words(tmp_path, capsys):
    """--metric no row has: the one line compare says (the judged columns the rows have), exit 2."""
    write_history(tmp_path, "m", [1.0] * 6, seed=4)
    assert history.main([str(tmp_path), "--metric", "tflop"]) == 2
    err = capsys.readouterr().err
    assert "--metric tflop: no row has a value of it; allowed: a numeric column, e.g. median_s" in err
    assert len(err.strip().splitlines()) == 1


def test_times_are_written_as_their_timestamps():
    """A subject's times are texts: each as pandas writes its Timestamp, whatever the column's unit."""
    from perflab.history import _texts

    for unit in ("s", "ms", "us", "ns"):
        stamps = pd.to_datetime(["2026-11-29 04:34:40", "2026-11-29 04:34:40.5", None], format="ISO8601")
        rows = pd.DataFrame({"timestamp": pd.Series(stamps.as_unit(unit)).dt.tz_localize("UTC")})
        want = [str(v) if not pd.isna(v) else "" for v in rows["timestamp"]]
        assert _texts(rows, "timestamp").tolist() == want
        if unit == "us":
            assert want == ["2026-11-29 04:34:40+00:00", "2026-11-29 04:34:40.500000+00:00", ""]


def test_each_subject_is_what_measured_makes_of_its_rows():
    """build_series values every subject of an experiment at once: each is what
    ``replicates.measured`` makes of its rows alone (its clean ones, all where none is), its
    processes too (read again for a judged subject), its run dirs and first time those of all its
    rows, in a tree of subjects of several rows, suspect rows, damaged values and samples."""
    from perflab.analysis import replicates

    rng = np.random.default_rng(3)
    rows, samples = [], {}
    for i in range(300):
        s = int(rng.integers(12))
        row_id, median = f"r{i}", (1 + 0.3 * (s >= 6)) * 1e-3 * (1 + rng.normal(0, 0.02))
        rows.append(
            {
                "experiment": "matmul",
                "status": "ok",
                "measurement": "cpu alone",
                "row_id": row_id,
                "run_id": f"run{i}",
                "subject": f"s{s:02d}",
                "suspect": "busy" if rng.random() < 0.3 or s == 4 else "",
                "run_dir": f"/runs/{int(rng.integers(100))}",
                "timestamp": f"2026-01-{int(rng.integers(1, 28)):02d} 00:00:00+00:00",
                "subject_time": f"2026-02-{s + 1:02d}T00:00:00+00:00",
                "median_s": median,
                "tflops": np.nan if rng.random() < 0.05 else 1 / median,
                "cfg.experiment.size": int(rng.choice([64, 128])),
                **IDENTITY,
            }
        )
        times = median * (1 + rng.normal(0, 0.01, int(rng.integers(1, 20))))
        if rng.random() < 0.1:
            times[0] = -1.0  # damaged: gives no value
        samples[row_id] = times[times > 0]
    frame = pd.DataFrame(rows)
    notes: list[str] = []
    series = history.build_series(frame, samples, notes=notes)
    assert len(series) == 2 and notes, "a series a size; the rows of no tflops said"
    for s in series:
        assert s.names == sorted(s.names) and "busy" in s.suspect, "in commit time order; s04 all suspect"
        measured = s.measured(0, len(s.names))
        for k, name in enumerate(s.names):
            own = frame[(frame["subject"] == name) & (frame["cfg.experiment.size"] == int(s.point["experiment.size"]))]
            clean = own[own["suspect"] == ""]
            want = replicates.measured((clean if len(clean) else own).reset_index(drop=True), "tflops", samples)
            assert s.values[k] == want.value and s.suspect[k] == ("" if len(clean) else "busy")
            np.testing.assert_array_equal(measured[k].figures, want.figures)
            assert [list(p) for p in measured[k].processes] == [list(p) for p in want.processes]
            assert s.run_dirs(k) == sorted(set(own["run_dir"])) and s.times[k] == min(own["timestamp"])
