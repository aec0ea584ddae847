"""``perflab chapter`` end to end, as a user runs it: a budget too short for this machine
(refused once calibrated), a tiny one that fits, Ctrl-C after its first points, the same command
again (which continues), then the report in a real browser, and the rows as an ordinary results
tree. Slow: minutes of CPU (the chapter's smallest sizes). Fast: the plan kept between commands,
the budget's check, the calibration's progress, on a machine the tests describe."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_claims import machine
from test_report import CHROMIUM, body_data, chromium

from perflab import chapter as chapter_module
from perflab.analysis.claims import VERDICTS

SECTIONS = ["13.1", "13.2", "13.3", "13.4", "13.5", "13.6", "13.7"]
DAMAGED = '{"budget_min": 0.001, "points": [\n'  # a plan cut off mid-write


def chapter(work: Path, budget: float | str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "perflab.chapter", "--budget", str(budget), "-o", "report.html", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sweeps(work: Path) -> list[Path]:
    return sorted((work / "outputs" / "sweeps").glob("*_chapter-*"))


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a busy machine names a budget of several minutes, run twice (stopped, continued)
def test_the_chapter_runs_stops_continues_judges_and_reports(work, tmp_path):
    # A damaged plan in another tree and a budget nothing fits: the plan is said to be unreadable
    # (and left as it is); the budget is refused once calibrated, naming the one that works here.
    damaged = work / "elsewhere" / "sweeps" / "2020-01-01_00-00-00_chapter-0badf00d" / "chapter.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text(DAMAGED)
    short = chapter(work, "0.001", "--store", "elsewhere")
    assert short.stdout is not None and short.stderr is not None
    seen = [(time.monotonic(), line) for line in short.stdout]
    err = short.stderr.read()
    said = "".join(line for _, line in seen)
    assert short.wait(timeout=60) == 2, said + err
    assert len(err.strip().splitlines()) == 1 and "--budget=0.001: too short: starting and calibrating took" in err
    assert f"cannot continue the newest chapter: its plan {damaged.relative_to(work)} is unreadable" in said
    assert damaged.read_text() == DAMAGED and [*damaged.parent.parent.iterdir()] == [damaged.parent], "nothing run"
    # the calibration's figure is all of it (its training steps too), shown as it goes when seconds long
    began = next(t for t, line in seen if "  calibrating: a matmul" in line)
    ended, words = next((t, line) for t, line in seen if "(calibrated in" in line)
    figure = float(re.findall(r"calibrated in ([\d.]+) s", words)[0])
    assert figure >= 0.8 * (ended - began) - 0.5, (figure, ended - began)
    if figure > 2 * chapter_module.Calibrating.QUIET_S:
        assert re.search(r"    calibrating \(\d+ s so far\): \w+ training", said), said
    works = float(re.findall(r"allowed: at least ([\d.]+) minutes on this machine", err)[0])
    budget = max(3.0, works + 0.5)  # the next calibration is as noisy as that one

    first = chapter(work, budget)
    lines = []
    assert first.stdout is not None
    for line in first.stdout:  # stop it (Ctrl-C) once two points are done
        lines.append(line)
        if len([x for x in lines if re.match(r"13\.\d \S+.*\s+ok\s", x)]) == 2:
            first.send_signal(signal.SIGINT)
            break
    out, err = first.communicate(timeout=120)
    said = "".join(lines) + out
    assert first.returncode == 130, said + err
    assert "no GPU here: the CPU stands in" in said or "GPU" in said
    assert "The same command continues" in err
    (stopped,) = sweeps(work)
    plan = json.loads((stopped / "chapter.json").read_text())
    assert not plan["finished"] and plan["outcomes"] == {"0": "ok", "1": "ok"}
    assert all(p["why"] for p in plan["points"]), "every size says why"

    second = chapter(work, budget)
    out, err = second.communicate(timeout=900)
    assert second.returncode == 0, out + err
    assert "continuing the chapter started" in out and "0 of" not in out.split("continuing")[1].split("\n")[0]
    continued = [s for s in sweeps(work) if s != stopped]
    assert len(continued) == 1
    reused = [json.loads((continued[0] / str(i) / "run.json").read_text()) for i in (0, 1)]
    assert [r["outcome"] for r in reused] == ["done", "done"], "the points done before are reused, not measured again"
    assert json.loads((continued[0] / "chapter.json").read_text())["finished"]
    assert json.loads((stopped / "chapter.json").read_text())["finished"] == f"continued in {continued[0].name}"
    assert re.search(rf"done in \d+:\d\d of the {chapter_module.clock(60 * budget)} budget", out)
    assert (continued[0] / "sweep.csv").is_file()

    # every claim has a verdict, every section is there, in the report and on the terminal
    page = (work / "report.html").read_text()
    summary = page[page.index('id="reproducibility"') : page.index("</section>", page.index('id="reproducibility"'))]
    verdicts = re.findall(r'data-verdict="([A-Z ]+)"', summary)
    assert verdicts and set(verdicts) <= set(VERDICTS)
    cells = re.findall(r"<tr data-verdict=\"[A-Z ]+\"><td>([\d.]+)</td>", summary)
    assert sorted(set(cells)) == SECTIONS, "a claim from every section of the chapter"
    for name in ("compile", "async_compute", "auto_parallel", "hardware", "lenet_scratch", "resnet18_concise", "comm"):
        assert f'id="sec-{name}"' in page
    assert "Why these sizes" in summary
    assert re.search(rf"claims: {len(verdicts)}: ", out)

    # the rows are an ordinary results tree
    from perflab.compare import compare
    from perflab.results import load

    rows = load(work / "outputs")
    assert set(rows["cfg.results.note"].dropna()) and (rows["status"] == "ok").any()
    assert len(compare(work / "outputs", experiment="matmul"))

    if CHROMIUM is None:
        pytest.skip("needs Chromium")
    dom = chromium("--dump-dom", (work / "report.html").as_uri(), profile=tmp_path / "profile").stdout
    data = body_data(dom)
    assert data["ready"] == "1" and data["errors"] == "0", data.get("error-text")


@pytest.mark.slow
def test_a_bad_budget_or_output_is_one_line_and_nothing_runs(work):
    for args, words in (
        (["--budget", "0"], "--budget=0: allowed: a number of minutes > 0"),
        (["--budget", "soon"], "--budget=soon"),
        (["-o", str(work)], "-o="),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "perflab.chapter", *args], cwd=work, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (work / "outputs" / "sweeps").exists()


# --- fast: what the chapter decides, on a machine the tests describe (no measuring) -----------


def stopped_plan(store: Path, budget: float = 3.0) -> Path:
    """A chapter of this host stopped after its first point, as ``perflab chapter`` keeps it."""
    folder = store / "sweeps" / "2026-01-01_10-00-00_chapter-aa"
    folder.mkdir(parents=True)
    points, seconds = chapter_module.plan(machine(), 100.0)
    plan = chapter_module.Chapter(budget, socket.gethostname(), "then", machine(), points, seconds)
    plan.outcomes = {"0": "ok"}
    plan.save(folder)
    return folder


def test_a_plan_that_cannot_be_read_or_does_not_match_the_experiments_is_said_not_continued(tmp_path):
    folder = stopped_plan(tmp_path)
    found = chapter_module.unfinished(tmp_path, 3.0)
    assert found is not None and found[1] == chapter_module.Chapter.read(folder), "a sound plan continues"
    kept = json.loads((folder / "chapter.json").read_text())
    made_up = {"section": "13.4", "preset": "made_up", "overrides": [], "estimate_s": 1.0, "why": "-"}
    two_done = {"0": "ok", "1": "ok"}
    cases = {
        DAMAGED: "Expecting value",
        "[]": "not an object",
        json.dumps({**kept, "points": [{**made_up, "module": "matmul"}], "outcomes": two_done}): (
            "an outcome of point 1, but the plan has 1 point"  # was "2 of 1 points done", then an IndexError
        ),
        json.dumps({**kept, "points": [{**made_up, "module": "made_up"}]}): "module 'made_up' is no experiment",
        json.dumps(
            {**kept, "points": [{**made_up, "module": "matmul", "why": None}]}
        ): "why: Incompatible value 'None'",
        json.dumps({**kept, "points": [made_up]}): "points[0]: module '' is no experiment",  # none named
        json.dumps({**kept, "budget_min": "soon"}): "budget_min: Value 'soon'",
    }
    for text, why in cases.items():
        (folder / "chapter.json").write_text(text)
        with pytest.raises(chapter_module.Unreadable) as err:
            chapter_module.unfinished(tmp_path, 3.0)
        assert err.value.path == folder / "chapter.json" and why in err.value.why, (text, err.value.why)
        assert (folder / "chapter.json").read_text() == text, "left as it is"


def test_a_budget_the_smallest_sizes_do_not_fit_is_refused_naming_the_smallest_that_does():
    points, _ = chapter_module.plan(machine(), chapter_module.SMALLEST_S)
    smallest = sum(p.estimate_s for p in points)
    assert smallest == pytest.approx(sum(p.estimate_s for p in chapter_module.plan(machine(), 0.01)[0]), rel=0.01)
    err = chapter_module.too_short("0.001", 0.001, 20.0, smallest)
    assert err is not None
    line = err.line()
    assert line.startswith("--budget=0.001: too short: starting and calibrating took 0:20, the jobs at their smallest")
    works = float(re.findall(r"allowed: at least ([\d.]+) minutes on this machine as it is now$", line)[0])
    assert chapter_module.too_short(f"{works:g}", works, 20.0, smallest) is None, "the budget it names fits"
    assert chapter_module.too_short("x", works - 0.5, 20.0, smallest) is not None, "the smallest (to half a minute)"


def test_a_calibration_of_seconds_shows_what_it_measures(capsys, monkeypatch):
    from perflab.measure.sizing import showing

    described = machine()
    with chapter_module.Calibrating() as shown, showing(shown.step):  # quick: shows nothing
        described.probe("lenet training, batch 64 (images/s)", lambda: 1.0)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(chapter_module.Calibrating, "QUIET_S", 0.0)
    with chapter_module.Calibrating() as shown, showing(shown.step):
        described.probe("resnet18 training, batch 8 (images/s)", lambda: 1.0)
        described.probe("resnet18 training, batch 8 (images/s)", lambda: 1.0)  # kept: not measured again
    shown_lines = capsys.readouterr().out.splitlines()
    assert shown_lines == ["    calibrating (0 s so far): resnet18 training, batch 8 (images/s)"]
    described.probe("lenet training, batch 32 (images/s)", lambda: 1.0)
    assert capsys.readouterr().out == "", "outside a calibration nothing is shown"


def test_a_machine_calibrated_before_answers_a_budget_without_calibrating_again(work, capsys, monkeypatch):
    store = work / "outputs"
    described = machine()
    chapter_module.keep_calibration(store, described, 200.0)
    kept = chapter_module.kept_calibration(store)
    assert kept is not None and kept[0] == described and kept[1] == 200.0

    def calibrating_again():
        raise AssertionError("calibrated again")

    monkeypatch.setattr(chapter_module, "calibration", calibrating_again)
    assert chapter_module.main(["--budget", "0.5", "--store", str(store)]) == 2
    said = capsys.readouterr()
    assert "this machine's calibration of " in said.out and "is kept (--calibrate measures it again)" in said.out
    assert "--budget=0.5: too short" in said.err and "the jobs at their smallest sizes need 3:20" in said.err
    with pytest.raises(AssertionError, match="calibrated again"):  # asked for: measured anew
        chapter_module.main(["--budget", "0.5", "--store", str(store), "--calibrate"])
    monkeypatch.setattr(chapter_module, "machine_key", lambda: "another machine")
    assert chapter_module.kept_calibration(store) is None, "another machine's calibration is not this one's"
    (store / ".perflab" / chapter_module.CALIBRATION).write_text('{"cut off')
    assert chapter_module.kept_calibration(store) is None, "a damaged file: calibrated anew"


def test_a_slow_models_training_probe_times_one_step_after_its_warm_up():
    import torch

    from perflab.measure import sizing

    calls = []

    class Slow(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 10)

        def forward(self, x):
            calls.append(1)
            time.sleep(sizing.PROBE_S * 1.1)
            return self.fc(x.flatten(1))

    rate = sizing.training_rate(machine(), "slow", Slow, (4,), batch=2)
    assert len(calls) == 2, "a warm-up step and one timed"
    assert 0 < rate < 2 / sizing.PROBE_S


# --- estimates: the hook's model at the pace each job had here before -------------------------


def test_a_jobs_estimate_is_its_hooks_model_at_the_pace_it_had_here_before(work):
    store = work / "outputs"
    described = machine()
    model, _ = chapter_module.plan(described, 300.0)
    assert all(p.estimate_s == p.model_s > 0 for p in model), "no pace kept: the hooks' own estimates"
    chapter_module.keep_calibration(store, described, 200.0)
    trained = [p for p in model if p.module == "train"]
    slow, fast = trained[0], model[-1]
    pace = {**{p.key: 2.0 for p in trained}, fast.key: 0.5}
    chapter_module.keep_pace(store, pace)
    chapter_module.keep_calibration(store, described, 210.0)  # calibrated again: the pace stays
    assert chapter_module.kept_pace(store) == pace
    paced, _ = chapter_module.plan(described, 300.0, chapter_module.kept_pace(store))
    by_key = {p.key: p for p in paced}
    for p in paced:
        assert p.estimate_s == pytest.approx(p.model_s * pace.get(p.key, 1.0)), p.key
    # jobs that ran at twice their model are asked for the seconds that, at that pace, fill their share
    assert by_key[slow.key].model_s < slow.model_s
    paced_training = sum(p.estimate_s for p in paced if p.module == "train")
    assert paced_training == pytest.approx(sum(p.estimate_s for p in trained), rel=0.3)
    # what a job took is its pace next time, within bounds
    ran = by_key[fast.key]
    assert chapter_module.learned(ran, 3 * ran.model_s) == pytest.approx(3.0)
    assert chapter_module.learned(ran, 100 * ran.model_s) == chapter_module.PACE[1]
    assert chapter_module.learned(ran, 4 * ran.model_s, before=1.0) == pytest.approx(2.0), "half-way from before"
    chapter_module.keep_pace(store, {"x:y:": 1e9})
    assert chapter_module.kept_pace(store)["x:y:"] == chapter_module.PACE[1], "a damaged pace is bounded"
    kept = json.loads((store / ".perflab" / chapter_module.CALIBRATION).read_text())
    (entry,) = kept.values()
    entry["pace"] = "not a pace"
    (store / ".perflab" / chapter_module.CALIBRATION).write_text(json.dumps(kept))
    assert chapter_module.kept_pace(store) == {}, "an unreadable pace: none"
    chapter_module.keep_pace(store, {fast.key: 0.5})
    assert chapter_module.kept_pace(store) == {fast.key: 0.5}, "and the next is kept over it"


def test_each_job_measured_keeps_its_pace_and_a_reused_one_does_not(work, one_thread):
    store, folder = work / "outputs", work / "sweep"
    folder.mkdir()
    described = machine()
    points, seconds = chapter_module.plan(described, 30.0)
    point = next(p for p in points if p.module == "matmul")
    point.overrides = ["experiment.size=64", "experiment.iterations=1", "bench.repeats=3", "bench.min_time_s=0"]
    point.model_s, point.estimate_s = 0.01, 1.0  # the hook's model far under what it takes: the pace's upper bound
    plan = chapter_module.Chapter(30.0, "here", "now", described, [point], seconds)
    progress = chapter_module.Progress(point.estimate_s)
    fits = time.time() + chapter_module.REPORT_S + 1.2 * point.estimate_s / chapter_module.MARGIN  # not re-sized
    assert chapter_module.run_points(plan, folder, store, fits, progress) == {0: "ok"}
    assert plan.points[0].overrides == point.overrides
    kept = chapter_module.kept_pace(store)
    assert kept == {point.key: chapter_module.PACE[1]} == plan.pace, "kept as soon as the job ended"
    chapter_module.keep_pace(store, {point.key: 1.0})
    plan.redo = False  # continued (in a folder of its own, as every chapter command): the point is done
    again = work / "sweep-continued"
    again.mkdir()
    assert chapter_module.run_points(plan, again, store, time.time(), progress) == {0: "done"}
    assert chapter_module.kept_pace(store) == {point.key: 1.0}, "a job reused, not measured: its pace stays"


@pytest.mark.parametrize("late_by", [2.0, 0.0, 0.5])
def test_one_job_up_to_twice_its_estimate_moves_the_eta_by_less_than_half(late_by):
    points, _ = chapter_module.plan(machine(), 480.0)
    progress = chapter_module.Progress(sum(p.estimate_s for p in points), max(p.estimate_s for p in points))
    try:
        for first in range(len(points)):  # each job in its turn the late one, the others on time
            for i, q in enumerate(points):
                before = progress.total - progress.done - q.estimate_s  # the ETA as it ends: what is left after it
                eta = before * progress.late
                progress.finish(q.estimate_s, q.estimate_s * (late_by if i == first else 1.0), reused=False)
                if eta > 0:
                    assert 0.5 <= progress.eta_s() / eta <= 1.5, (q.key, late_by, progress.eta_s(), eta)
            progress.done, progress.late, progress.actual, progress.estimated = 0.0, 1.0, 0.0, 0.0
    finally:
        progress.close()


def test_the_first_compile_is_estimated_shorter_where_inductors_cache_holds_graphs(tmp_path, monkeypatch):
    from perflab.book import compile as compile_exp

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (cold,) = compile_exp.chapter(machine(), 60.0)
    assert compile_exp.first_compile_s() == compile_exp.FIRST_COMPILE_S
    (tmp_path / "inductor" / "fxgraph" / "ab").mkdir(parents=True)  # a graph compiled before
    (warm,) = compile_exp.chapter(machine(), 60.0)
    assert compile_exp.first_compile_s() == compile_exp.WARM_COMPILE_S
    saved = compile_exp.FIRST_COMPILE_S - compile_exp.WARM_COMPILE_S
    assert warm.estimate_s == pytest.approx(cold.estimate_s - saved), "the same samples, a shorter first call"


def test_sizing_machine_is_calibration_this_release_with_a_warning():
    """``perflab.measure.sizing.Machine`` (the calibration, not ``instruments.machine.Machine``, the load
    watcher) is ``Calibration`` now; the old name still imports, warned."""
    from perflab.measure import sizing

    with pytest.warns(DeprecationWarning, match=r"sizing\.Machine is now Calibration .* goes in perflab 0\.6\.0"):
        assert sizing.Machine is sizing.Calibration  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        sizing.Nothing  # type: ignore[attr-defined]  # noqa: B018
