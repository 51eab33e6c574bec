"""Two independent ways to differentiate a map numerically: complex step and central differences.

A map ``out = f(args)`` takes a dict of named host arrays (the input and each parameter).

Complex step (tangent-linear map, no cancellation, exact to round-off)::

    J_a v = Im f(args with a ← a + iε·v) / ε,     ε = 1e-30

It needs every kernel on the path to accept complex arrays (the NumPy reference does: see the
dual-number rule in refbraid.backends.reference.activation). All real arrays are lifted to
complex128, so a float32 point is differentiated in double precision.

Central differences of the scalar ``L = <f(args), w>`` in entry k of argument a::

    fd_k = <f(a + δ e_k) − f(a − δ e_k), w> / (2δ),    δ = FD_STEP · max(1, |a_k|) ≈ 6e-6

and two numbers that say how far to trust it: the kink indicator
``|<f(a + δ e_k) − 2 f(a) + f(a − δ e_k), w>| / (2δ)``, half the disagreement of the
one-sided differences (for a piecewise-linear f, exactly the error a relu kink inside the step
causes; only O(δ) where f is smooth), and the round-off ``noise_k = ε Σ_i |f_i w_i| / δ`` of
the difference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

Args = dict[str, np.ndarray]

COMPLEX_STEP = 1e-30  # ε: far below round-off of the real part, far above underflow
#: δ relative to max(1, |a_k|): ε^(1/3) ≈ 6e-6, the step that balances the O(δ²) truncation
#: of central differences against their O(ε/δ) round-off (Nocedal & Wright, §8.1). With
#: δ = 1e-6 the round-off alone reached 1.3e-7 relative (tolerance 1e-7) on a network weight
#: with gradient 8e-4 and loss 1.4.
FD_STEP = float(np.finfo(np.float64).eps ** (1.0 / 3.0))


def complexify(args: Args) -> Args:
    """Lift real floating arrays to complex128 (integer arrays, e.g. tokens, stay as they are)."""
    return {k: v.astype(np.complex128) if v.dtype.kind in "fc" else v for k, v in args.items()}


def complex_step_tangent(f: Callable[[Args], np.ndarray], args: Args, name: str,
                         direction: np.ndarray) -> np.ndarray:
    """J_name · direction = Im f(args[name] + iε·direction) / ε, all arrays in complex128."""
    z = complexify(args)
    z[name] = z[name] + 1j * COMPLEX_STEP * np.asarray(direction, dtype=np.float64)
    return np.imag(np.asarray(f(z))) / COMPLEX_STEP


class Difference(NamedTuple):
    """A central difference of L = <f, w> and what tells how far to trust it."""

    value: float  # fd_k = <f(a + δe_k) − f(a − δe_k), w> / 2δ
    kink: float  # |<f(a + δe_k) − 2f(a) + f(a − δe_k), w>| / 2δ: half the one-sided disagreement
    noise: float  # ε Σ_i |f_i w_i| / δ: the round-off of fd_k


def central_difference(f: Callable[[Args], np.ndarray], args: Args, name: str,
                       index: tuple[int, ...], w: np.ndarray, f0: np.ndarray,
                       fraction: float = 1.0) -> Difference:
    """Central difference of L = <f, w> in entry ``index`` of ``args[name]`` with step
    ``fraction · FD_STEP · max(1, |a_k|)``; ``f0 = f(args)``."""
    a = args[name]
    delta = fraction * FD_STEP * max(1.0, abs(float(a[index])))
    outs, points = [], []
    for sign in (1.0, -1.0):
        moved = a.copy()
        moved[index] += sign * delta
        points.append(float(moved[index]))
        outs.append(np.asarray(f({**args, name: moved}), dtype=np.float64))
    plus, minus = outs
    width = points[0] - points[1]  # the step actually taken (a_k ± δ is rounded)
    value = float(np.sum((plus - minus) * w)) / width
    kink = abs(float(np.sum(((plus - f0) - (f0 - minus)) * w))) / width
    noise = 2.0 * np.finfo(np.float64).eps * float(np.sum(np.abs(f0 * w))) / width
    return Difference(value, kink, noise)
