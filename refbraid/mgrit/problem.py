"""The problem MGRIT solves, and its sequential solution (the oracle).

Forward problem (docs/references.md §2), fine indices ``i = 0..N``::

    u[0] = u0,      u[i] = Φ(u[i-1]; i-1 → i) + g[i],      i = 1..N

Backward (adjoint) problem, e.g. backprop ``λ[n] = Φ_n'(y[n])ᵀ λ[n+1] + g[n]``::

    u[N] = u0,      u[i] = Φ(u[i+1]; i+1 → i) + g[i],      i = N-1..0

The user supplies ``step(u, start, stop) -> new array``: ONE step from fine index ``start`` to
fine index ``stop`` (``stop = start ± 1`` on the finest level; on coarse levels the interval
spans several fine steps, and the step decides what that means, e.g. step size
``t[stop] - t[start]``). A backward problem's step is called with ``start > stop``.

Optionally it also supplies ``batched_step(U, starts, stops) -> array``: the same step on
k independent intervals at once (rows ``U[j]``, fine indices ``starts[j] → stops[j]``,
integer arrays), i.e. ``out[j] = step(U[j], starts[j], stops[j])``, shape ``(k, *S)``. MGRIT's
relaxations and residuals then make one call per sweep instead of one per interval
(:mod:`refbraid.mgrit.batched`); ``step`` stays the definition, and the tests compare the two.

The solver works in *solver order* ``s = 0..N``: ``i = s`` forward, ``i = N - s`` backward,
so one code path serves both directions (the adjoint runs on the reversed grid).

States are arrays of any shape (NumPy, or any array type with ``__array_namespace__``); a
level's iterate is one stacked array in ``u0``'s dtype, so ``u0`` must be a floating (or
complex) array: an integer or bool array is rejected (its iterates would be truncated to
integers; pass ``u0.astype(np.float64)``). A plain Python number is taken as float64 (or
complex128). ``u0`` and ``g`` must be finite.

Shape legend: N steps, S = state shape, so a trajectory is ``(N + 1, *S)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from time import perf_counter
from typing import Any

import numpy as np

from ..backends.capture_state import host_reads_allowed
from ..backends.dtypes import dtype_kind
from ..backends.host import all_finite
from ..backends.into import takes_out
from ..backends.portable import empty_on, stack_rows, zeros_on
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
    # (inside host_reads_deferred the solve's own finiteness flag, read afterwards, covers it)
    if kind is not None and host_reads_allowed() and not all_finite(value):
        raise ValueError(f"`{name}` must be finite, got NaN or infinite values.")


@dataclass(frozen=True, eq=False)
class Problem:
    """``u[i] = step(u[i∓1], i∓1, i) + g[i]`` from ``u0`` over ``n_steps`` steps.

    step       callable ``step(u, start, stop)`` (or an object with such a ``step`` method);
               optionally with ``out=`` (an array it may write its result into, returning it)
               and then ``add=`` (a state to add to its result: MGRIT passes ``g``'s row, so
               ``Φ(u) + g`` can be formed in one pass; the result must be ``Φ(u) + add``)
    u0         initial value: at fine index 0 (forward) or N (backward); shape S; a floating
               (or complex) array, or a Python number (taken as float64 / complex128)
    n_steps    N ≥ 1
    g          optional forcing, shape ``(N + 1, *S)``, indexed by fine index; its entry at the
               initial index is ignored (u0 is used there). None: zero.
    t          optional time grid t[0..N] (strictly increasing); default uniform on [0, 1]
    direction  'forward' or 'backward'
    guess      optional ``guess(i) -> state`` (shape S): the cold-start iterate at fine index
               i (default: u0 at every point), e.g. u0 carried through shape-changing steps
    transfer   optional spatial transfer between levels (``restrict(u, level, index)``,
               ``interpolate(v, level, index)``; :mod:`refbraid.mgrit.transfer`), None: the
               same state on every level (coarsening in time only)
    batched_step  optional ``batched_step(U, starts, stops)``: ``step`` on k intervals at once,
               shape ``(k, *S)`` (module docstring); None: MGRIT loops over ``step``. An object
               with ``step`` and ``batched_step`` methods given as ``step`` supplies both.
               Optionally with ``out=`` and ``add=`` both: then it must write ``Φ(U) + add``
               (add None: Φ(U)) into ``out`` (rows of the iterate, a view) and return ``out``
               — the F-sweeps' result, where the step's kernel can write it (no copy after).
    carries_nonfinite  True when ``step`` keeps a non-finite value: ``Φ(u)`` is non-finite
               wherever ``u`` is, as for ``u + h F(u)`` (IEEE sums keep inf and NaN). The
               solver's finiteness check of its solution then reads one F-row per interval
               (a NaN or inf inside an interval reaches its last row). None (default): what
               ``step`` itself declares in an attribute of that name (the layer-parallel
               propagators: True), else False — every row.
    """

    step: Any
    u0: Any
    n_steps: int
    g: Any = None
    t: Any = None
    direction: str = "forward"
    transfer: Any = None
    guess: Any = None
    batched_step: Any = None
    carries_nonfinite: bool | None = None

    def __post_init__(self):
        step = self.step
        if self.carries_nonfinite is None:
            object.__setattr__(self, "carries_nonfinite",
                               getattr(step, "carries_nonfinite", False))
        if not callable(step):
            if callable(getattr(step, "step", None)):
                object.__setattr__(self, "step", step.step)
                if self.batched_step is None and callable(getattr(step, "batched_step", None)):
                    object.__setattr__(self, "batched_step", step.batched_step)
            else:
                raise TypeError(
                    "`step` must be a callable step(u, start, stop) or have a `step` method, "
                    f"got {step!r}."
                )
        if self.batched_step is not None and not callable(self.batched_step):
            raise TypeError("`batched_step` must be None or a callable "
                            f"batched_step(U, starts, stops), got {self.batched_step!r}.")
        if not isinstance(self.carries_nonfinite, bool):
            raise TypeError("`carries_nonfinite` must be True or False, got "
                            f"{self.carries_nonfinite!r}.")
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
        if self.transfer is not None and not all(
            callable(getattr(self.transfer, m, None)) for m in ("restrict", "interpolate")
        ):
            raise TypeError("`transfer` must have restrict(u, level, index) and "
                            f"interpolate(v, level, index) methods, got {self.transfer!r}.")
        if self.guess is not None and not callable(self.guess):
            raise TypeError(f"`guess` must be a callable guess(i) -> state, got {self.guess!r}.")
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

    def level_shapes(self, n_levels: int) -> list[tuple[int, ...]]:
        """State shape on each level: S on level 0, then ``transfer.restrict`` of the level
        above (all S without a transfer)."""
        shapes = [self.state_shape]
        probe = namespace(self.u0).zeros_like(self.u0)
        for ell in range(n_levels - 1):
            if self.transfer is not None:
                probe = self.transfer.restrict(probe, ell, self.initial_index)
            shapes.append(tuple(probe.shape))
        return shapes

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
            transfer=getattr(obj, "transfer", None),
            guess=getattr(obj, "guess", None),
            batched_step=getattr(obj, "batched_step", None),
            carries_nonfinite=getattr(obj, "carries_nonfinite", None),
        )
    raise TypeError(
        "`problem` must be a refbraid.mgrit.Problem or have `step`, `u0` and `n_steps`, "
        f"got {obj!r}."
    )


@lru_cache(maxsize=64)
def _function_takes_out(fn, name: str = "out") -> bool:
    """:func:`~refbraid.backends.into.takes_out` of a plain function, read once."""
    return takes_out(fn, name)


def step_takes_out(step, name: str = "out") -> bool:
    """Whether ``step`` takes ``out=`` (or the parameter ``name``: ``add``). A bound method
    (the layer-parallel propagators, made anew for every gradient) is answered from its
    function's signature, read once per function instead of once per level and solve; any
    other callable is inspected."""
    fn = getattr(step, "__func__", None)
    return _function_takes_out(fn, name) if fn is not None else takes_out(step, name)


class CountingStep:
    """The problem's step in solver indices, counting applications and checking shapes.

    ``__call__(u, s_start, s_stop)`` calls ``problem.step(u, i_start, i_stop)`` with fine
    indices; ``many(U, s_starts, s_stops)`` applies the step to k intervals at once (one
    ``problem.batched_step`` call when the problem has one, else k ``step`` calls) and counts
    k applications. Both raise ValueError naming ``step`` (``batched_step``) when the result
    has the wrong shape. When a trace recorder is active (:mod:`refbraid.parallel.trace`)
    every counted application is also recorded with its level and fine indices (a batched
    call as k consecutive boxes that share its time, :meth:`Recorder.steps`); otherwise that
    costs one lookup.
    """

    def __init__(self, problem: Problem, level: int = 0, shape: tuple[int, ...] | None = None):
        self.problem = problem
        self.level = level
        self.count = 0
        self.seconds = 0.0
        self._shape = problem.state_shape if shape is None else tuple(shape)
        self._step = problem.step
        #: whether ``step`` takes ``out=`` (write its result there where it can, e.g. the
        #: layer-parallel propagators): :meth:`__call__` passes it on, else drops it
        self.takes_out = step_takes_out(problem.step)
        #: whether it also takes ``add=`` (a row to add to its result: ``Φ(u) + g`` in one
        #: pass where the layer can); only passed together with ``out``
        self.takes_add = self.takes_out and step_takes_out(problem.step, "add")
        # solver index -> fine index:  i = s (forward),  i = N - s (backward)
        self._flip = problem.n_steps if problem.direction == "backward" else None
        self.batched = problem.batched_step is not None
        #: whether ``batched_step`` takes ``out=`` and ``add=`` (:meth:`many` passes them on;
        #: it must then write ``Φ(U) + add`` into ``out`` and return it)
        self.batched_into = (self.batched and step_takes_out(problem.batched_step)
                             and step_takes_out(problem.batched_step, "add"))

    def __call__(self, u, s_start: int, s_stop: int, out=None, add=None):
        """``Φ(u; s_start → s_stop)``; ``out``: where the step may write it, if it takes
        ``out=`` (the result ``is out`` then; otherwise a new array the caller copies);
        ``add`` (only where :attr:`takes_add`): the result is ``Φ(u) + add``."""
        flip = self._flip
        if flip is None:
            start, stop = int(s_start), int(s_stop)
        else:
            start, stop = flip - int(s_start), flip - int(s_stop)
        t0 = perf_counter()
        if add is not None:
            out = self._step(u, start, stop, out=out, add=add)
        elif out is not None and self.takes_out:
            out = self._step(u, start, stop, out=out)
        else:
            out = self._step(u, start, stop)
        t1 = perf_counter()
        self.seconds += t1 - t0
        self.count += 1
        rec = active_recorder()
        if rec is not None:
            rec.step(self.level, start, stop, t0, t1)
        shape = getattr(out, "shape", None)
        if shape != self._shape and (shape is None or tuple(shape) != self._shape):
            self._bad_shape("step", out, start, stop)
        return out

    def many(self, U, s_starts, s_stops, out=None, add=None):
        """Rows ``Φ(U[j]; s_starts[j] → s_stops[j])`` (solver indices), shape ``(k, *S)``;
        with ``out`` (only where :attr:`batched_into`) written there, plus ``add`` (None: 0),
        and ``out`` returned."""
        k = len(s_starts)
        if not self.batched:
            return stack_rows([self(U[j, ...], s_starts[j], s_stops[j]) for j in range(k)])
        flip = self._flip
        s_starts, s_stops = np.asarray(s_starts), np.asarray(s_stops)
        starts, stops = (s_starts, s_stops) if flip is None else (flip - s_starts, flip - s_stops)
        t0 = perf_counter()
        rows = {} if out is None else {"out": out, "add": add}
        out = self.problem.batched_step(U, starts, stops, **rows)
        t1 = perf_counter()
        self.seconds += t1 - t0
        self.count += k
        rec = active_recorder()
        if rec is not None:
            rec.steps(self.level, starts, stops, t0, t1)
        shape = getattr(out, "shape", None)
        if shape is None or tuple(shape) != (k, *self._shape):
            self._bad_shape("batched_step", out, starts[:1], stops[:1], k)
        return out

    def _bad_shape(self, name: str, out, start, stop, k: int | None = None) -> None:
        shape = getattr(out, "shape", None)
        got = tuple(shape) if shape is not None else type(out).__name__
        want = self._shape if k is None else (k, *self._shape)
        what = "the state shape" if k is None else f"{k} stacked states"
        raise ValueError(
            f"`{name}` returned {got} for start={start}, stop={stop} (level {self.level}); "
            f"expected an array of {what} {want}."
        )


def stacked(xp, value, n: int, out=None):
    """``n`` copies of ``value`` stacked along a new first axis: shape ``(n, *value.shape)``
    (written into ``out`` when given)."""
    value = xp.asarray(value)
    # a fresh C-ordered array (a copy of a broadcast view may keep the zero stride innermost,
    # which makes every later row access slow)
    out = empty_on(value, (n, *value.shape)) if out is None else out
    out[...] = value
    return out


def rhs_solver_order(problem: Problem, workspace=None):
    """Right-hand side in solver order: ``g_s[0] = u0``, ``g_s[s] = g[i(s)]``; ``(N + 1, *S)``.

    With a :class:`~refbraid.mgrit.workspace.Workspace` the array is the workspace's: the
    unforced one is zeroed when it is made and only its row 0 is ever written (nothing writes
    a level's g in place), the forced one is overwritten by ``g`` every time."""
    xp = namespace(problem.u0)
    u0 = xp.asarray(problem.u0)
    shape = (problem.n_steps + 1, *u0.shape)
    if problem.g is None:
        if workspace is None:
            g = zeros_on(u0, shape)  # lazily zeroed pages
        else:
            g = workspace.zeros("rhs unforced", 0, u0, shape)
    elif workspace is None:
        g = xp.asarray(problem.g, dtype=u0.dtype, copy=True)
        if problem.direction == "backward":
            g = xp.flip(g, axis=0)
    else:
        src = xp.asarray(problem.g, dtype=u0.dtype)
        g = workspace.empty("rhs", 0, u0, shape)
        g[...] = xp.flip(src, axis=0) if problem.direction == "backward" else src
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
    """Forward substitution in the problem's direction; returns u ``(N + 1, *S)``, fine order.

    ``u[0] = u0, u[i] = Φ(u[i-1]) + g[i]`` (forward) or ``u[N] = u0, u[i] = Φ(u[i+1]) + g[i]``
    (backward): N step applications, the O(N) serial baseline every MGRIT solve is checked
    against.
    """
    problem = as_problem(problem)
    g = rhs_solver_order(problem)
    points = np.arange(problem.n_steps + 1)
    u = forward_substitution(g, points, CountingStep(problem), ghost=None, ghost_point=None)
    return to_fine_order(problem, u)
