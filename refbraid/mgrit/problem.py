"""The problem MGRIT solves, and its sequential solution (the oracle).

Forward problem (docs/references.md §2), fine indices ``i = 0..N``::

    u[0] = u0,      u[i] = Φ(u[i-1]; i-1 → i) + g[i],      i = 1..N

Backward (adjoint) problem, e.g. backprop ``λ[n] = Φ_n'(y[n])ᵀ λ[n+1] + g[n]``::

    u[N] = u0,      u[i] = Φ(u[i+1]; i+1 → i) + g[i],      i = N-1..0

The user supplies ``step(u, start, stop) -> new array``: ONE step from fine index ``start`` to
fine index ``stop`` (``stop = start ± 1`` on the finest level; on coarse levels the interval
spans several fine steps, and the step decides what that means, e.g. step size
``t[stop] - t[start]``). A backward problem's step is called with ``start > stop``.

The solver works in *solver order* ``s = 0..N``: ``i = s`` forward, ``i = N - s`` backward,
so one code path serves both directions (the adjoint runs on the reversed grid).

States are arrays of any shape (NumPy, or any array type with ``__array_namespace__``); a
level's iterate is one stacked array in ``u0``'s dtype, so ``u0`` must be a floating (or
complex) array: an integer or bool array is rejected (its iterates would be truncated to
integers; pass ``u0.astype(np.float64)``). A plain Python number is taken as float64 (or
complex128). ``u0`` and ``g`` must be finite.

Shape legend: N steps, S = state shape, so a trajectory is (N + 1, *S).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backends.dtypes import dtype_kind
from ..backends.host import all_finite
from ..parallel.trace import active_recorder
from .arrays import namespace
from .coarse import forward_substitution

DIRECTIONS = ("forward", "backward")

Step = Callable[[Any, int, int], Any]


def _check_state_array(name: str, value, what: str) -> None:
    """TypeError unless ``value`` is a floating or complex array; ValueError unless finite."""
    dtype = getattr(value, "dtype", None)
    kind = dtype_kind(dtype) if dtype is not None else None
    if kind is not None and kind not in "fc":
        raise TypeError(f"`{name}` must be a floating (or complex) array, got dtype "
                        f"{value.dtype}: {what} in its dtype and integers would be truncated; "
                        f"pass e.g. {name}.astype(np.float64).")
    if kind is not None and not all_finite(value):
        raise ValueError(f"`{name}` must be finite, got NaN or infinite values.")


@dataclass(frozen=True, eq=False)
class Problem:
    """``u[i] = step(u[i∓1], i∓1, i) + g[i]`` from ``u0`` over ``n_steps`` steps.

    step       callable ``step(u, start, stop)`` (or an object with such a ``step`` method)
    u0         initial value: at fine index 0 (forward) or N (backward); shape S; a floating
               (or complex) array, or a Python number (taken as float64 / complex128)
    n_steps    N ≥ 1
    g          optional forcing, shape (N + 1, *S), indexed by fine index; its entry at the
               initial index is ignored (u0 is used there). None: zero.
    t          optional time grid t[0..N] (strictly increasing); default uniform on [0, 1]
    direction  'forward' or 'backward'
    """

    step: Any
    u0: Any
    n_steps: int
    g: Any = None
    t: Any = None
    direction: str = "forward"

    def __post_init__(self):
        step = self.step
        if not callable(step):
            if callable(getattr(step, "step", None)):
                object.__setattr__(self, "step", step.step)
            else:
                raise TypeError(
                    "`step` must be a callable step(u, start, stop) or have a `step` method, "
                    f"got {step!r}."
                )
        n = self.n_steps
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"`n_steps` must be a positive integer, got {n!r}.")
        object.__setattr__(self, "n_steps", int(n))
        if not hasattr(self.u0, "shape"):
            if isinstance(self.u0, (int, float, complex)) and not isinstance(self.u0, bool):
                object.__setattr__(
                    self, "u0", np.asarray(self.u0, dtype=np.result_type(self.u0, 1.0))
                )
            else:
                raise TypeError(
                    f"`u0` must be an array (or a number), got {type(self.u0).__name__}."
                )
        _check_state_array("u0", self.u0, "MGRIT's iterates live")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"`direction` must be one of {DIRECTIONS}, got {self.direction!r}.")
        if self.g is not None:
            want = (n + 1, *self.state_shape)
            if tuple(getattr(self.g, "shape", ())) != want:
                raise ValueError(
                    f"`g` must have shape (n_steps + 1, *u0.shape) = {want}, "
                    f"got {getattr(self.g, 'shape', type(self.g).__name__)}."
                )
            _check_state_array("g", self.g, "it is cast to u0's dtype")
        if self.t is not None:
            t = np.asarray(self.t, dtype=float)
            if t.shape != (n + 1,) or not np.all(np.isfinite(t)) or not np.all(np.diff(t) > 0):
                raise ValueError(
                    f"`t` must be {n + 1} finite, strictly increasing times, got shape {t.shape}."
                )
            object.__setattr__(self, "t", t)

    @property
    def state_shape(self) -> tuple[int, ...]:
        return tuple(self.u0.shape)

    @property
    def times(self) -> np.ndarray:
        """The time grid t[0..N] (uniform on [0, 1] unless given)."""
        return self.t if self.t is not None else np.linspace(0.0, 1.0, self.n_steps + 1)

    @property
    def initial_index(self) -> int:
        return 0 if self.direction == "forward" else self.n_steps

    def to_fine(self, s: int) -> int:
        """Fine index of solver-order index ``s``."""
        return s if self.direction == "forward" else self.n_steps - s


def as_problem(obj) -> Problem:
    """A :class:`Problem` from a Problem, or from any object with ``step``, ``u0``, ``n_steps``
    (and optional ``g``, ``t``, ``direction``) attributes."""
    if isinstance(obj, Problem):
        return obj
    if all(hasattr(obj, a) for a in ("step", "u0", "n_steps")):
        return Problem(
            step=obj.step,
            u0=obj.u0,
            n_steps=obj.n_steps,
            g=getattr(obj, "g", None),
            t=getattr(obj, "t", None),
            direction=getattr(obj, "direction", "forward"),
        )
    raise TypeError(
        "`problem` must be a refbraid.mgrit.Problem or have `step`, `u0` and `n_steps`, "
        f"got {obj!r}."
    )


class CountingStep:
    """The problem's step in solver indices, counting applications and checking shapes.

    ``__call__(u, s_start, s_stop)`` calls ``problem.step(u, i_start, i_stop)`` with fine
    indices; raises ValueError naming ``step`` when the result has the wrong shape. When a
    trace recorder is active (:mod:`refbraid.parallel.trace`) every counted application is
    also recorded with its level and fine indices; otherwise that costs one lookup.
    """

    def __init__(self, problem: Problem, level: int = 0):
        self.problem = problem
        self.level = level
        self.count = 0
        self.seconds = 0.0
        self._shape = problem.state_shape

    def __call__(self, u, s_start: int, s_stop: int):
        p = self.problem
        start, stop = p.to_fine(int(s_start)), p.to_fine(int(s_stop))
        t0 = time.perf_counter()
        out = p.step(u, start, stop)
        t1 = time.perf_counter()
        self.seconds += t1 - t0
        self.count += 1
        rec = active_recorder()
        if rec is not None:
            rec.step(self.level, start, stop, t0, t1)
        shape = getattr(out, "shape", None)
        if shape is None or tuple(shape) != self._shape:
            got = tuple(shape) if shape is not None else type(out).__name__
            raise ValueError(
                f"`step` returned {got} for start={start}, stop={stop} (level {self.level}); "
                f"expected an array of the state shape {self._shape}."
            )
        return out


def stacked(xp, value, n: int):
    """``n`` copies of ``value`` stacked along a new first axis: shape (n, *value.shape)."""
    return xp.stack([xp.asarray(value)] * n)


def rhs_solver_order(problem: Problem):
    """Right-hand side in solver order: ``g_s[0] = u0``, ``g_s[s] = g[i(s)]``; (N + 1, *S)."""
    xp = namespace(problem.u0)
    u0 = xp.asarray(problem.u0)
    if problem.g is None:
        g = stacked(xp, xp.zeros_like(u0), problem.n_steps + 1)
    else:
        g = xp.asarray(problem.g, dtype=u0.dtype, copy=True)
        if problem.direction == "backward":
            g = xp.flip(g, axis=0)
    g[0, ...] = u0
    return g


def to_fine_order(problem: Problem, u_solver):
    """Rows of a solver-order trajectory (or of a whole-grid array) in fine-index order."""
    if problem.direction == "forward":
        return u_solver
    return namespace(u_solver).flip(u_solver, axis=0)


def from_fine_order(problem: Problem, u_fine):
    """Inverse of :func:`to_fine_order` (the same reversal)."""
    return to_fine_order(problem, u_fine)


def sequential_solve(problem) -> Any:
    """Forward substitution in the problem's direction; returns u, shape (N + 1, *S), fine order.

    ``u[0] = u0, u[i] = Φ(u[i-1]) + g[i]`` (forward) or ``u[N] = u0, u[i] = Φ(u[i+1]) + g[i]``
    (backward): N step applications, the O(N) serial baseline every MGRIT solve is checked
    against.
    """
    problem = as_problem(problem)
    g = rhs_solver_order(problem)
    points = np.arange(problem.n_steps + 1)
    u = forward_substitution(g, points, CountingStep(problem), ghost=None, ghost_point=None)
    return to_fine_order(problem, u)
