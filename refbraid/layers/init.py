"""Weight initialisation shared by the layers (PyTorch's default uniform fan-in rule)."""

from __future__ import annotations

import numpy as np


def uniform_fan_in(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int,
                   dtype) -> np.ndarray:
    """U(-1/√fan_in, 1/√fan_in), as torch.nn.Linear / Conv2d initialise weights and biases."""
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    return int(value)
