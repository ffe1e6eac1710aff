"""PyTorch versions of the benchmarked layers and reference workloads (the peer).

Only imported when torch is installed. A locally connected layer is `F.unfold` + `einsum`
with weights W (L, K, F) (L output locations, K = C*KH*KW patch values, F filters) and a bias
(F, OH, OW), as design.md prescribes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Local2d(nn.Module):
    """Locally connected layer (no padding): a conv2d with different weights at every location."""

    def __init__(self, channels: int, size: int, filters: int, kernel: int,
                 stride: int) -> None:
        super().__init__()
        self.kernel, self.stride, self.filters = kernel, stride, filters
        self.out = (size - kernel) // stride + 1
        k, locations = channels * kernel * kernel, self.out * self.out
        limit = math.sqrt(6.0 / (k + filters))
        self.W = nn.Parameter(torch.empty(locations, k, filters).uniform_(-limit, limit))
        self.b = nn.Parameter(torch.zeros(filters, self.out, self.out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = F.unfold(x, self.kernel, stride=self.stride)  # (N, K, L)
        y = torch.einsum("nkl,lkf->nfl", cols, self.W)
        return y.reshape(x.shape[0], self.filters, self.out, self.out) + self.b


def lc_large() -> nn.Module:
    """3x64x64 -> local2d 32 7x7/2 -> relu -> local2d 64 5x5/2 -> relu -> dense 10."""
    return nn.Sequential(
        Local2d(3, 64, 32, 7, 2), nn.ReLU(),
        Local2d(32, 29, 64, 5, 2), nn.ReLU(),
        nn.Flatten(), nn.Linear(64 * 13 * 13, 10),
    )


def speech_mlp() -> nn.Module:
    """440 -> 4 x (dense 2560, sigmoid) -> dense 8192 (softmax in the loss)."""
    layers: list[nn.Module] = []
    width = 440
    for _ in range(4):
        layers += [nn.Linear(width, 2560), nn.Sigmoid()]
        width = 2560
    layers.append(nn.Linear(width, 8192))
    return nn.Sequential(*layers)


MODELS = {"lc-large": lc_large, "speech-mlp": speech_mlp}


def layer(kind: str, shape: tuple[int, ...], out: int, kernel: int, stride: int,
          padding: int) -> nn.Module:
    """The torch layer a kernel benchmark row compares against."""
    if kind == "dense":
        return nn.Linear(shape[1], out)
    if kind == "conv2d":
        return nn.Conv2d(shape[1], out, kernel, stride=stride, padding=padding)
    if kind == "local2d":
        if padding:
            raise ValueError("the torch Local2d peer has no padding")
        return Local2d(shape[1], shape[2], out, kernel, stride)
    raise ValueError(f"unknown layer kind '{kind}'")


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               opt: torch.optim.Optimizer) -> float:
    """zero_grad, forward, cross entropy, backward, SGD step; returns the loss."""
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()
