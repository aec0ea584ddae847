"""The chapter's models, built eagerly (known shapes) so any wrapper applies before batch one.

- ``lenet``: the LeNet variant of book 13.5 (3x3 conv to 20, avg-pool, 5x5 conv to 50,
  avg-pool, 800 -> 128 -> 10), as modules instead of a parameter list.
- ``resnet18``: the ResNet-18 variant of book 13.6 for 28x28 inputs (3x3 stride-1 stem, no
  max-pool, four stages of 64/128/256/512 with two residual blocks each).
- ``resnet18_tv``: torchvision's ``resnet18`` with a 1-channel stem and 10 classes (no weights).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from perflab.schema import INITS, MODELS  # noqa: F401 - the choice lists live in the schema


def lenet(num_classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(800, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


class Residual(nn.Module):
    """Two 3x3 convs with batch norm and a shortcut (1x1 conv when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.bn1, self.bn2 = nn.BatchNorm2d(out_channels), nn.BatchNorm2d(out_channels)
        self.shortcut = (
            nn.Conv2d(in_channels, out_channels, 1, stride=stride)
            if stride != 1 or in_channels != out_channels
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


def resnet18(num_classes: int = 10, in_channels: int = 1) -> nn.Module:
    def stage(cin: int, cout: int, first: bool) -> nn.Sequential:
        return nn.Sequential(Residual(cin, cout, stride=1 if first else 2), Residual(cout, cout))

    return nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        stage(64, 64, True),
        stage(64, 128, False),
        stage(128, 256, False),
        stage(256, 512, False),
        nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(512, num_classes),
    )


def resnet18_tv(num_classes: int = 10) -> nn.Module:
    import torchvision

    net = torchvision.models.resnet18(weights=None, num_classes=num_classes)
    net.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net


BUILDERS = {"lenet": lenet, "resnet18": resnet18, "resnet18_tv": resnet18_tv}


def build(name: str, init: str = "default", num_classes: int = 10) -> nn.Module:
    """A model on the CPU with its weights initialized (seed the RNG first for repeatability)."""
    net = BUILDERS[name](num_classes)
    if init != "default":
        net.apply(_book_normal if init == "book_normal" else _xavier)
    return net


def _book_normal(m: nn.Module) -> None:
    """The book's N(0, 0.01) weights and zero biases for conv and linear layers."""
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.normal_(m.weight, std=0.01)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def _xavier(m: nn.Module) -> None:
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.xavier_uniform_(m.weight)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def bare_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Weights without wrapper prefixes (``module.`` from DataParallel/DDP, ``_orig_mod.``)."""
    return {strip_prefix(k): v for k, v in model.state_dict().items()}


def strip_prefix(key: str) -> str:
    for prefix in ("module.", "_orig_mod."):
        while key.startswith(prefix):
            key = key[len(prefix) :]
    return key
