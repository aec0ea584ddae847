"""Sweeps on SLURM (``perflab -m +launcher=slurm ...``), on Hydra's submitit launcher.

What perflab adds to it (hydra_plugins/perflab_slurm holds the Hydra-facing class):

- **Resources per point.** Hydra builds a launcher once for the whole sweep; perflab composes
  every point's config and asks SLURM for what *that* point needs: GPUs = its CUDA devices,
  CPUs = its CPU workers or GPUs times ``cpus_per_worker`` (plus its DataLoader workers),
  nodes = ``strategy.nnodes``, memory = ``mem_gb_per_worker`` per worker. Points of the same
  shape go to SLURM as one job array; different shapes, separate arrays.
- **Failures are rows, and the sweep always ends.** A job that SLURM cancelled, timed out,
  killed for memory or lost with its node leaves an ``error``/``cancelled``/``timeout``/``oom``
  row naming its log file; the sweep prints its summary and writes sweep.csv. Ctrl-C cancels
  every job it submitted, and says so. A job that SLURM preempts or loses with its node and
  requeues is waited for: it runs again and resumes the point.
- **Mistakes are one line:** sbatch refusing a submission (no such partition, GPUs a node
  does not have) is one line and exit code 2, before the sweep starts.
- **Time limits leave room:** SLURM's warning signal comes ``signal_delay_s`` before the limit
  (at most a quarter of it), so a short limit does not stop every job at once.

Inside a job, perflab.stop turns scancel's SIGTERM and the warning signal into a
``cancelled`` / ``timeout`` row at once; the next identical sweep re-runs (resumes) the point.
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
class Point:
    num: int
    overrides: list[str]
    need: Resources
    job_dir: Path
    job: Any = None
    never: str = ""  # why it was not run: bigger than any node, or SLURM would never start it

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


def submit(launcher: Any, points: list[Point], base: dict[str, Any], folder: str) -> None:
    """One job array per resource shape. A refused submission cancels what went before and is
    one line (ConfigError: exit code 2)."""
    import submitit
    from hydra.core.singleton import Singleton

    shapes: dict[Resources, list[Point]] = {}
    node = largest_node(base.get("slurm_partition"))
    for p in points:
        if node is not None and not node.fits(p.need):
            p.never = f"needs {p.need} per node; the partition's largest node has {node}"
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
        log.info(
            "submitted %d point%s asking for %s each: job %s",
            len(group),
            "s" if len(group) > 1 else "",
            need,
            jobs[0].job_id.split("_")[0],
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
NEVER = (
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "QOSMax",
    "AssocMax",
    "MaxCpuPerAccount",
    "InvalidAccount",
    "InvalidQOS",
    "BadConstraints",
)


# Held jobs that nobody is going to release for a sweep: a requeued job whose launch failed,
# an administrator's hold, a special exit. (A user's own `scontrol hold` is waited out.)
HELD_STATES = ("RH", "SE")
HELD_REASONS = ("launch failed requeued held", "JobHeldAdmin")
BLIND_S = 300.0


def wait(points: list[Point], within_s: float | None = None) -> bool:
    """Until every job has ended (or ``within_s`` passed: False). A job has ended when SLURM no
    longer holds it: a preempted or node-failed job that SLURM requeued runs again, though its
    first run already left a result. A job that SLURM will never start, or holds for good, is
    cancelled, and its point gets the reason. While squeue cannot answer, every job waits (for
    BLIND_S at most). submitit's own word is not asked: it takes PREEMPTED for "will run again"."""
    pending = [p for p in points if p.job is not None]
    blind_since: float | None = None
    deadline = time.monotonic() + within_s if within_s is not None else math.inf
    while pending:
        queued = in_queue([p.job_id for p in pending])
        blind_since = None if queued is not None else blind_since or time.monotonic()
        if blind_since is not None and time.monotonic() - blind_since > BLIND_S:
            log.warning("squeue has not answered for %.0f s: the sweep ends with what sacct says", BLIND_S)
            return True
        if queued is not None:  # SLURM holds a job until it has ended for good
            pending = [p for p in pending if p.job_id in queued]
        for p in pending:
            state, reason = (queued or {}).get(p.job_id, ("", ""))
            never = state == "PD" and reason.startswith(NEVER)
            if never or state in HELD_STATES or reason.startswith(HELD_REASONS):
                held = "will never start" if never else "holds"
                p.never = f"SLURM {held} it here ({reason or state}): it asks for {p.need}"
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


def cancel(points: Sequence[Point]) -> None:
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


def outcome(point: Point, state: str) -> tuple[str, str]:
    """(status, words) of a job that did not come back with a result, or that SLURM ended for
    a reason the job could not see ("" if neither). ``state``: the final state of its last run."""
    if point.never:
        return "skipped", point.never
    if state in SLURM_KNOWS_BETTER:
        return STATES[state]
    detail = "it left no result"
    if point.job.done():  # else result() would wait for ever
        try:
            point.job.result()
            return "", ""
        except Exception as err:
            detail = str(err).splitlines()[0][:200]
    state = state if state in STATES else state or str(point.job.state).split()[0].upper()
    return STATES.get(state, ("error", f"the job ended {state}: {detail}"))


def histories(job_ids: Sequence[str]) -> dict[str, list[list[str]]]:
    """Per job id: the states of each run of the job, oldest first, each run its own state
    then its steps' (a job may say FAILED where a step says OUT_OF_MEMORY); more than one run
    where SLURM requeued it. One sacct call for all jobs, repeated for up to SETTLE_S while
    some job's last run is not yet final there; {} for a job sacct cannot tell of."""
    deadline = time.monotonic() + SETTLE_S
    found: dict[str, list[list[str]]] = {}
    while job_ids:
        out = query(["sacct", "-D", "-n", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
        found = {}
        for line in (out or "").splitlines():
            step, _, state = line.partition("|")
            if not state.strip():
                continue
            job_id, dot, _ = step.partition(".")
            state = state.split()[0].rstrip("+").upper()
            if not dot:
                found.setdefault(job_id, []).append([state])
            elif found.get(job_id):
                found[job_id][-1].append(state)
        settled = all(final_state(found[j][-1]) for j in job_ids if found.get(j))
        if out is None or settled or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return found


def settle(point: Point, identity: dict[str, Any], history: Sequence[Sequence[str]] = ()) -> str:
    """Make sure the point's job dir says what came of it; returns its outcome. ``history``:
    the states of each run of its job (``histories``)."""
    from perflab.rundir import RunRecord, RunWriter

    record = RunRecord.read(point.job_dir)
    state = final_state(history[-1]) if history else ""
    status, words = outcome(point, state)
    log_file = str(point.job.paths.stderr) if point.job is not None else ""
    if len(history) > 1:
        ended = "; ".join(STATES.get(final_state(run), ("", run[0].lower()))[1] for run in history[:-1])
        print(f"perflab: point {point.label}: SLURM requeued it ({ended}) and ran it again", file=sys.stderr)
    if not status:
        return record.outcome if record else "error"
    # The job's own row stands (say, its own timeout), unless it only saw the SIGTERM of what
    # SLURM knows better, or never wrote its end.
    job_spoke = record is not None and record.outcome != "running"
    if record is not None and job_spoke and (record.outcome != "cancelled" or state not in SLURM_KNOWS_BETTER):
        return record.outcome
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
