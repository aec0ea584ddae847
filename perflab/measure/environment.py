"""The environment columns every row carries, gathered once per job: versions, host, the
machine's identity (what it is, as the kernel describes it), and the code under test.

The **identity** is the subset of those columns that changes what a measurement gives:
``IDENTITY`` below (the CPU model, its cores, the threads a measurement used, frequency
governor and boost, torch and the libraries under it, the GPU model and CUDA versions).
``compare`` and ``history`` judge only rows whose identities agree and name the fields that
differ; the hostname, kernel, memory size and Python are recorded but do not split a series
(two CI runners of one kind are the same machine, whatever memory the VM reports). Fields a
machine cannot tell (no cpufreq in a VM) are left empty, never guessed.

Cost: about 1 ms once per process on a CPU (``python benchmarks/environment_cost.py``);
cuDNN's version is asked only where CUDA is available (loading cuDNN alone takes ~8 ms).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perflab import version
from perflab.store import files

# The columns that change what a measurement gives: rows that differ in one are not compared
# (INCOMPARABLE names it) unless the user says so (compare --allow-mixed). num_threads is each
# row's own (the threads its measurement ran with); the rest come from environment().
IDENTITY = (
    "cpu_model",
    "cpu_physical_cores",
    "cpu_logical_cores",
    "num_threads",
    "cpu_governor",
    "cpu_boost",
    "torch",
    "mkl",
    "onednn",
    "cuda",
    "cudnn",
    "cuda_driver",
    "gpu_model",
)
_CPU = Path("/sys/devices/system/cpu")


def identity_key(identity: dict[str, str]) -> str:
    """A short stable name for a machine identity (fields as text), for what is kept per machine:
    chapter's calibration, the floor of one-process verdicts (``perflab.analysis.floor``)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def _git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5, check=True).stdout.strip()


def commit_of(where: Path) -> tuple[str, str]:
    """(``<12-hex commit>`` with ``+dirty`` for local edits to tracked files, its commit time
    in ISO 8601) of the git checkout holding ``where``; ("", "") outside one."""
    try:
        sha, _, when = _git(["show", "-s", "--format=%h %cI", "--abbrev=12", "HEAD"], where).partition(" ")
        dirty = _git(["status", "--porcelain", "--untracked-files=no"], where)
    except (OSError, subprocess.SubprocessError):
        return "", ""
    return sha + ("+dirty" if dirty else ""), when


@functools.cache
def git_sha() -> str:
    """perflab's own commit (with ``+dirty``), or ``unknown`` outside a checkout of perflab."""
    root = Path(version.__file__).resolve().parent.parent
    if not (root / ".git").exists():  # an installed copy: site-packages is no checkout of ours
        return "unknown"
    return commit_of(root)[0] or "unknown"


def subject(tag: str | None) -> dict[str, str]:
    """What is being measured: ``tag`` as given, else the commit of the git repository in the
    current working directory (the user's code, not perflab's own checkout), else empty.
    ``subject_time`` (the commit's time) lets ``history`` order subjects when git cannot."""
    if tag:
        return {"subject": str(tag), "subject_time": ""}
    sha, when = commit_of(Path.cwd())
    return {"subject": sha, "subject_time": when}


SMALL_FILE = 2**20  # a model folder's files up to this size are digested by their bytes, larger ones by stat
DIGEST_DIGITS = 12


def model_contents(model: Any) -> dict[str, str]:
    """What a model's config names outside itself: for ``model.name`` a local folder (``model=hf
    model.name=FOLDER``), ``model_digest``, a digest of the folder's files, so that a folder
    rewritten with other weights or another config is a new point (as a new subject is), not
    "done"; {} for any other model (a hub id's snapshot, a factory's own weights).

    Its files up to 1 MiB (config.json, generation_config.json, a tokenizer's) count by their
    bytes, larger ones (the weights) by name, size and modification time: reading gigabytes of
    weights for every sweep point would cost more than the load it guards. So a copy that does
    not keep modification times (``cp`` without ``-p``) reads as changed: measured again, the
    safe side, and compare notes the difference."""
    import hashlib

    name = getattr(model, "name", None) if model is not None else None
    folder = Path(str(name)).expanduser() if name else None
    if folder is None or not folder.is_dir():
        return {}
    digest = hashlib.sha256()
    try:
        for inside, path in _model_files(folder):
            stat = path.stat()
            digest.update(f"{inside}\0{stat.st_size}\0".encode())
            if stat.st_size <= SMALL_FILE:
                digest.update(path.read_bytes())
            else:
                digest.update(str(stat.st_mtime_ns).encode())
    except OSError:
        return {}  # unreadable: the model's own build says why, in one line
    return {"model_digest": digest.hexdigest()[:DIGEST_DIGITS]}


def _model_files(folder: Path) -> list[tuple[str, Path]]:
    """A model folder's files (their path inside it, sorted), hidden ones and hidden folders
    (.git/, a tool's cache) left out without walking into them."""
    found = []
    for where, dirs, names in os.walk(folder, onerror=_raise):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(where, n) for n in names if not n.startswith(".")]
    return sorted((p.relative_to(folder).as_posix(), p) for p in found if p.is_file())


def _raise(err: OSError) -> None:
    raise err


def _read(path: Path) -> str:
    try:
        return files.read_text(path).strip()
    except OSError:
        return ""


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else the platform's word."""
    text = _read(Path("/proc/cpuinfo"))
    found = re.search(r"^(?:model name|Model|cpu model|Processor)\s*:\s*(.+)$", text, flags=re.M)
    return found.group(1).strip() if found else (platform.processor() or platform.machine())


def boost() -> str:
    """``on`` / ``off`` where the kernel tells (cpufreq/boost, intel_pstate/no_turbo), else empty."""
    value = _read(_CPU / "cpufreq" / "boost")
    if value in ("0", "1"):
        return "on" if value == "1" else "off"
    value = _read(_CPU / "intel_pstate" / "no_turbo")
    return {"0": "on", "1": "off"}.get(value, "")


def _libraries(torch: Any) -> dict[str, str]:
    """MKL and oneDNN versions as torch was built with them (its own build summary)."""
    info = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\d.]+)", info)
    dnn = re.search(r"(?:MKL-DNN|oneDNN) v([\d.]+)", info)
    return {"mkl": mkl.group(1) if mkl else "", "onednn": dnn.group(1) if dnn else ""}


def _gpu(torch: Any) -> dict[str, Any]:
    """cuDNN, the CUDA driver and the GPU model, where CUDA is available (empty otherwise)."""
    if not torch.cuda.is_available():
        return {}
    out: dict[str, Any] = {"cudnn": str(torch.backends.cudnn.version() or ""), "gpu_model": ""}
    with contextlib.suppress(Exception):
        out["gpu_model"] = " + ".join(
            dict.fromkeys(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        )
    with contextlib.suppress(Exception):  # nvidia-ml-py (perflab[gpu]): the driver's own version
        import pynvml

        pynvml.nvmlInit()
        out["cuda_driver"] = str(pynvml.nvmlSystemGetDriverVersion())
    return out


@functools.cache
def _static() -> dict[str, object]:
    import psutil
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "",
        "cuda_available": torch.cuda.is_available(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_physical_cores": psutil.cpu_count(logical=False) or "",
        "cpu_logical_cores": psutil.cpu_count() or "",
        "cpu_governor": _read(_CPU / "cpu0" / "cpufreq" / "scaling_governor"),
        "cpu_boost": boost(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),  # empty: OpenMP's own (threads spin a while)
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        **_libraries(torch),
        **_gpu(torch),
        "hostname": socket.gethostname(),
        "git_sha": git_sha(),
        "perflab_version": version.__version__,
    }


SLURM = {
    "slurm_job_id": "SLURM_JOB_ID",
    "slurm_array_task_id": "SLURM_ARRAY_TASK_ID",
    "slurm_node": "SLURMD_NODENAME",  # where the row was written (rank 0's node) ...
    "slurm_nodes": "SLURM_JOB_NODELIST",  # ... and every node of the job (a multi-node run: several)
}


def environment() -> dict[str, object]:
    """Versions, host, machine identity, time and (under SLURM) where the job ran; device
    names and thread counts are per row."""
    where = {col: os.environ[var] for col, var in SLURM.items() if os.environ.get(var)}
    if where and os.environ.get("SUBMITIT_EXECUTOR"):  # a job of perflab's SLURM launcher: its log file
        with contextlib.suppress(Exception):
            import submitit

            where["log"] = str(submitit.JobEnvironment().paths.stderr)
    return {**_static(), **where, "timestamp": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
