"""The HTML report: one self-contained file over a real results tree, read by a real browser.

The tree is built once per module from the project's own quick presets (CPU workers, so the
same rows on any machine): a matmul sweep over sizes, a training sweep over device counts,
compile, hardware, auto_parallel, async_compute, and comm with 1 worker (a skipped part) and
2. Chromium (headless) opens the report: an inline script in the page writes what rendered
(sections, drawn plots, script errors, fetched resources) into ``data-*`` attributes, which
``--dump-dom`` returns; ``--screenshot`` takes a picture of it.
"""

from __future__ import annotations

import contextlib
import html
import io
import re
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

import perflab
from perflab import report
from perflab.analysis import frames, plots
from perflab.analysis.table import human_time
from perflab.store.rundir import RunWriter

from conftest import FAST

# One worker builds the results tree below, once, and runs every test of this module: its
# fixtures are the session's, not the module's (a worker that runs another module's test between
# two of these would tear a module fixture down and build the tree again).
pytestmark = pytest.mark.xdist_group("report_tree")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install -y chromium)")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]
SECTIONS = ["compile", "async_compute", "auto_parallel", "matmul", "hardware", "train", "comm"]  # the book's order


@pytest.fixture(scope="session")
def tree(tmp_path_factory) -> Path:
    """A small real results tree (about 15 s on 2 CPU cores)."""
    root = tmp_path_factory.mktemp("tree")
    cpu = [*FAST, "devices.spec=cpu"]
    train = [*cpu, "strategy=scratch", "data.train_size=256", "data.test_size=64", "trainer.epochs=2"]
    jobs = [
        ("quick/matmul", [*cpu, "experiment.size=32"]),
        ("quick/matmul", [*cpu, "experiment.size=64"]),
        ("quick/train", [*train, "devices.count=1"]),
        ("quick/train", [*train, "devices.count=2"]),
        ("quick/compile", [*cpu, "experiment.backend=eager"]),
        ("quick/hardware", cpu),
        ("quick/auto_parallel", [*cpu, "devices.count=2"]),
        ("quick/async_compute", [*cpu, "experiment.size=64", "experiment.train_steps=2", "experiment.train_batch=16"]),
        ("quick/comm", [*cpu, "devices.count=1"]),  # allreduce skipped: needs 2 workers
        ("quick/comm", [*cpu, "devices.count=2"]),
    ]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        for preset, overrides in jobs:
            df = perflab.run(preset, overrides)
            assert df.attrs["outcome"] == "ok", (preset, overrides, df.attrs)
    return root / "outputs"


@dataclass
class Written:
    path: Path
    html: str
    printed: str


@pytest.fixture(scope="session")
def written(tree, tmp_path_factory) -> Written:
    """``python -m perflab.report TREE`` (in-process) in a fresh directory: the default -o."""
    where = tmp_path_factory.mktemp("report")
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.chdir(where)
        assert report.main([str(tree)]) == 0
    path = where / "report.html"
    return Written(path, path.read_text(), out.getvalue())


@dataclass
class Browsed:
    dom: str
    stderr: str
    screenshot: Path


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def browsed(written, tmp_path_factory) -> Browsed:
    if CHROMIUM is None:
        pytest.skip("needs Chromium")
    tmp = tmp_path_factory.mktemp("chromium")
    url = written.path.resolve().as_uri()
    dumped = chromium("--dump-dom", url, profile=tmp / "profile-dom")
    shot = tmp / "report.png"
    snapped = chromium(f"--screenshot={shot}", "--window-size=1280,4000", url, profile=tmp / "profile-shot")
    return Browsed(dumped.stdout, dumped.stderr + snapped.stderr, shot)


def body_data(dom: str) -> dict[str, str]:
    tag = re.search(r"<body([^>]*)>", dom)
    assert tag, "no <body> in the dumped DOM"
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag.group(1)))


def section(dom: str, ident: str) -> str:
    """The markup of one <section> (they do not nest)."""
    start = dom.index(f'id="{ident}"')
    return dom[start : dom.index("</section>", start)]


# --- the file -----------------------------------------------------------------------------------


def test_one_self_contained_file_with_nothing_to_fetch(written):
    page = written.html
    assert written.printed.strip() == "report.html"
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert not re.search(r"\b(src|href)\s*=\s*[\"']?\s*(https?:)?//", page, re.I)
    assert not re.search(r"url\(\s*[\"']?\s*(https?:)?//|@import", page, re.I)
    assert page.count("<svg") >= len(SECTIONS)  # the figures are inline
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "ids repeat across the inline figures"


def test_a_section_per_experiment_in_the_books_order(written):
    found = re.findall(r'<section class="experiment" id="sec-([^"]+)"[^>]*data-chapter="([^"]*)"', written.html)
    assert [name for name, _ in found] == SECTIONS
    assert [chapter for _, chapter in found] == ["13.1", "13.2", "13.3", "13.3", "13.4", "13.5", "13.7"]


def test_the_books_numbers_beside_ours(written):
    hardware, comm = section(written.html, "sec-hardware"), section(written.html, "sec-comm")
    assert "book 13.4: main memory up to 100 GB/s (a server CPU)" in hardware
    assert re.search(
        r"<td>cpu host memory copy</td><td>CPU \(2 threads\)</td><td>[\d.]+ GB/s</td><td>100 GB/s</td>", hardware
    )
    assert "4 GPUs: aggregate on one GPU, then broadcast</td><td>60 ms</td><td>60 ms" in comm
    train = section(written.html, "sec-train")
    assert "<td>global batch</td><td>256 on 1 and on 2 GPUs</td><td>256</td>" in train  # the book's setup beside ours


def test_environment_and_every_kind_of_warning(written):
    env = section(written.html, "environment")
    for column in ("hostname", "torch", "python", "cpu", "git_sha", "device_name", "num_threads", "load_before"):
        assert f"<td>{column}</td>" in env
    warnings = section(written.html, "warnings")
    assert re.search(r'data-kind="skipped"><td>comm</td><td>allreduce</td>.*needs 2 or more workers', warnings)
    assert re.search(r'data-kind="suspect"><td>train</td><td>train</td>.*too few samples \(1\)', warnings)


def test_without_matplotlib_it_still_renders_and_says_so(tree, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    page = report.build(tree)
    assert "<svg" not in page
    line = html.escape(report.MATPLOTLIB_LINE)
    assert page.count(line) >= 1 + len(SECTIONS)  # at the top, and where each plot would be
    assert "lenet x scratch on 2 devices" in page and 'class="rows"' in page


def test_a_bad_path_is_one_line_and_exit_2(work, capsys):
    assert report.main(["no/such/tree"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perflab report: error: no/such/tree") and err.count("\n") == 1
    (work / "empty").mkdir()
    assert report.main([str(work / "empty")]) == 2
    assert capsys.readouterr().err.startswith("perflab report: error: no result rows under")


def test_an_output_that_is_a_folder_is_refused(tree, work, capsys):
    (work / "out").mkdir()
    assert report.main([str(tree), "-o", str(work / "out")]) == 2
    assert capsys.readouterr().err.startswith("perflab report: error: ")


def test_several_paths_and_error_rows(tree, tmp_path):
    """A second tree beside the first: its rows join the same sections; a failed row is listed
    under Errors, a fall-back under Fall-backs (written by the project's own run writer)."""
    RunWriter(tmp_path / "other" / "crashed").add(
        {
            "row_id": "crashed#1",
            "run_id": "crashed",
            "experiment": "matmul",
            "measurement": "cuda:0 alone",
            "status": "oom",
            "error": "OutOfMemoryError: CUDA out of memory (a row written by hand)",
            "fallback": "devices.on_missing=cpu: ran on the CPU",
            "cfg.experiment.name": "matmul",
        }
    )
    page = report.build(tree, tmp_path / "other")
    assert "cuda:0 alone" in section(page, "sec-matmul")
    warnings = section(page, "warnings")
    assert re.search(r'data-kind="error"><td>matmul</td><td>cuda:0 alone</td>.*oom: OutOfMemoryError', warnings)
    assert "devices.on_missing=cpu: ran on the CPU (1 rows)" in warnings


def test_the_new_builders_draw_break_even_and_concurrency():
    compiled = pd.DataFrame(
        {
            "run_id": ["a", "a"],
            "status": ["ok", "ok"],
            "measurement": ["eager", "compile-default"],
            "median_s": [1e-3, 0.5e-3],
            "first_call_s": [1e-3, 10e-3],
            "break_even_calls": [float("nan"), 19.0],
        }
    )
    fig = plots.compile_break_even(compiled)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "calls k (count)" and ax.get_ylabel() == "cumulative time of k calls (s)"
    assert "compile-default: pays off after 19 calls" in [t.get_text() for t in fig.legends[0].get_texts()]
    parallel = pd.DataFrame(
        {
            "run_id": ["b"] * 3,
            "status": ["ok"] * 3,
            "measurement": ["cpu#0 alone", "cpu#1 alone", "cpu#0 + cpu#1 together"],
            "median_s": [1.0, 1.0, 1.25],
            "tflops": [1.0, 1.0, 1.6],
            "concurrency": [float("nan"), float("nan"), 1.6],
            "ideal_concurrency": [float("nan"), float("nan"), 2.0],
        }
    )
    fig = plots.alone_together(parallel)
    ax = fig.axes[0]
    assert ax.get_title() and "TFLOP/s" in ax.get_xlabel()
    assert "concurrency 1.60 of an ideal 2" in [t.get_text() for t in ax.texts]
    assert plots.svg(fig).startswith("<svg")


# --- in a real browser ---------------------------------------------------------------------------


@needs_chromium
def test_chromium_draws_every_section_and_plot_without_errors(browsed):
    data = body_data(browsed.dom)
    assert data["ready"] == "1", "the page's load handler did not run"
    assert data["errors"] == "0", data.get("error-text")
    assert data["resources"] == "0", "the page fetched something"
    assert data["sections"] == data["sections-drawn"] == str(len(SECTIONS))
    assert int(data["plots"]) >= len(SECTIONS) and data["plots-drawn"] == data["plots"]
    for name in SECTIONS:
        tag = re.search(rf'<section class="experiment" id="sec-{name}"[^>]*>', browsed.dom)
        assert tag and re.search(r'data-plots-drawn="[1-9]', tag.group(0)), f"{name}: no plot drawn"
    console = [line for line in browsed.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console


@needs_chromium
def test_chromium_screenshot_is_a_real_picture(browsed):
    data = browsed.screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 4000)
    assert len(data) > 100_000, f"{len(data)} bytes: a blank page?"
    with contextlib.suppress(ImportError):
        from PIL import Image

        with Image.open(browsed.screenshot) as im:
            colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is None or len(colors) > 50, "hardly any colours: nothing drawn"


@needs_chromium
def test_training_section_shows_the_scaling_plot_and_the_headline(browsed):
    train = section(browsed.dom, "sec-train")
    assert re.search(r'<figure class="plot" data-plot="scaling" data-drawn="1">', train)
    assert "Scaling: throughput(n) / throughput(1 device)" in train  # the figure's title, as its caption
    assert re.search(r"<td>1 device</td><td>lenet x scratch on 1 device: [\d.]+ images/s", train)
    assert re.search(r"<td>2 devices</td><td>lenet x scratch on 2 devices: [\d.]+ images/s", train)
    assert "<td>1.00x</td><td>100%</td>" in train  # S(1) and E(1) in the compared table


@needs_chromium
def test_warnings_section_lists_suspect_and_skipped_rows(browsed):
    warnings = section(browsed.dom, "warnings")
    assert re.search(r'<div class="warning" data-kind="suspect"><h3>Suspect figures \((\d+)\)</h3>', warnings)
    assert "too few samples (1) to know the spread" in warnings
    assert re.search(r'<div class="warning" data-kind="skipped"><h3>[^<]*\((\d+)\)</h3>', warnings)
    assert "needs 2 or more workers (devices.count=2)" in warnings
    glance = re.search(r'<p class="glance">Warnings: <a href="#warnings">([^<]*)</a>', browsed.dom)
    assert glance and "suspect" in glance.group(1) and "skipped" in glance.group(1)


# --- a report people read ------------------------------------------------------------------------


def test_runs_are_named_by_the_values_that_vary_and_an_absent_key_is_left_out():
    rows = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d"],
            "cfg.devices.count": [4, 1, None, 1],  # read back as floats, with an empty cell
            "cfg.trainer.batch_size": [512.0, 512.0, 256.0, 512.0],
            "cfg.trainer.compile": ["True", "False", "False", "False"],
            "cfg.results.store": ["x", "y", "z", "w"],  # where results were kept: not what was measured
        }
    )
    labels = [label for label, _ in frames.runs(rows)]
    assert labels == [
        "1 device, batch 512, no compile #1",
        "1 device, batch 512, no compile #2",
        "4 devices, batch 512, compile",
        "batch 256, no compile",
    ]
    assert frames.words("cfg.strategy.name", "ddp") == "ddp" and frames.words("experiment.size", 1024.0) == "size 1024"
    assert frames.words("bench.min_time_s", 0.5) == "min time 0.5 s"
    assert [human_time(s) for s in (0.0009996, 0.000999)] == ["1 ms", "999 us"]  # never "1e+03 us"


def test_legends_sit_outside_the_axes_and_the_roof_matches_the_points_precision():
    """A bfloat16 point is drawn under the bfloat16 roof of its device, not the float32 one (and
    never under a higher peak it cannot reach); the key is beside the axes, not on the data."""
    rows = pd.DataFrame(
        {
            "experiment": ["mine", "mine"],
            "status": ["ok", "ok"],
            "device_name": ["CPU", "CPU"],
            "intensity": [10.0, 20.0],
            "tflops": [0.1, 0.2],
            "flops_dtype": ["bfloat16", "bfloat16"],
        }
    )
    roofs = [plots.Roof("CPU", "float32", 50.0, 0.3), plots.Roof("CPU", "bfloat16", 50.0, 0.6)]
    fig = plots.roofline(rows, roofs)
    ax = fig.axes[0]
    (roof,) = [line for line in ax.get_lines() if "roof" in line.get_label()]
    assert "bfloat16" in roof.get_label() and roof.get_data()[1].max() == pytest.approx(0.6)
    assert ax.get_legend() is None and len(fig.legends) == 1  # a figure legend, laid out beside the axes
    fig.canvas.draw()
    frame = ax.get_window_extent()
    key = fig.legends[0].get_window_extent()
    assert not frame.overlaps(key), "the legend covers the axes"
    assert plots.roofline(rows.assign(flops_dtype="float16"), roofs) is None  # no roof of its precision: not drawn


# --- what a new user on a 2-core machine read (issue 27) ----------------------------------------


def busy(pct: int) -> str:
    return (
        f"the machine was busy: other processes used {pct}% of the CPUs meanwhile; its threads spent "
        f"{pct - 1}% of their runnable time waiting for a CPU"
    )


@pytest.fixture(scope="module")
def two_core_page() -> str:
    """A matmul size sweep on one CPU and an auto_parallel run on the CPU split in two workers,
    both fallen back from a GPU, on a busy machine: the rows as perflab writes them."""
    sizes = [64, 128, 256]
    sweep = pd.DataFrame(
        {
            "run_id": [f"run{s}" for s in sizes],
            "experiment": "matmul",
            "cfg.experiment.name": "matmul",
            "cfg.experiment.size": sizes,
            "cfg.experiment.dtype": "float32",
            "measurement": "cpu alone",
            "status": "ok",
            "n": 3,
            "median_s": [0.19, 0.19, 1e-3],
            "iqr_s": [0.0, 0.01, 0.09],
            "noisy": [False, False, True],
            "tflops": [1.1e-5, 8.76e-5, 0.131],
            "devices": "cpu",
            "device_name": "CPU (2 threads)",
            "suspect": [busy(83), busy(84), busy(85)],
            "fallback": "no CUDA device: ran on the CPU",
        }
    )
    split = pd.DataFrame(
        {
            "run_id": "par",
            "experiment": "auto_parallel",
            "cfg.experiment.name": "auto_parallel",
            "measurement": ["cpu#0 alone", "cpu#1 alone", "cpu#0 + cpu#1 together", "compute + copy to CPU"],
            "status": ["ok", "ok", "ok", "skipped"],
            "error": ["", "", "", "needs a CUDA device"],
            "n": 10,
            "median_s": [3e-3, 3e-3, 5e-3, None],
            "iqr_s": [1e-4, 1e-4, 1e-4, None],
            "tflops": [0.036, 0.036, 0.04, None],
            "devices": ["cpu#0", "cpu#1", "cpu#0+cpu#1", "cpu#0+cpu#1"],
            "device_name": "CPU (1 thread)",
            "suspect": [busy(80), busy(80), busy(80), ""],
            "fallback": "no CUDA device: ran on the CPU; no GPU: the CPU split into 2 workers",
        }
    )
    return report.Report(pd.concat([sweep, split], ignore_index=True), ["outputs"]).render()


def test_a_fall_back_names_its_experiments_under_experiment(two_core_page):
    warnings = section(two_core_page, "warnings")
    fallbacks = warnings[warnings.index('data-kind="fallback"') :]
    assert "<td>matmul</td><td></td><td>3 runs</td><td>no CUDA device: ran on the CPU (3 rows)</td>" in fallbacks


def test_a_sweep_of_one_device_is_not_titled_devices_together(two_core_page):
    matmul, parallel = section(two_core_page, "sec-matmul"), section(two_core_page, "sec-auto_parallel")
    assert "then all devices together" not in matmul and "Each device alone (nothing run together)" in matmul
    assert "Each device alone, then all devices together" in parallel


def test_the_cpu_split_in_workers_is_said_as_workers_not_one_thread(two_core_page):
    parallel = section(two_core_page, "sec-auto_parallel")
    assert "on 2 devices (cpu#0, cpu#1), each CPU (1 thread)" in parallel
    assert "; on CPU (2 threads)" in section(two_core_page, "sec-matmul")


def test_a_reason_every_row_gives_is_said_once(two_core_page):
    matmul = section(two_core_page, "sec-matmul")
    rows = matmul[matmul.index('class="rows"') :]
    assert rows.count("the machine was busy") == 1
    assert "Every measured row: the machine was busy: other processes used 83 to 85% of the CPUs" in rows
    warnings = section(two_core_page, "warnings")
    suspect = re.findall(r'data-kind="suspect"><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>', warnings)
    assert suspect == [
        ("matmul", "cpu alone", "3 runs"),
        ("auto_parallel", "cpu#0 alone, cpu#1 alone, cpu#0 + cpu#1 together", "par"),
    ]
    parallel = section(two_core_page, "sec-auto_parallel")
    assert parallel.count("the machine was busy") == 1 and "Every measured row: the machine was busy" in parallel
    assert "needs a CUDA device" in parallel  # a skipped part keeps its own reason


def test_words_about_size_and_rates_come_from_the_figures(two_core_page):
    page = two_core_page
    assert "A 64² matmul (float32)" in page and "A large matmul (64" not in page
    assert "64² is no large matmul" in page
    assert "11 MFLOP/s" in page and "87.6 MFLOP/s" in page and "0.131 TFLOP/s" in page
    assert not re.search(r"\de-\d", page.split("<svg")[0]), "a rate in scientific notation"


def test_an_iqr_of_three_samples_is_unknown_but_a_noisy_one_says_its_figure(two_core_page):
    matmul = section(two_core_page, "sec-matmul")
    assert "<td>0.0%</td>" not in matmul and "<td>?</td>" in matmul
    assert "IQR 9000.0% of the median over n=3 samples" in section(two_core_page, "warnings")


def test_an_mfu_above_a_peak_that_is_a_floor_says_so():
    """A VM's TSC clock makes a CPU's datasheet peak a lower bound: an MFU of 105 % against it is
    said as a share of that bound, never bare."""
    from perflab.experiments import train
    from perflab.measure import flops

    basis = f"2 cores x 2.60 GHz ...; clock: a VM's TSC rate ({flops.TURBO_UNKNOWN})"
    summary = {"measurement": "train", "status": "ok", "items_per_s": 100.0, "tflops": 2e-5, "mfu": 1.05}
    (line,) = [x for x in train.headline([{**summary, "datasheet_basis": basis}]) if "MFU" in x]
    assert "MFU 105.0% of a lower bound on the datasheet peak" in line and "20 MFLOP/s" in line
    (plain,) = [x for x in train.headline([{**summary, "mfu": 0.4}]) if "MFU" in x]
    assert plain.endswith("MFU 40.0%")
