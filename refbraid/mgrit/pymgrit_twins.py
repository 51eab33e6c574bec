"""PyMGRIT's own test problems, step for step, with batched steps (for comparisons with PyMGRIT).

PyMGRIT (docs/references.md, Hahne, Friedhoff & Bolten 2021) ships ``Dahlquist`` and
``Heat1D`` applications; these are the same time steppers as refbraid problems, so a solve
can be checked against PyMGRIT's residual history and timed against it
(``python -m benchmarks full solver``). PyMGRIT itself is not needed here.

==================  =========================================================================
problem             step from ``start`` to ``stop`` (``dt = t[stop] - t[start]``)
==================  =========================================================================
pymgrit_dahlquist   ``u' = λ u``, ``u(0) = 1``, backward Euler ``(1 / (1 - λ dt)) · u``
                    (PyMGRIT's ``Dahlquist(method='BE')``, λ = -1, t ∈ [0, 5])
pymgrit_heat_1d     ``u_t - a u_xx = b(x, t)`` on (x_start, x_end), homogeneous Dirichlet,
                    ``nx`` grid points of which nx - 2 unknowns, central differences
                    ``L = a/dx² · tridiag(-1, 2, -1)``, backward Euler
                    ``(I + dt L) u_new = u + dt · b(x, t[stop])``
                    (PyMGRIT's ``Heat1D``; its example: x ∈ [0, 1], a = 1, t ∈ [0, 2])
==================  =========================================================================

The heat system is tridiagonal and diagonally dominant, so it is solved by the Thomas
algorithm (elimination without pivoting) with the factors cached per step size, compiled with
Numba. PyMGRIT solves it with SciPy's sparse LU (``spsolve``): the two agree to round-off.
``step`` and ``batched_step`` run the same kernel on 1 and on k rows: bit-identical.

Shape legend: n = nx - 2 unknowns, k rows of a batched call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from .problem import Problem
from .problems import _uniform


def pymgrit_dahlquist(n_steps: int, T: float = 5.0, lam: float = -1.0) -> Problem:
    """PyMGRIT's Dahlquist problem, backward Euler: ``u ← (1 / (1 - λ dt)) · u``, ``u(0) = 1``."""
    t = _uniform(n_steps, T)

    def step(u, start, stop):
        z = (t[stop] - t[start]) * lam
        return 1 / (1 - z) * u

    def batched_step(U, starts, stops):  # (k, 1): the same operations, row by row
        z = (t[stops] - t[starts])[:, None] * lam
        return 1 / (1 - z) * U

    return Problem(step, np.ones(1), n_steps, t=t, batched_step=batched_step)


# ----------------------------------------------------------------------------- tridiagonal solve
@njit(cache=True)
def _thomas_factor(n: int, diag: float, off: float):  # pragma: no cover - compiled
    """Factors of ``tridiag(off, diag, off)``: ``c'[i] = off / m_i``, ``1 / m_i`` with
    ``m_0 = diag``, ``m_i = diag - off · c'[i-1]``."""
    cp = np.empty(n)
    inv_m = np.empty(n)
    m = diag
    for i in range(n):
        if i > 0:
            m = diag - off * cp[i - 1]
        inv_m[i] = 1.0 / m
        cp[i] = off * inv_m[i]
    return cp, inv_m


@njit(cache=True)
def _thomas_solve(B, cp, inv_m, off, out):  # pragma: no cover - compiled
    """Rows ``out[j] = tridiag(off, diag, off)⁻¹ B[j]`` from the factors (B, out: (k, n))::

        d'[0] = b[0] / m_0,   d'[i] = (b[i] - off · d'[i-1]) / m_i
        x[n-1] = d'[n-1],     x[i] = d'[i] - c'[i] · x[i+1]
    """
    k, n = B.shape
    for j in range(k):
        d = B[j, 0] * inv_m[0]
        out[j, 0] = d
        for i in range(1, n):
            d = (B[j, i] - off * d) * inv_m[i]
            out[j, i] = d
        for i in range(n - 2, -1, -1):
            out[j, i] = out[j, i] - cp[i] * out[j, i + 1]
    return out


@dataclass
class _HeatBE:
    """Backward Euler for PyMGRIT's Heat1D: ``(I + dt L) u_new = u + dt b(x, t_stop)``."""

    x: np.ndarray  # (n,) interior grid points
    a: float
    t: np.ndarray
    rhs: Callable
    factors: dict = field(default_factory=dict)

    def _factors(self, dt: float):
        f = self.factors.get(dt)
        if f is None:
            fac = self.a / (self.x[1] - self.x[0]) ** 2
            off = -dt * fac
            cp, inv_m = _thomas_factor(len(self.x), 1.0 + 2.0 * dt * fac, off)
            f = self.factors[dt] = (cp, inv_m, off)
        return f

    def step(self, u, start, stop):
        dt = self.t[stop] - self.t[start]
        b = u + self.rhs(self.x, self.t[stop]) * dt
        cp, inv_m, off = self._factors(float(dt))
        return _thomas_solve(b[None, :], cp, inv_m, off, np.empty((1, len(u))))[0]

    def batched_step(self, U, starts, stops):
        dts = self.t[stops] - self.t[starts]
        out = np.empty_like(U)
        B = U + self.rhs(self.x[None, :], self.t[stops][:, None]) * dts[:, None]
        for dt in np.unique(dts):
            rows = np.flatnonzero(dts == dt)
            cp, inv_m, off = self._factors(float(dt))
            out[rows] = _thomas_solve(B[rows], cp, inv_m, off, np.empty((len(rows), U.shape[1])))
        return out


def heat_example_rhs(x, t):
    """PyMGRIT's Heat1D example forcing ``b = -sin(πx)(sin t - π² cos t)`` (exact solution
    ``sin(πx) cos t`` for a = 1)."""
    return -np.sin(np.pi * x) * (np.sin(t) - np.pi**2 * np.cos(t))


def heat_example_init(x):
    """PyMGRIT's Heat1D example initial value ``sin(πx)``."""
    return np.sin(np.pi * x)


def pymgrit_heat_1d(
    n_steps: int,
    nx: int = 1001,
    T: float = 2.0,
    a: float = 1.0,
    x_start: float = 0.0,
    x_end: float = 1.0,
    init_cond: Callable = heat_example_init,
    rhs: Callable = heat_example_rhs,
) -> Problem:
    """PyMGRIT's Heat1D (backward Euler) over ``n_steps`` steps on [0, T] (module docstring)."""
    if not (isinstance(nx, (int, np.integer)) and nx >= 4):
        raise ValueError(f"`nx` must be an integer >= 4 (grid points with both ends), got {nx!r}.")
    x = np.linspace(x_start, x_end, int(nx))[1:-1]
    stepper = _HeatBE(x, float(a), _uniform(n_steps, T), rhs)
    u0 = np.asarray(init_cond(x), dtype=np.float64)
    return Problem(stepper.step, u0, n_steps, t=stepper.t, batched_step=stepper.batched_step)


# ----------------------------------------------------------------------------- PyMGRIT itself
def pymgrit_solve(kind: str, n_steps: int, levels: int = 3, cfactor: int = 4, tol: float = 1e-10,
                  cf_iter: int = 1, max_iter: int = 100, **heat) -> tuple[np.ndarray, float]:
    """Solve the same problem with PyMGRIT itself (a cross-check; needs ``pymgrit``).

    kind      'dahlquist' or 'heat' (``heat``: nx, T, a as in :func:`pymgrit_heat_1d`)
    Returns PyMGRIT's residual history (its ``conv``: the C-point residual norm after each
    cycle, F-points interpolated: refbraid's ``post_cycle_norms[1:]``) and the wall time of
    its setup (which includes its nested iteration) plus solve.
    """
    import time

    try:
        from pymgrit.core.mgrit import Mgrit
        from pymgrit.core.simple_setup_problem import simple_setup_problem
        from pymgrit.dahlquist.dahlquist import Dahlquist
        from pymgrit.heat.heat_1d import Heat1D
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("`pymgrit_solve` needs PyMGRIT (pip install pymgrit).") from err
    if kind == "dahlquist":
        fine = Dahlquist(t_start=0, t_stop=5, nt=n_steps + 1)
    elif kind == "heat":
        nx, T, a = heat.get("nx", 1001), heat.get("T", 2.0), heat.get("a", 1.0)
        fine = Heat1D(x_start=0, x_end=1, nx=nx, a=a, init_cond=heat_example_init,
                      rhs=heat_example_rhs, t_start=0, t_stop=T, nt=n_steps + 1)
    else:
        raise ValueError(f"`kind` must be 'dahlquist' or 'heat', got {kind!r}.")
    shim = not hasattr(np, "in1d")  # PyMGRIT 1.0.6 calls np.in1d, removed in NumPy 2.4
    if shim:  # put its documented equivalent there while PyMGRIT runs
        setattr(np, "in1d", lambda a, b: np.isin(a, b).ravel())  # noqa: B010
    try:
        t0 = time.perf_counter()
        mgrit = Mgrit(problem=simple_setup_problem(fine, levels, cfactor), tol=tol,
                      cf_iter=cf_iter, nested_iteration=True, max_iter=max_iter, logging_lvl=30)
        conv = mgrit.solve()["conv"]
        seconds = time.perf_counter() - t0
    finally:
        if shim:
            delattr(np, "in1d")
    return np.asarray(conv), seconds
