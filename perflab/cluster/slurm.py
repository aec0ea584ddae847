"""Sweeps on SLURM (``perflab -m +launcher=slurm ...``), on Hydra's submitit launcher.

What perflab adds to it (resources per point, failures as rows and a sweep that always ends,
sbatch's refusals as one line, room before a time limit): docs/cluster.md; the Hydra-facing
class is in hydra_plugins/perflab_slurm.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from perflab.errors import ConfigError

log = logging.getLogger("perflab")
POLL_S = 2.0

# SLURM's final job states -> the row's status and words.
STATES = {  # in order of precedence: a job may say FAILED where one of its steps says OUT_OF_MEMORY
    "OUT_OF_MEMORY": (
        "oom",
        "killed by SLURM for using more memory than it asked for (hydra.launcher.mem_gb_per_worker)",
    ),
    "TIMEOUT": ("timeout", "stopped by SLURM at its time limit (hydra.launcher.timeout_min)"),
    "NODE_FAIL": ("error", "its node failed"),
    "BOOT_FAIL": ("error", "its node failed to boot"),
    "PREEMPTED": ("cancelled", "preempted by a higher-priority job"),
    "CANCELLED": ("cancelled", "cancelled by SLURM (scancel, or an administrator)"),
    "DEADLINE": ("timeout", "stopped at its deadline"),
    "FAILED": ("error", "the job failed before perflab could write its row"),
}


def first_node(nodelist: str) -> str:
    """The first host of a SLURM hostlist: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    first = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not first:
        return ""
    prefix, ranges = first.group(1), first.group(2)
    if not ranges:
        return prefix
    return prefix + re.split(r"[-,]", ranges)[0]


def helper_task() -> bool:
    """In a multi-task SLURM job (several nodes), every task but the first only runs workers:
    the first records the point."""
    return int(os.environ.get("SLURM_PROCID", "0") or 0) > 0 and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1


@dataclass(frozen=True)
class Resources:
    nodes: int
    gpus_per_node: int
    cpus_per_task: int
    mem_gb: int

    def params(self) -> dict[str, Any]:
        """submitit's names for them (one task per node: the job starts its own workers)."""
        return {
            "nodes": self.nodes,
            "tasks_per_node": 1,
            "gpus_per_node": self.gpus_per_node or None,
            "cpus_per_task": self.cpus_per_task,
            "mem_gb": self.mem_gb,
        }

    def __str__(self) -> str:
        gpus = f"{self.gpus_per_node} GPU{'s' if self.gpus_per_node != 1 else ''}, " if self.gpus_per_node else ""
        nodes = f"{self.nodes} nodes x " if self.nodes > 1 else ""
        return f"{nodes}{gpus}{self.cpus_per_task} CPU{'s' if self.cpus_per_task != 1 else ''}, {self.mem_gb} GB"


@dataclass(frozen=True)
class Node:
    """The largest a node of a partition offers: what one point can ask for at most."""

    cpus: int
    mem_gb: float
    gpus: int
    nodes: int  # how many nodes the partition has

    def fits(self, need: "Resources") -> bool:
        return (
            need.cpus_per_task <= self.cpus
            and need.mem_gb <= self.mem_gb
            and need.gpus_per_node <= self.gpus
            and need.nodes <= self.nodes
        )

    def __str__(self) -> str:
        return (
            f"{self.cpus} CPUs, {self.mem_gb:.0f} GB, {self.gpus} GPUs (of {self.nodes} node{'s' * (self.nodes > 1)})"
        )


@functools.cache
def largest_node(partition: str | None) -> Node | None:
    """From ``sinfo``: the most CPUs, memory and GPUs one node of the partition (default: the
    default partition) has; None if sinfo cannot say."""
    out = query(["sinfo", "-h", "-N", "-o", "%c|%m|%G|%P"])
    nodes = []
    for line in (out or "").splitlines():
        cpus, mem, gres, name = line.split("|")
        if (partition is None and name.endswith("*")) or name.rstrip("*") == partition:
            gpus = sum(int(m) for m in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", gres))
            nodes.append(Node(int(cpus.rstrip("+")), int(mem.rstrip("+")) / 1024, gpus, 1))
    if not nodes:
        return None
    return Node(max(n.cpus for n in nodes), max(n.mem_gb for n in nodes), max(n.gpus for n in nodes), len(nodes))


def partition_has_gpus(partition: str | None) -> bool:
    node = largest_node(partition)
    return node is not None and node.gpus > 0


def resources(cfg: Any, cpus_per_worker: int, mem_gb_per_worker: int, partition: str | None) -> Resources:
    """What one sweep point needs, from its composed config."""
    spec, count = cfg.devices.spec, cfg.devices.count
    names = [str(s) for s in spec] if not isinstance(spec, str) else None
    if names is not None:
        gpus = sum(1 for n in names if n.startswith("cuda"))
        cpu_workers = sum(1 for n in names if n.startswith("cpu"))
    elif spec == "cuda" or (spec == "auto" and partition_has_gpus(partition)):
        gpus, cpu_workers = count or 1, 0
    else:
        gpus, cpu_workers = 0, (count or 1) if spec in ("cpu", "auto") else 0
    nnodes = int(cfg.strategy.nnodes) if cfg.get("strategy") is not None and cfg.strategy.name == "ddp" else 1
    workers = max(1, gpus + cpu_workers)
    loaders = int(cfg.data.workers) if cfg.get("data") is not None else 0
    return Resources(
        nodes=nnodes,
        gpus_per_node=gpus,
        cpus_per_task=workers * (cpus_per_worker + loaders),
        mem_gb=workers * mem_gb_per_worker,
    )


@dataclass
class Submission:
    """One sweep point submitted to SLURM: its overrides, the resources it asks for, its job."""

    num: int
    overrides: list[str]
    need: Resources
    job_dir: Path
    job: Any = None
    verdict: tuple[str, str] | None = None  # (status, why) of a point the sweep ended itself

    @property
    def job_id(self) -> str:
        return str(self.job.job_id) if self.job is not None else ""

    @property
    def label(self) -> str:
        shown = [o for o in self.overrides if not o.lstrip("+").startswith(("experiment=", "launcher="))]
        return f"#{self.num} ({' '.join(shown) or 'defaults'})"


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Keep what sbatch prints on stderr (submitit lets it through) off the terminal: a
    refusal is turned into one line of ours instead."""
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def submit(launcher: Any, points: list[Submission], base: dict[str, Any], folder: str) -> None:
    """One job array per resource shape. A refused submission cancels what went before and is
    one line (ConfigError: exit code 2)."""
    import submitit
    from hydra.core.singleton import Singleton

    extra = base.get("slurm_additional_parameters") or {}
    for key in ("clusters", "M"):
        if key in extra:  # squeue and sacct would look on the default cluster, where the jobs are not
            raise ConfigError(
                f"hydra.launcher.additional_parameters.{key}",
                extra[key],
                "no other cluster: run the sweep on that cluster's own login node",
                problem="perflab follows its jobs on the default cluster",
            )
    shapes: dict[Resources, list[Submission]] = {}
    node = largest_node(base.get("slurm_partition"))
    for p in points:
        if node is not None and not node.fits(p.need):
            p.verdict = ("skipped", f"needs {p.need} per node; the partition's largest node has {node}")
            continue
        shapes.setdefault(p.need, []).append(p)
    for need, group in shapes.items():
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_max_num_timeout=0)
        executor.update_parameters(**base, **need.params())
        args = [(p.overrides, "hydra.sweep.dir", p.num, f"job_id_for_{p.num}", Singleton.get_state()) for p in group]
        try:
            with quiet_stderr():
                jobs = executor.map_array(launcher, *zip(*args))
        except Exception as err:  # submitit's FailedJobError carries sbatch's own words
            cancel([p for p in points if p.job is not None])
            raise refusal(err, base) from None
        for p, job in zip(group, jobs):
            p.job = job
        print(  # the sweep's own line, as the others here (Hydra's launcher logging is quiet)
            f"perflab: submitted {len(group)} point{'s' if len(group) > 1 else ''} asking for {need} each: "
            f"job {jobs[0].job_id.split('_')[0]}",
            file=sys.stderr,
        )


def refusal(err: Exception, base: dict[str, Any]) -> ConfigError:
    """sbatch's refusal as one line, naming the launcher key it is about."""
    words = [line.removeprefix("sbatch: error:").strip() for line in str(err).splitlines() if line.strip()]
    problem = words[-1] if words else type(err).__name__
    if "partition" in problem.lower():
        return ConfigError(
            "hydra.launcher.partition",
            base.get("slurm_partition"),
            "a partition `sinfo` lists",
            problem=f"sbatch: {problem}",
        )
    return ConfigError(
        "hydra.launcher",
        "(this sweep's requests)",
        "what the partition's nodes have (see `sinfo -N -o '%N %c %m %G'`)",
        problem=f"sbatch: {problem}",
    )


# Why a job pends that SLURM will never start: say so and cancel it rather than wait forever.
# (A per-job QOS or association limit never clears; a per-user or per-account one does.)
NEVER = (
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "BadConstraints",
)


def never_starts(reason: str) -> bool:
    return reason.startswith(NEVER) or (reason.startswith(("QOSMax", "AssocMax")) and "PerJob" in reason)


# Held jobs that nobody is going to release: a requeued job whose launch failed, a special
# exit. (A user's own `scontrol hold` and an administrator's are waited out.)
HELD = ("RH", "SE")
HELD_REASONS = ("launch failed requeued held",)
BLIND_S = 300.0  # how long squeue may fail to answer before the sweep gives up its jobs


def wait(points: list[Submission], within_s: float | None = None) -> bool:
    """Until every job has ended (or ``within_s`` passed: False). A job has ended when SLURM no
    longer holds it: a preempted or node-failed job that SLURM requeued runs again, though its
    first run already left a result (submitit's own word is not asked: it takes PREEMPTED for
    "runs again" even where SLURM will not requeue). A job SLURM will never start or holds for
    good, or all of them once squeue has not answered for BLIND_S, is cancelled, and its point
    gets the reason."""
    pending = [p for p in points if p.job is not None]
    blind_since: float | None = None
    deadline = time.monotonic() + within_s if within_s is not None else math.inf
    while pending:
        queued = in_queue([p.job_id for p in pending])
        if queued is None:
            blind_since = blind_since or time.monotonic()
            if time.monotonic() - blind_since > BLIND_S:
                for p in pending:
                    p.verdict = ("error", f"squeue did not answer for {BLIND_S:.0f} s: the sweep cancelled it")
                cancel(pending)
                return True
        else:
            blind_since = None
            pending = [p for p in pending if p.job_id in queued]  # SLURM holds a job until it has ended
        for p in pending:
            state, reason = (queued or {}).get(p.job_id, ("", ""))
            if state == "PD" and never_starts(reason):
                p.verdict = ("skipped", f"SLURM will never start it here ({reason}): it asks for {p.need}")
            elif state in HELD or reason.startswith(HELD_REASONS):
                p.verdict = ("error", f"SLURM held it ({reason or state}); the sweep cancelled it")
            else:
                continue
            p.job.cancel(check=False)
        if pending:
            if time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
    return True


def query(args: list[str]) -> str | None:
    """What a SLURM command printed (the user's SQUEUE_*/SACCT_*/SINFO_* format settings left
    out); None if it could not run or failed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQUEUE_", "SACCT_", "SINFO_"))}
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return "" if "Invalid job id" in done.stderr else None  # squeue: none of the ids is held
    return done.stdout


def in_queue(job_ids: Sequence[str]) -> dict[str, tuple[str, str]] | None:
    """(state, reason) of each of these jobs that SLURM still holds (pending, running,
    completing, requeued): one squeue call for all of them; None if squeue cannot say."""
    if not job_ids:
        return {}
    out = query(["squeue", "-h", "-r", "-j", ",".join(map(str, job_ids)), "-o", "%i %t %r"])
    if out is None:
        return None
    held = {}
    for line in out.splitlines():
        job_id, state, reason = (line.split(" ", 2) + ["", ""])[:3]
        held[job_id] = (state, reason)
    return held


def cancel(points: Sequence[Submission]) -> None:
    for p in points:
        if p.job is not None:
            with contextlib.suppress(Exception):
                p.job.cancel(check=False)


# States where SLURM ended the job for a reason the job could not see: the SIGTERM that came
# with it made the job write its own `cancelled` row, but SLURM's account is the telling one.
SLURM_KNOWS_BETTER = ("NODE_FAIL", "BOOT_FAIL", "PREEMPTED")
FINAL = (*STATES, "COMPLETED")
SETTLE_S = 10.0  # how long sacct may lag behind squeue before its word is taken as it stands


def final_state(run: Sequence[str]) -> str:
    """The telling state of one run of a job (its own and its steps'), "" if none is final."""
    return next((s for s in FINAL if s in run), "")


def verdict(point: Submission, state: str, spoke: str) -> tuple[str, str] | None:
    """(status, why) for the row the sweep writes for a point, or None where the job's own
    record stands. ``state``: the final state of its last run; ``spoke``: the outcome the job
    recorded itself ("" if it never did: killed, or it ended without a word)."""
    if point.verdict is not None:
        return point.verdict
    if state in SLURM_KNOWS_BETTER and spoke in ("", "cancelled"):
        return STATES[state]  # its own `cancelled` row saw only the SIGTERM of it
    if spoke:
        return None
    if state in STATES:
        return STATES[state]
    if state == "COMPLETED":
        return "error", "the job ended without writing its result"
    # sacct cannot say: ask submitit (a job that is not done would have result() wait for ever)
    if not point.job.done():
        return "error", f"the job had not ended when the sweep did ({point.job.state})"
    try:
        point.job.result()
    except Exception as err:
        return "error", f"the job failed: {str(err).splitlines()[0][:200]}"
    return "error", "the job ended without writing its result"


def histories(job_ids: Sequence[str]) -> dict[str, list[list[str]]]:
    """Per job id: the states of each run of the job, oldest first, each run its own state
    then its steps' (a job may say FAILED where a step says OUT_OF_MEMORY); more than one run
    where SLURM requeued it. One sacct call for all jobs, repeated for up to SETTLE_S while
    sacct (slurmdbd lags behind the controller) lacks a job or its last run is not final;
    a job sacct cannot tell of is left out."""
    deadline = time.monotonic() + SETTLE_S
    found: dict[str, list[list[str]]] = {}
    while job_ids:
        out = query(["sacct", "-D", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
        if out is not None:
            found = parse_sacct(out)
        settled = all(found.get(j) and final_state(found[j][-1]) for j in job_ids)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return found


def parse_sacct(out: str) -> dict[str, list[list[str]]]:
    """``sacct -D -n -P -o JobID,State`` -> {job id: [[job state, step states...] per run]}.
    Array tasks that never started come as one line for a range (``9_[2-5%2]``): each gets it."""
    found: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        step, _, state = line.partition("|")
        if not state.strip():
            continue
        job_id, dot, _ = step.partition(".")
        state = state.split()[0].rstrip("+").upper()
        for one in array_tasks(job_id):
            if not dot:
                found.setdefault(one, []).append([state])
            elif found.get(one):
                found[one][-1].append(state)
    return found


def array_tasks(job_id: str) -> list[str]:
    """``9_[2-4,7%2]`` -> 9_2, 9_3, 9_4, 9_7; any other id as it is."""
    ranged = re.fullmatch(r"(\d+)_\[([\d,-]+)(?:%\d+)?\]", job_id)
    if not ranged:
        return [job_id]
    tasks = []
    for part in ranged.group(2).split(","):
        first, _, last = part.partition("-")
        tasks += [f"{ranged.group(1)}_{i}" for i in range(int(first), int(last or first) + 1)]
    return tasks


def settle(point: Submission, identity: dict[str, Any], history: Sequence[Sequence[str]] = ()) -> str:
    """Make sure the point's job dir says what came of it; returns its outcome. ``history``:
    the states of each run of its job (``histories``)."""
    from perflab.store.rundir import RunRecord, RunWriter

    record = RunRecord.read(point.job_dir)
    spoke = record.outcome if record is not None and record.outcome != "running" else ""
    state = final_state(history[-1]) if history else ""
    log_file = str(point.job.paths.stderr) if point.job is not None else ""
    if len(history) > 1:
        ended = "; ".join(STATES.get(final_state(run), ("", run[0].lower()))[1] for run in history[:-1])
        print(f"perflab: point {point.label}: SLURM requeued it ({ended}) and ran it again", file=sys.stderr)
    said = verdict(point, state, spoke)
    if said is None:
        return spoke
    status, words = said
    error = f"{words} (log: {log_file})" if log_file else words
    if not (point.job_dir / ".hydra" / "overrides.yaml").is_file():  # a point never submitted: say what it was
        from omegaconf import OmegaConf

        (point.job_dir / ".hydra").mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(point.overrides), point.job_dir / ".hydra" / "overrides.yaml")
    writer = RunWriter(point.job_dir, samples=False)
    writer.add({**identity, "measurement": "job", "status": status, "error": error, "log": log_file})
    new = record or RunRecord(
        run_id=identity["run_id"], experiment=identity["experiment"], config_hash=identity.get("config_hash", "")
    )
    new.outcome, new.error, new.rows, new.complete = status, error, len(writer.rows), False
    if point.job is not None:
        new.where = {**new.where, "log": log_file, "slurm_job_id": point.job_id}
    new.save(point.job_dir)
    print(
        f"perflab: point {point.label}: {status}: {words}" + (f" -- log: {log_file}" if log_file else ""),
        file=sys.stderr,
    )
    return status
