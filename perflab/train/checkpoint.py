"""Checkpoints: bare weights (no ``module.`` prefix), optimizer, epoch and RNG state, saved
atomically and loaded with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from perflab.schema import config_hash
from perflab.train.models import strip_prefix

# Keys that do not change what is trained, so a resumed run finds the same checkpoint.
_VOLATILE = ("trainer.resume", "trainer.epochs", "trainer.checkpoint_every", "trainer.checkpoint_dir",
             "results", "bench", "data.workers", "data.pin_memory")


def config_key(cfg: Mapping[str, Any]) -> str:
    """The checkpoint folder's name: the config hash, minus the keys that may differ on resume."""
    return config_hash(cfg, ignore=_VOLATILE)


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, **extra: Any) -> None:
    """Write ``path`` via a temp file + rename: a kill mid-save leaves the previous checkpoint."""
    state = {
        "model": {strip_prefix(k): v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "epoch": epoch,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(path, map_location=map_location, weights_only=True)


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
