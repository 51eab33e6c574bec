"""Small PyTorch ODE-nets for the interop tests (built only when torch is installed)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class ODENet(nn.Module):
    """opening → y + h·step_n(y) for n < N → closing (as a user would write it)."""

    def __init__(self, opening, steps, closing, T):
        super().__init__()
        self.opening, self.steps, self.closing, self.T = opening, nn.ModuleList(steps), \
            closing, T

    def forward(self, x):
        y, h = self.opening(x), self.T / len(self.steps)
        for step in self.steps:
            y = y + h * step(y)
        return self.closing(y)


def dense_net(N=6, K=3, C=5, n_classes=4, T=1.5, dtype=torch.float64, seed=0) -> ODENet:
    torch.manual_seed(seed)
    return ODENet(nn.Sequential(nn.Linear(K, C), nn.Tanh()),
                  [nn.Sequential(nn.Linear(C, C), nn.Tanh()) for _ in range(N)],
                  nn.Linear(C, n_classes), T).to(dtype)


def conv_net(N=4, Cin=1, C=2, H=5, W=4, n_classes=3, T=1.0, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return ODENet(nn.Sequential(nn.Conv2d(Cin, C, 3, padding=1), nn.ReLU()),
                  [nn.Sequential(nn.Conv2d(C, C, 3, padding=1), nn.ReLU()) for _ in range(N)],
                  nn.Sequential(nn.Flatten(), nn.Linear(C * H * W, n_classes)), T).to(dtype)


def batch(shape, n_classes, B=5, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((B, *shape)), rng.integers(0, n_classes, B)
