"""A user's own models, as perflab trains and compiles them by ``model._target_``:

    perflab +experiment=train model._target_=userpkg.models.SmallCNN +model.width=16 data.shape=[3,16,16]
    perflab +experiment=train model._target_=userpkg.models.TinyTransformer data=tokens

Plain PyTorch: nothing here imports perflab. What the data decides comes in by name
(``num_classes``, ``in_channels``, ``vocab_size``, ``seq_len``); the rest are the model's own
arguments, set beside the target (``+model.width=16``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import functional as F


class SmallCNN(nn.Module):
    """Two 3x3 conv blocks (batch norm, ReLU, 2x2 max-pool), global average pooling, a linear
    head: images of any size and channel count to ``num_classes`` scores."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each with a residual."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.step(x)[0]

    def step(
        self, x: torch.Tensor, cache: Optional[Tuple[torch.Tensor, torch.Tensor]] = None
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:  # typing's names: TorchScript reads them
        """The block on new tokens ``x``, after the keys and values of the earlier ones (``cache``,
        None for a prompt): its output and the keys and values so far, the KV cache."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)  # one new token sees them all
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x)), (k, v)


class TinyTransformer(nn.Module):
    """A small causal (GPT-style) language model: token ids ``(B, T)`` to next-token logits
    ``(B, T, vocab_size)``, with learned positions for up to ``seq_len`` tokens."""

    def __init__(self, vocab_size: int, seq_len: int, d_model: int = 64, n_heads: int = 4, n_layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab_size, d_model)
        self.positions = nn.Embedding(seq_len, d_model)
        self.blocks = nn.Sequential(*(Block(d_model, n_heads) for _ in range(n_layers)))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        return self.head(self.norm(self.blocks(x)))

    def decode(self, ids: torch.Tensor, cache: list | None = None) -> tuple[torch.Tensor, list]:
        """perflab's generation protocol: logits ``(B, T, vocab_size)`` for the new tokens
        ``ids`` (the prompt when ``cache`` is None, then one token at a time) and the KV cache
        to pass with the next ones."""
        start = 0 if cache is None else cache[0][0].shape[2]
        x = self.tokens(ids) + self.positions(torch.arange(start, start + ids.shape[1], device=ids.device))
        kept = []
        for i, block in enumerate(self.blocks):
            x, kv = block.step(x, None if cache is None else cache[i])
            kept.append(kv)
        return self.head(self.norm(x)), kept
