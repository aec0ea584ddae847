"""Device specs resolve against an inventory (injected: no GPU needed to test GPU specs)."""

from __future__ import annotations

import threading

import pytest
import torch

from perflab.config.schema import DevicesConfig
from perflab.errors import ConfigError, MissingDevice
from perflab.measure.devices import Inventory, Together, cpu_threads, resolve

CPU_ONLY = Inventory(cuda=0, mps=False, cpu_threads=8)
TWO_GPUS = Inventory(cuda=2, mps=False, cpu_threads=8)


def names(spec, inv, count=None):
    return resolve(DevicesConfig(spec=spec, count=count), inv).names


def test_auto_takes_every_gpu():
    r = resolve(DevicesConfig(), TWO_GPUS)
    assert r.names == ["cuda:0", "cuda:1"] and r.fallback == ""


def test_auto_on_cpu_only_machine_is_a_labelled_fallback():
    r = resolve(DevicesConfig(), CPU_ONLY)
    assert r.names == ["cpu"]
    assert "no CUDA device" in r.fallback
    assert r.devices[0].threads == 8


def test_counts_and_lists():
    assert names("auto", TWO_GPUS, count=1) == ["cuda:0"]
    assert names("cuda", TWO_GPUS) == ["cuda:0", "cuda:1"]
    assert names(["cuda:1", "cpu"], TWO_GPUS) == ["cuda:1", "cpu"]
    assert names("cuda:1", TWO_GPUS) == ["cuda:1"]


def test_cpu_workers_split_the_threads():
    devices = resolve(DevicesConfig(spec="cpu", count=4), CPU_ONLY).devices
    assert [d.name for d in devices] == ["cpu#0", "cpu#1", "cpu#2", "cpu#3"]
    assert {d.threads for d in devices} == {2}
    assert all(d.torch == torch.device("cpu") for d in devices)


@pytest.mark.parametrize(
    "spec, count, inv, line",
    [
        (["cuda:3"], None, CPU_ONLY, "devices.spec=[cuda:3]: this machine has no CUDA device; allowed: cpu or auto"),
        (
            ["cuda:3"],
            None,
            TWO_GPUS,
            "devices.spec=[cuda:3]: this machine has 2 CUDA devices; allowed: cpu, cuda:0..cuda:1",
        ),
        ("cuda", 4, TWO_GPUS, "devices.count=4: this machine has 2 CUDA devices; allowed: at most 2"),
        ("cuda", None, CPU_ONLY, "devices.spec=cuda: this machine has no CUDA device; allowed: cpu or auto"),
        (["mps"], None, CPU_ONLY, "devices.spec=[mps]: this machine has no MPS device; allowed: cpu, cuda:N or auto"),
        (
            "cpu",
            9,
            CPU_ONLY,
            "devices.count=9: this process may use 8 CPUs; allowed: at most 8 CPU workers (one per core)",
        ),
    ],
)
def test_missing_devices_are_one_line(spec, count, inv, line):
    with pytest.raises(MissingDevice) as err:
        resolve(DevicesConfig(spec=spec, count=count), inv)
    assert err.value.line() == line


def test_a_list_may_hold_several_cpu_workers_beside_a_gpu():
    devices = resolve(DevicesConfig(spec=["cuda:0", "cpu", "cpu"]), TWO_GPUS).devices
    assert [(d.name, d.threads) for d in devices] == [("cuda:0", None), ("cpu#0", 4), ("cpu#1", 4)]


@pytest.mark.parametrize(
    "spec, count, fragment",
    [
        (["gpu0"], None, "'gpu0' is not a device name"),
        (["cuda:0", "cuda:0"], None, "a device is listed twice"),
        (["cuda", "cuda:0"], None, "a device is listed twice"),
        (["cuda:0", "cuda:1"], 3, "count=3: allowed: null or 2"),
        ("tpu:0", None, "'tpu:0' is not a device name"),
    ],
)
def test_malformed_specs_are_config_errors(spec, count, fragment):
    """Refused by the schema (no torch, no machine looked at): so a sweep refuses them before any point runs."""
    with pytest.raises(ConfigError) as err:
        DevicesConfig(spec=spec, count=count)
    assert not isinstance(err.value, MissingDevice)
    assert fragment in err.value.line()


def test_this_machine_is_read_as_it_is():
    r = resolve(DevicesConfig())
    if torch.cuda.is_available():
        assert r.names == [f"cuda:{i}" for i in range(torch.cuda.device_count())] and not r.fallback
    else:
        assert r.names == ["cpu"] and r.devices[0].threads == torch.get_num_threads() and r.fallback


def test_together_runs_each_cpu_worker_in_its_own_thread_with_its_share():
    devices = resolve(DevicesConfig(spec="cpu", count=2), Inventory(0, False, 2)).devices
    seen = {}
    barrier = threading.Barrier(2, timeout=10)  # both workers must be running at once

    def work(d):
        seen[d.name] = (threading.get_ident(), torch.get_num_threads())
        barrier.wait()

    before = torch.get_num_threads()
    with Together(devices) as together:
        together.run(work)
    assert set(seen) == {"cpu#0", "cpu#1"}
    assert len({ident for ident, _ in seen.values()}) == 2
    assert {threads for _, threads in seen.values()} == {1}
    assert torch.get_num_threads() == before


def test_cpu_workers_are_bounded_by_the_cpus_not_by_the_jobs_threads():
    """Under OMP_NUM_THREADS=1 (one intra-op thread) a 2-worker point still runs on a 2-CPU
    machine, a worker of one thread per CPU; it was refused ('this machine has 1 CPU cores')."""
    one = Inventory(cuda=0, mps=False, cpu_threads=1, cpus=2)
    devices = resolve(DevicesConfig(spec="cpu", count=2), one).devices
    assert [(d.name, d.threads) for d in devices] == [("cpu#0", 1), ("cpu#1", 1)]
    with pytest.raises(MissingDevice, match="devices.count=3: this process may use 2 CPUs"):
        resolve(DevicesConfig(spec="cpu", count=3), one)


def test_cpu_threads_restores_the_setting():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


# --- a job's intra-op threads: devices.threads, else OMP_NUM_THREADS, else the affinity mask ----


def test_the_threads_default_to_the_cpus_this_process_may_use_and_never_more():
    from perflab.measure.devices import intra_op_threads

    assert intra_op_threads(None, cpus=4, env={}) == 4, "the default: every CPU of the affinity mask"
    assert intra_op_threads(None, cpus=4, env={"OMP_NUM_THREADS": "1"}) == 1, "OMP_NUM_THREADS where set"
    assert intra_op_threads(None, cpus=4, env={"OMP_NUM_THREADS": "16"}) == 4, "never above the mask"
    assert intra_op_threads(None, cpus=4, env={"OMP_NUM_THREADS": "2,1"}) == 2, "OpenMP's list: its first level"
    assert intra_op_threads(None, cpus=4, env={"OMP_NUM_THREADS": "x"}) == 4
    assert intra_op_threads(3, cpus=4, env={"OMP_NUM_THREADS": "1"}) == 3, "the config's setting wins"
    with pytest.raises(MissingDevice) as refused:
        intra_op_threads(5, cpus=4, env={})
    assert (
        refused.value.line()
        == "devices.threads=5: this process may use 4 CPUs (its affinity mask); allowed: null or at most 4"
    )
    with pytest.raises(ConfigError, match="threads=0: allowed: null or an integer >= 1"):
        DevicesConfig(threads=0)


def test_the_affinity_mask_is_what_a_process_may_use():
    """``taskset`` to one CPU: one thread (this thread's mask, as a process started so would have)."""
    import os

    from perflab.measure.devices import intra_op_threads

    mask = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(mask)})
        assert intra_op_threads(None, env={}) == 1
    finally:
        os.sched_setaffinity(0, mask)


def test_a_job_runs_with_its_threads_says_them_in_its_rows_and_gives_the_callers_back(work):
    import perflab
    from perflab.errors import Refused

    before = torch.get_num_threads()
    df = perflab.run("quick/matmul", ["devices.threads=1", "bench.repeats=3", "bench.min_time_s=0"])
    timed = df[df["status"] == "ok"]
    assert len(timed) and set(timed["num_threads"]) == {1}
    assert torch.get_num_threads() == before, "the caller's threads again after the job"
    with pytest.raises(Refused, match=r"devices.threads=4096: .*; allowed: null or at most \d+"):
        perflab.run("quick/matmul", ["devices.threads=4096"])


@pytest.mark.parametrize("given", [None, "passive"])
def test_rows_record_the_openmp_wait_policy_as_the_user_set_it(given):
    """perflab leaves the policy alone (OpenMP's default spins, as the user's own code runs)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    code = "import perflab; from perflab.measure import environment as e; print(e.environment()['omp_wait_policy'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == (given or "")
