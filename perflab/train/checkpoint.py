"""Checkpoints: each run writes its own, never another run's.

``<trainer.checkpoint_dir>/<checkpoint key>/<run id>.pt`` holds bare weights (no ``module.``
prefix), the optimizer, the GradScaler, the epoch and the RNG state, written atomically;
``<run id>.json`` beside it says which epoch of how many, and whether that run finished.
The key is the config hash without what may change on resume (epochs, where files go), so
resuming finds every checkpoint of the same training, and picks the most advanced one.
Loading uses ``torch.load(weights_only=True)``: a checkpoint cannot run code.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from perflab.config.schema import config_hash
from perflab.errors import first_line
from perflab.models import strip_prefix
from perflab.store import files

log = logging.getLogger("perflab")

# Keys that do not change what is trained, so a resumed (or extended) run finds the same key.
NOT_TRAINING = ("trainer.epochs", "bench", "data.workers", "data.pin_memory", "devices.on_missing")


def key(cfg: Mapping[str, Any]) -> str:
    """The checkpoint folder's name: the config hash, minus the keys that may differ on resume."""
    return config_hash(cfg, ignore=NOT_TRAINING)


@dataclass
class Info:
    """``<run id>.json``: what a checkpoint holds, readable without loading it."""

    run_id: str
    config_hash: str  # the full config (with epochs): an interrupted run of *this* point?
    epoch: int
    epochs: int
    complete: bool


def save(folder: Path, info: Info, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any = None) -> Path:
    """Write ``<folder>/<run id>.pt`` (then its .json) atomically; a kill mid-save leaves the
    previous one whole."""
    state = {
        "model": {strip_prefix(k): v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else {},
        "epoch": info.epoch,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        },
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    path = folder / f"{info.run_id}.pt"
    files.write_atomic(path, buf.getvalue())
    files.write_atomic(folder / f"{info.run_id}.json", json.dumps(asdict(info)) + "\n")
    return path


def infos(folder: Path) -> list[tuple[Path, Info]]:
    found = []
    for meta in folder.glob("*.json"):
        try:
            info = Info(**json.loads(files.read_text(meta)))
        except (OSError, ValueError, TypeError):
            continue
        if meta.with_suffix(".pt").is_file():
            found.append((meta.with_suffix(".pt"), info))
    return found


def candidates(folder: Path, *, interrupted_of: str | None = None) -> list[tuple[Path, Info]]:
    """The checkpoints, most advanced first: the highest epoch, then the newest;
    ``interrupted_of=HASH``: only those of unfinished runs of exactly that config (what a sweep
    re-run resumes)."""
    found = [
        (p, i)
        for p, i in infos(folder)
        if interrupted_of is None or (i.config_hash == interrupted_of and not i.complete)
    ]
    return sorted(found, key=lambda pi: (pi[1].epoch, _mtime(pi[0])), reverse=True)


class Unusable(Exception):
    """A checkpoint that cannot be loaded: one line naming its file and what is wrong."""


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint's state, weights only (it cannot run code). A file that is empty, cut
    short, not a checkpoint, or holds anything but tensors and plain data (which torch refuses
    to unpickle) is :class:`Unusable`, named, in one line."""
    import pickle

    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch's own message advises weights_only=False, i.e. to run the file's code: never relayed
        if "Weights only load failed" in str(err):
            raise Unusable(
                f"checkpoint {path}: refused: it holds objects other than tensors and plain data "
                "(loading it could run code; perflab loads weights only)"
            ) from None
        raise Unusable(f"checkpoint {path}: damaged ({first_line(err)})") from None
    except (EOFError, RuntimeError, ValueError, OSError, KeyError, IndexError) as err:
        why = "empty" if path.is_file() and path.stat().st_size == 0 else f"{type(err).__name__}: {first_line(err)}"
        raise Unusable(f"checkpoint {path}: damaged ({why})") from None
    if not isinstance(state, dict) or not {"model", "optimizer", "epoch"} <= set(state):
        raise Unusable(f"checkpoint {path}: not a perflab checkpoint (no model, optimizer and epoch)")
    return state


def load_most_advanced(folder: Path, *, interrupted_of: str | None = None) -> tuple[Path, Info, dict[str, Any]] | None:
    """The most advanced checkpoint that loads (the first of :func:`candidates`), and its state. A
    damaged or refused one is passed over for the next, saying so in one line each."""
    found = candidates(folder, interrupted_of=interrupted_of)
    for n, (path, info) in enumerate(found, start=1):
        try:
            return path, info, load(path)
        except Unusable as err:
            log.warning("%s; %s", err, "trying the next most advanced" if n < len(found) else "starting afresh")
    return None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load bare or ``module.``-prefixed weights into a bare or wrapped (DP/DDP) model."""
    bare = {strip_prefix(k): v for k, v in state.items()}
    target = model.module if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)) else model
    target.load_state_dict(bare)


def restore_rng(state: Mapping[str, Any]) -> None:
    rng = state.get("rng", {})
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_suffix(".json").unlink(missing_ok=True)
