"""Weight initialisation shared by the layers (PyTorch's default uniform fan-in rule), and the
argument checks every layer shares.

The checks are cheap by design (a shape or dtype comparison, one ``math.isfinite``), because
they run on every layer call: an MGRIT solve calls a step thousands of times.

* :func:`check_positive_int` — hyper-parameters such as ``width``;
* :func:`check_step_size` — the step size ``h`` (``dt``) where it enters an ODE step:
  a finite real number > 0;
* :func:`check_adjoint` — the incoming adjoint of an ``adjoint(...)`` call has *exactly* the
  shape of the forward output (a batch of 1 would otherwise broadcast silently);
* :func:`check_dtype` — the input of a ``forward(...)`` call and the floating arrays of its
  params share one dtype (float32 and float64 mixed in one call is an error, not an upcast).

A NaN or infinity in an input, a parameter or a gradient is a :class:`NonFiniteError` (a
ValueError): a training loop may treat it as divergence rather than as a usage error.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np

from ..backends.dtypes import dtype_kind


class NonFiniteError(ValueError):
    """An array that must be finite holds NaN or infinite values (the message names it)."""


def uniform_fan_in(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int,
                   dtype) -> np.ndarray:
    """U(-1/√fan_in, 1/√fan_in), as torch.nn.Linear / Conv2d initialise weights and biases."""
    bound = 1.0 / np.sqrt(fan_in)
    return rng.uniform(-bound, bound, size=shape).astype(dtype)


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    return int(value)


def check_step_size(name: str, value) -> float:
    """``value`` as a float; ValueError unless it is a finite real number > 0."""
    if isinstance(value, float) and 0.0 < value < math.inf:  # the common case, fast
        return float(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, Real) \
            or not math.isfinite(value) or not value > 0:
        raise ValueError(f"`{name}` must be a positive finite number (the step size), "
                         f"got {value!r}.")
    return float(value)


def shape_of(value) -> object:
    """``value.shape`` as a tuple, or the type name of something that is not an array."""
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else type(value).__name__


def check_adjoint(name: str, value, shape) -> None:
    """ValueError unless the adjoint ``value`` has exactly the forward output's ``shape``."""
    got = getattr(value, "shape", None)
    if got is None or tuple(got) != tuple(shape):
        raise ValueError(f"`{name}` must have the shape of the forward output {tuple(shape)}, "
                         f"got {shape_of(value)}.")


def check_features(name: str, x, features: int) -> None:
    """ValueError unless ``x`` is (batch, ..., ``features``): the width the layer's weights
    expect."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 2 or shape[-1] != features:
        raise ValueError(f"`{name}` must have shape (batch, {features}) for this layer's "
                         f"weights, got {shape if shape is not None else type(x).__name__}.")


def check_dtype(name: str, x, params) -> None:
    """TypeError unless the floating input ``x`` and every floating array in ``params`` have
    one dtype (integer token ids and boolean masks are not compared)."""
    want = getattr(x, "dtype", None)
    if want is None or dtype_kind(want) not in "fc":
        return
    for key, value in params.items():
        dtype = getattr(value, "dtype", None)
        if dtype is not None and dtype != want and dtype_kind(dtype) in "fc":
            raise TypeError(f"`{name}` has dtype {want} but `params[{key!r}]` has dtype "
                            f"{dtype}: one call must use one floating dtype; cast the input "
                            f"or the parameters with .astype(...).")
