"""The command line and perflab.run(), end to end: every preset's quick variant runs (a new
experiment is covered by adding it), mistakes are one line, crashes are rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import pandas as pd
import pytest
import torch
import torch._dynamo

import perflab
from perflab.config import registry
from perflab.config.composition import experiments_allowed
from perflab.errors import Refused
from perflab.results import load

from conftest import FAST, ROOT, cpu_only, presets, run_subprocess

# Quick variants that still take long in the fast suite get a cheaper stand-in here; each runs as
# shipped in the slow set (test_config composes and validates every preset as shipped).
CHEAPER = {
    "compile": ["experiment.backend=eager"],
    "async_compute": ["experiment.size=64", "experiment.train_steps=2", "experiment.train_batch=16"],
    "resnet18_concise": ["data.train_size=32", "data.test_size=16"],
    "train": ["data.train_size=512", "data.test_size=256"],
    "lenet_scratch": ["data.train_size=512", "data.test_size=256"],
    # one worker (allreduce skipped): two gloo workers cost 5 s of CPU; they measure allreduce fast
    # in test_comm.py, and comm-as-shipped below runs them in the slow set
    "comm": ["devices.count=1"],
}


def quick_runs() -> list:
    fast = [pytest.param(p, CHEAPER.get(p, []), id=p) for p in presets()]
    shipped = [pytest.param(p, [], id=f"{p}-as-shipped", marks=pytest.mark.slow) for p in presets() if p in CHEAPER]
    return fast + shipped


def run_dirs(work):
    return sorted((work / "outputs" / "runs").glob("*"))


def test_no_experiment_lists_them_and_writes_nothing(cli, work):
    ran = cli()
    assert "+experiment=NAME" in ran.out and "auto_parallel" in ran.out
    assert not (work / "outputs").exists()


@pytest.mark.parametrize("preset, cheaper", quick_runs())
def test_every_quick_preset_runs_and_writes_honest_rows(cli, work, preset, cheaper):
    ran = cli(f"+experiment=quick/{preset}", *FAST, *cheaper)
    assert "measurement" in ran.out and "rows:" in ran.out  # the end-of-job table
    (run,) = run_dirs(work)
    df = load(run)
    assert set(df["experiment"]) == {preset} and df["run_id"].nunique() == 1
    ok = df[(df["status"] == "ok") & df["median_s"].notna()] if "median_s" in df else df.iloc[:0]
    assert len(df[df["status"] == "ok"]) >= 1
    for _, row in ok.iterrows():
        assert row["min_s"] <= row["median_s"] <= row["max_s"] and row["median_s"] > 0
        assert row["timer"] in ("wall_sync", "wall_nosync", "cuda_event")
    for col in ("torch", "hostname", "git_sha", "perflab_version", "timestamp", "config_hash"):
        assert df[col].notna().all(), col
    samples = load(run, samples=True)
    assert set(ok["row_id"]) <= set(samples["row_id"])
    record = (run / "run.json").read_text()
    assert '"complete": true' in record and '"outcome": "ok"' in record
    headline = registry.get(df["cfg.experiment.name"].iloc[0]).headline(load(run).to_dict("records"))
    assert headline and all(line in ran.out for line in headline), "the figures that matter, on screen"


def test_the_python_api_returns_the_rows_it_wrote(work):
    df = perflab.run("quick/matmul", FAST)
    assert isinstance(df, pd.DataFrame) and df.attrs["outcome"] == "ok"
    on_disk = load(df.attrs["run_dir"])
    assert list(on_disk["row_id"]) == list(df["row_id"])
    assert (work / "outputs" / "runs").is_dir()
    with pytest.raises(Refused, match=r"^experiment.size=-5: allowed: an integer >= 1$"):
        perflab.run("matmul", ["experiment.size=-5"])
    with pytest.raises(Refused, match=r"^trainer.epochs=2: the matmul experiment has no trainer keys"):
        perflab.run("matmul", ["trainer.epochs=2"])
    with pytest.raises(Refused, match=r"^experiment.size=-5: allowed: an integer >= 1$"):  # one string, split
        perflab.run("matmul", "bench.repeats=3  experiment.size=-5")
    with pytest.raises(Refused, match=r"^overrides: 3 \(int\) is not a key=value string; allowed: a list of"):
        perflab.run("matmul", ["bench.repeats=3", 3])
    with pytest.raises(Refused, match=r"^experiment=: no experiment named; allowed: async_compute, "):
        perflab.run("")


@cpu_only
def test_auto_parallel_on_cpu_uses_labelled_workers(work):
    df = perflab.run("quick/auto_parallel", FAST).set_index("measurement")
    assert {"cpu#0 alone", "cpu#1 alone", "cpu#0 + cpu#1 together"} <= set(df.index)
    together = df.loc["cpu#0 + cpu#1 together"]
    alone = df.loc["cpu#0 alone", "median_s"] + df.loc["cpu#1 alone", "median_s"]
    assert together["sum_alone_s"] == pytest.approx(alone)
    assert together["concurrency"] == pytest.approx(alone / together["median_s"])
    assert together["ideal_concurrency"] == 2
    assert "no CUDA device" in together["fallback"] and "split into 2 workers" in together["fallback"]
    copy = df.loc["compute + copy to CPU"]
    assert copy["status"] == "skipped" and "needs a CUDA device" in copy["error"]


@cpu_only
def test_async_compute_says_cpu_ops_are_synchronous(work):
    small = ["experiment.size=64", "experiment.train_steps=2", "experiment.train_batch=16"]
    df = perflab.run("quick/async_compute", [*FAST, *small]).set_index("measurement")
    assert df.loc["torch cpu, no sync (host dispatch)", "timer"] == "wall_nosync"
    assert df.loc["torch cpu, synced (device time)", "timer"] == "wall_sync"
    assert "synchronously" in df.loc["torch cpu, no sync (host dispatch)", "note"]
    item = df.loc["lenet cpu x2 steps, .item() every step"]
    free = df.loc["lenet cpu x2 steps, free-running (device time)"]
    assert item["slowdown_vs_free"] == pytest.approx(item["median_s"] / free["median_s"])


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["+experiment=nope"],
            "experiment=nope: unknown experiment; allowed: " + experiments_allowed(),  # a user's installed ones too
        ),
        (["+experiment=matmul", "experiment.size=-5"], "experiment.size=-5: allowed: an integer >= 1"),
        (
            ["+experiment=matmul", "experiment.sise=5"],
            "experiment.sise=5: unknown key; did you mean experiment.size?; allowed: the keys under experiment: "
            "name, size, iterations, dtype",
        ),
        (
            ["+experiment=matmul", "trainer.batch_size=-1"],
            "trainer.batch_size=-1: the matmul experiment has no trainer keys; allowed: the keys "
            "`perflab +experiment=matmul --help` lists",
        ),
        (
            ["-m", "+experiment=quick/matmul", "experiment.size=16,32", "trainer.epochs=2"],
            "trainer.epochs=2: the quick/matmul experiment has no trainer keys; allowed: the keys "
            "`perflab +experiment=quick/matmul --help` lists",
        ),
        (
            ["+experiment=quick/train", "trainer.precision=tf32", "devices.spec=cpu"],
            "trainer.precision=tf32: TF32 is a mode of NVIDIA tensor cores (CUDA only); allowed: fp32, "
            "bf16-mixed or fp16-mixed on this device",
        ),
        (
            ["+experiment=quick/matmul", "experiment.size=${oops}"],
            "experiment.size=${oops}: Interpolation key 'oops' not found; allowed: a value, or a ${...} that resolves",
        ),
        (
            ["+experiment=quick/matmul", "bench.repeats=${oc.env:PERFLAB_TEST_UNSET}"],
            "bench.repeats=${oc.env:PERFLAB_TEST_UNSET}: KeyError raised while resolving interpolation: "
            "\"Environment variable 'PERFLAB_TEST_UNSET' not found\"; allowed: a value, or a ${...} that resolves",
        ),
        (
            ["+experiment=quick/compile", "experiment.modes=[]"],
            "experiment.modes=[]: allowed: a non-empty list of eager, torchscript, compile-default, "
            "compile-reduce-overhead, compile-max-autotune, compile-max-autotune-no-cudagraphs",
        ),
        (
            ["+experiment=quick/compile", "experiment.modes=eager"],
            "experiment.modes=eager: allowed: a list, e.g. experiment.modes=[a,b]",
        ),
        (
            ["+experiment=quick/matmul", "experiment.name=train"],
            "experiment.name=train: allowed: the preset's own; choose the experiment with +experiment=NAME",
        ),
        (
            ["+experiment=quick/train", "data.num_classes=1"],
            "data.num_classes=1: allowed: an integer >= 2 (a classifier)",
        ),
        (
            ["+experiment=quick/train", "strategy=ddp", "strategy.rdzv_endpoint=localhost:99999"],
            "strategy.rdzv_endpoint=localhost:99999: allowed: host:port, with a port from 1 to 65535",
        ),
        (
            ["+experiment=quick/compile", "experiment.backend=nope"],
            "experiment.backend=nope: not a torch.compile backend; allowed: "
            + ", ".join(
                b for b in torch._dynamo.list_backends(exclude_tags=()) if "TESTING" not in b and "minifier" not in b
            ),
        ),
        (
            ["+experiment=quick/train", "data.workers=100000"],
            f"data.workers=100000: allowed: 0 to {os.cpu_count()} (this machine's CPUs)",
        ),
        (
            ["+experiment=quick/train", "trainer.batch_size=100000"],
            "trainer.batch_size=100000: allowed: a global batch (100000 here) <= the training set (2048)",
        ),
        (
            ["+experiment=quick/train", "data=fashion_mnist", "data.root=/nonexistent"],
            "data.root=/nonexistent: no Fashion-MNIST files there; allowed: a folder with FashionMNIST/raw/*-ubyte "
            "files (torchvision's layout), data.download=true (needs internet), or data=synthetic",
        ),
        (
            ["+experiment=quick/train", "strategy=ddp", "devices.spec=cpu", "strategy.backend=nccl"],
            "strategy.backend=nccl: NCCL needs GPUs; allowed: auto or gloo on CPU devices",
        ),
        pytest.param(
            ["+experiment=quick/comm", "experiment.cpu_workers=10000"],
            f"experiment.cpu_workers=10000: no GPU here: the CPU is split into workers, and it has "
            f"{torch.get_num_threads()} cores for torch; allowed: at most {torch.get_num_threads()} (one per core)",
            marks=cpu_only,
        ),
        (
            ["+experiment=quick/matmul", "model=resnet18"],
            "model=resnet18: the quick/matmul experiment has no model keys; allowed: the keys "
            "`perflab +experiment=quick/matmul --help` lists",
        ),
        (
            ["+experiment=matmul", "+bench.repeat=3"],
            "bench.repeat=3: unknown key; did you mean bench.repeats?; allowed: the keys under bench: warmup, repeats, "
            "min_time_s, timer, noise_threshold, busy_threshold, profile, processes, instructions",
        ),
        (
            ["+launcher=slurm", "+experiment=matmul"],
            "+launcher=slurm: a launcher runs sweeps; allowed: add -m (perflab -m +launcher=slurm ...), or leave the "
            "launcher out to run here",
        ),
        pytest.param(
            ["+experiment=matmul", "devices.spec=[cuda:3]"],
            "devices.spec=[cuda:3]: this machine has no CUDA device; allowed: cpu or auto",
            marks=cpu_only,
        ),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(cli, work, args, line):
    ran = cli(*args, rc=2)
    assert ran.err.strip().splitlines() == [f"perflab: error: {line}"]
    assert "Traceback" not in ran.out + ran.err
    assert run_dirs(work) == []


def test_a_plain_runs_mistake_is_refused_from_one_composition_as_the_job_would(work):
    """The front door's check (one composition by Hydra's compose API, before hydra.main): the
    job's own line for a bad value or key; nothing for a valid run, a sweep or what only Hydra
    can resolve."""
    from perflab.app import checked_before_hydra

    for args, line in [
        (["+experiment=matmul", "experiment.size=-5"], "experiment.size=-5: allowed: an integer >= 1"),
        (["+experiment=quick/matmul", "experiment.name=train"], "experiment.name=train: allowed: the preset's own; "
         "choose the experiment with +experiment=NAME"),
        (["+experiment=quick/train", "data.num_classes=1"], "data.num_classes=1: allowed: an integer >= 2 "
         "(a classifier)"),
    ]:  # fmt: skip
        assert checked_before_hydra(args) == line
    for args in (
        ["+experiment=quick/matmul", "bench.repeats=3"],
        ["+experiment=quick/matmul", "results.store=${hydra:runtime.cwd}/out"],
        ["+experiment=quick/matmul", "experiment.size=16,32"],
    ):
        assert checked_before_hydra(args) is None, args


def test_help_lists_only_the_groups_the_experiment_has(cli):
    def groups(experiment):
        out = cli(f"+experiment={experiment}", "--help").out
        return next(line for line in out.splitlines() if line.startswith("Groups"))

    assert groups("matmul") == "Groups (choose with group=NAME): launcher: parallel, slurm"
    train = groups("quick/train")
    assert re.search(r"model: [\w, ]*\blenet\b", train) and "strategy: data_parallel" in train


def test_help_of_a_sweep_shows_the_keys_and_what_is_swept(cli):
    out = cli("-m", "+experiment=quick/matmul", "experiment.size=64,128", "experiment.iterations=3", "--help").out
    assert "Swept (with -m, one job per value), shown without: experiment.size=64,128" in out
    assert "  size: 256\n  iterations: 3\n" in out  # the preset's size, the override's iterations


def test_misused_hydra_flags_are_one_line(cli):
    ran = cli("-m", "+experiment=matmul", "--cfg", "job", rc=2)
    assert ran.err.strip().splitlines() == [
        "perflab: error: Only one of --run, --multirun, --cfg, --info and --shell_completion can be specified"
    ]


@cpu_only
def test_missing_device_can_be_a_skipped_row(cli, work):
    cli("+experiment=matmul", "devices.spec=[cuda:3]", "devices.on_missing=skip")
    df = load(work / "outputs")
    assert df["status"].tolist() == ["skipped"]
    assert "this machine has no CUDA device" in df.loc[0, "error"]


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_runs_never_share_a_dir_or_an_id(work):
    cmd = [
        sys.executable,
        "-m",
        "perflab",
        "+experiment=quick/matmul",
        "experiment.size=8",
        "bench.repeats=1",
        "bench.min_time_s=0",
        "results.table=false",
    ]
    procs = [subprocess.Popen(cmd, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    assert len(run_dirs(work)) == 2
    assert load(work / "outputs")["run_id"].nunique() == 2


def test_a_crash_inside_an_experiment_becomes_an_error_row(cli, work, monkeypatch):
    def crash_after_one_row(ctx):
        ctx.record("first part", note="finished before the crash")
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(registry.get("matmul").module, "run", crash_after_one_row)
    cli("+experiment=matmul", "results.table=false", rc=1)
    df = load(work / "outputs")
    assert df["status"].tolist() == ["ok", "error"]
    assert df.loc[1, "error"] == "RuntimeError: boom"
    (run,) = run_dirs(work)
    assert "second line" in (run / "error.txt").read_text()
    assert '"outcome": "error"' in (run / "run.json").read_text()


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_output_to_a_closed_pipe_is_clean(work):
    proc = subprocess.run(
        f"{sys.executable} -m perflab +experiment=quick/matmul {' '.join(FAST)} | head -1",
        shell=True,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert len(load(work / "outputs")) >= 1  # the job still wrote its rows


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_library_warnings_stay_out_of_the_terminal(work):
    proc = run_subprocess("+experiment=quick/compile", "experiment.modes=[eager,torchscript]", *FAST, cwd=work)
    assert "Warning" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["quick/matmul"],
            "quick/matmul: an experiment is chosen with a key; allowed: perflab +experiment=quick/matmul",
        ),
        (
            ["comapre", "outputs"],
            "comapre: not a command or a key=value; did you mean compare?; allowed: perflab +experiment=NAME "
            "[key=value ...], perflab compare|results|report|history|chapter|ab ..., perflab --help",
        ),
        (
            ["+experiment=quick/matmull"],
            "experiment=quick/matmull: unknown experiment; did you mean quick/matmul?; allowed: "
            + experiments_allowed(),
        ),
        (
            ["+experiments=matmul"],
            "experiments=matmul: unknown key; did you mean experiment?; allowed: the keys under the top level: "
            "experiment, devices, bench, results, seed, model, data, strategy, trainer",
        ),
        (
            ["bench.repeats=3"],
            "experiment: missing; allowed: +experiment=NAME before the other keys (perflab lists the names)",
        ),
        (
            ["experiment=", "bench.repeats=3"],
            "experiment=: no experiment named; allowed: " + ", ".join(registry.choices()) + " (and quick/NAME)",
        ),
        (
            ["+experiment=quick/matmul", "experiment.size=64,128"],
            "experiment.size=64,128: several values make a sweep; allowed: add -m (perflab -m ...), or give one value",
        ),
    ],
)
def test_what_people_type_first_gets_one_line_saying_what_to_type(cli, work, args, line):
    ran = cli(*args, rc=2)
    assert ran.err.strip().splitlines() == [f"perflab: error: {line}"]
    assert not (work / "outputs").exists()


def test_experiment_without_plus_subcommands_version_and_short_ids(cli, work):
    ran = cli("experiment=quick/matmul", *FAST)
    run_dir = run_dirs(work)[0]
    assert str(run_dir) in ran.out  # the job names its run dir, whose short id ...
    short = run_dir.name.rpartition("_")[2]
    shown = cli("results", "show", short)  # ... `perflab results show` accepts
    assert load(run_dir)["run_id"].iloc[0] in shown.out
    assert "quick/matmul" not in cli("results").err
    assert "| experiment |" in cli("compare", "outputs").out
    assert cli("--version").out.startswith(f"perflab {perflab.__version__} (torch ")


def test_a_torchvision_not_built_for_the_installed_torch_is_one_line_naming_a_pair_that_exists(monkeypatch):
    from importlib import metadata

    from perflab.config import install
    from perflab.errors import ConfigError

    pair = install.tested_pair()  # read back from perflab's own metadata: pyproject's caps
    caps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert pair is not None and {f"torch>=2.11,<2.{int(pair[0][2:]) + 1}"} <= set(caps)
    assert install.release(pair[1])[1] == install.release(pair[0])[1] + install.TORCHVISION_MINOR_OFFSET
    tested = f"the pair perflab is tested with (pip install 'torch=={pair[0]}.*' 'torchvision=={pair[1]}.*')"
    real = metadata.version
    versions = {"torch": "2.13.0", "torchvision": "0.29.1"}
    monkeypatch.setattr(metadata, "version", lambda name: versions[name])
    with pytest.raises(ConfigError) as refused:
        install.check_torch_pair()
    assert refused.value.line() == (
        "torchvision=0.29.1: not built for the installed torch 2.13.0; allowed: torchvision 0.28.* beside torch "
        f"2.13.0 (pip install 'torchvision==0.28.*'), or {tested}"
    )
    versions.update(
        torch="2.99.0", torchvision="0.29.2"
    )  # a torch newer than any tested: its torchvision may not exist
    with pytest.raises(ConfigError) as refused:
        install.check_torch_pair()
    assert refused.value.line() == (f"torchvision=0.29.2: not built for the installed torch 2.99.0; allowed: {tested}")
    versions.update(torch="2.14.1+cpu", torchvision="0.29.1")
    install.check_torch_pair()  # a matching pair, local build tags aside
    monkeypatch.setattr(metadata, "version", real)
    install.check_torch_pair()  # and the pair installed here


@pytest.mark.slow  # end to end: in .ci/run's slow step, off the README's 3-minute set
def test_a_broken_install_stops_the_tests_at_once_with_one_line(tmp_path):
    """A torchvision not built for the installed torch: the test run says so once, runs nothing."""
    meta = tmp_path / "torchvision-0.99.0.dist-info"  # seen first on sys.path, as a wrong install would be
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.99.0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_columns.py", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = [line for line in proc.stdout.splitlines() if "install is broken" in line]  # pytest's own frame around it
    assert len(said) == 1 and "torchvision=0.99.0: not built for the installed torch" in said[0]
    assert " passed" not in proc.stdout and " failed" not in proc.stdout
