"""``perflab chapter`` end to end, as a user runs it: a tiny budget, Ctrl-C after its first
points, the same command again (which continues), then the report in a real browser, and the
rows as an ordinary results tree. Slow: minutes of CPU (the chapter's smallest sizes)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import CHROMIUM, body_data, chromium

from perflab.analysis.claims import VERDICTS

SECTIONS = ["13.1", "13.2", "13.3", "13.4", "13.5", "13.6", "13.7"]


def chapter(work: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "perflab.chapter", "--budget", "3", "-o", "report.html", *args],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def sweeps(work: Path) -> list[Path]:
    return sorted((work / "outputs" / "sweeps").glob("*_chapter-*"))


@pytest.mark.slow
def test_the_chapter_runs_stops_continues_judges_and_reports(work, tmp_path):
    first = chapter(work)
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

    second = chapter(work)
    out, err = second.communicate(timeout=900)
    assert second.returncode == 0, out + err
    assert "continuing the chapter started" in out and "0 of" not in out.split("continuing")[1].split("\n")[0]
    continued = [s for s in sweeps(work) if s != stopped]
    assert len(continued) == 1
    reused = [json.loads((continued[0] / str(i) / "run.json").read_text()) for i in (0, 1)]
    assert [r["outcome"] for r in reused] == ["done", "done"], "the points done before are reused, not measured again"
    assert json.loads((continued[0] / "chapter.json").read_text())["finished"]
    assert json.loads((stopped / "chapter.json").read_text())["finished"] == f"continued in {continued[0].name}"
    assert re.search(r"done in \d+:\d\d of the 3:00 budget", out)
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
