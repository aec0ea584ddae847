"""perflab's SLURM launcher for Hydra: ``perflab -m +launcher=slurm ...`` (conf/launcher/slurm.yaml).

Hydra's submitit launcher, made right for perflab: each point asks for its own resources,
failures become rows, Ctrl-C cancels, sbatch refusals are one line. The logic lives in
perflab/cluster/slurm.py; Hydra requires the class itself to live under ``hydra_plugins``.
"""

# No "from __future__ import annotations": Hydra runs this module before it is in sys.modules,
# where dataclasses cannot resolve string annotations.
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, cast

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, JobStatus
from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import OmegaConf, open_dict


@dataclass
class PerflabSlurmConf(SlurmQueueConf):
    """submitit's SLURM settings (partition, timeout_min, setup, additional_parameters ...),
    with resources computed per point: these three say how much per worker."""

    _target_: str = "hydra_plugins.perflab_slurm._launcher.PerflabSlurmLauncher"  # Hydra knows a plugin by its module
    cpus_per_worker: int = 1  # CPU cores per GPU or CPU worker (plus the point's data.workers each)
    mem_gb_per_worker: int = 4  # host memory per GPU or CPU worker
    signal_delay_s: int = 90  # SLURM's warning (SIGUSR2) before the time limit: at most a quarter of it


ConfigStore.instance().store(group="hydra/launcher", name="perflab_slurm", node=PerflabSlurmConf, provider="perflab")

PER_POINT = (
    "cpus_per_task",
    "gpus_per_node",
    "tasks_per_node",
    "mem_gb",
    "nodes",
    "cpus_per_worker",
    "mem_gb_per_worker",
    "submitit_folder",
    "max_num_timeout",
)


class PerflabSlurmLauncher(BaseSubmititLauncher):
    _EXECUTOR = "slurm"

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from perflab.cluster import slurm
        from perflab.config.session import CURRENT

        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        session = CURRENT.get()
        if session is not None:
            session.sweep_dir = sweep_dir
        p = self.params
        partition = p.get("partition")
        points, identities = [], {}
        for num, overrides in enumerate(job_overrides, start=initial_job_idx):
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = num
            need = slurm.resources(cfg, int(p["cpus_per_worker"]), int(p["mem_gb_per_worker"]), partition)
            point = slurm.Submission(num, list(overrides), need, sweep_dir / str(cfg.hydra.sweep.subdir))
            points.append(point)
            identities[num] = _identity(cfg, sweep_dir, num)
        limit_s = 60 * int(p["timeout_min"])
        base = {
            k if k in ("timeout_min", "name", "stderr_to_stdout") else f"slurm_{k}": v
            for k, v in p.items()
            if k not in PER_POINT
        }
        base["slurm_signal_delay_s"] = max(5, min(int(p["signal_delay_s"]), limit_s // 4))
        try:
            slurm.submit(self, points, base, folder=str(p["submitit_folder"]))
            slurm.wait(points)
        except KeyboardInterrupt:  # Ctrl-C: nothing of this sweep stays queued or running
            slurm.cancel(points)
            submitted = [point for point in points if point.job is not None]
            print(f"perflab: interrupted: cancelled the {len(submitted)} SLURM job(s) of this sweep", file=sys.stderr)
            slurm.wait(points, within_s=30)
            history = slurm.histories([point.job_id for point in points if point.job is not None])
            for point in points:
                point.job_dir.mkdir(parents=True, exist_ok=True)
                slurm.settle(point, identities[point.num], history.get(point.job_id, []))
            raise
        returns = []
        history = slurm.histories([point.job_id for point in points if point.job is not None])
        for point in points:
            point.job_dir.mkdir(parents=True, exist_ok=True)
            result = JobReturn(overrides=point.overrides, status=JobStatus.COMPLETED)
            result.return_value = slurm.settle(point, identities[point.num], history.get(point.job_id, []))
            returns.append(result)
        return returns


def _identity(cfg: Any, sweep_dir: Path, num: int) -> dict[str, Any]:
    """The columns a row written for this point by the launcher (the job could not) carries."""
    from perflab.config.composition import experiment_name
    from perflab.config.schema import config_hash
    from perflab.job.execute import new_run_id
    from perflab.store.rows import flatten

    job_cfg = cast(
        dict, OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    )
    return {
        "run_id": new_run_id(),
        "sweep_id": sweep_dir.name,
        "job_num": num,
        "experiment": experiment_name(cfg.hydra.runtime.choices.get("experiment"), cfg),
        "config_hash": config_hash(job_cfg),
        "rank": 0,
        **flatten(job_cfg),
    }
