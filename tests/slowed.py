"""A user's small model whose GELU does more work where WHY_SLOWED=gelu (the attribution's test)."""

from __future__ import annotations

import os

import torch
from torch import nn


class Slowed(nn.Module):
    """Linear, GELU, Linear; ``WHY_SLOWED=gelu``: the GELU three times more (aten::gelu only)."""

    def __init__(self, num_classes: int = 10, width: int = 512) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, num_classes)
        self.extra = 3 if os.environ.get("WHY_SLOWED") == "gelu" else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        for _ in range(self.extra):
            nn.functional.gelu(h)
        return self.down(nn.functional.gelu(h))
