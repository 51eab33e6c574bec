"""Model problems for tests, lessons and benchmarks (each returns a :class:`Problem`).

All steps are defined on fine indices with step size ``dt = |t[stop] - t[start]|``, so a
coarse step over ``m`` fine intervals is the same scheme with step ``m·h`` (re-discretisation,
docs/references.md §2).

==================  =========================================================================
problem             step from ``start`` to ``stop`` (``dt = t[stop] - t[start]``)
==================  =========================================================================
dahlquist           ``y' = a y`` per mode: forward Euler ``(1 + a dt) u``, backward Euler
                    ``u / (1 - a dt)``; ``a`` may be an array of modes (state shape (M,))
heat_1d             ``y' = ν ∂²y/∂x²`` on (0, 1), Dirichlet, n_x interior points, backward
                    Euler ``(I - dt ν L)⁻¹ u`` (inverse cached per step size)
nonlinear_ode       ``y' = -y - y³ + sin(2π t)`` (per component), forward Euler:
                    ``u + dt (-u - u³ + sin(2π t[start]))``
LinearODE           ``y' = K(t) y`` with a smooth, damped, non-symmetric ``K``; forward Euler
                    with ``K`` at ``start``; its adjoint steps ``(I + dt K(t[stop]))ᵀ λ``
==================  =========================================================================

Shape legend: M modes, n_x spatial points, d state size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .problem import Problem


def _uniform(n_steps: int, T: float) -> np.ndarray:
    if not (np.isfinite(T) and T > 0):
        raise ValueError(f"`T` must be a positive finite number, got {T!r}.")
    return np.linspace(0.0, float(T), int(n_steps) + 1)


def dahlquist(a, n_steps: int, T: float = 1.0, scheme: str = "backward", u0=1.0) -> Problem:
    """``y' = a y`` (a scalar or an array of modes), ``y(0) = u0``, forward or backward Euler."""
    a = np.atleast_1d(np.asarray(a))
    if scheme not in ("forward", "backward"):
        raise ValueError(f"`scheme` must be 'forward' or 'backward', got {scheme!r}.")
    t = _uniform(n_steps, T)
    implicit = scheme == "backward"

    def step(u, start, stop):
        z = a * abs(t[stop] - t[start])
        return u / (1 - z) if implicit else u * (1 + z)

    def batched_step(U, starts, stops):  # (k, M): the same operations, row by row
        z = a * np.abs(t[stops] - t[starts])[:, None]
        return U / (1 - z) if implicit else U * (1 + z)

    u0 = np.broadcast_to(np.asarray(u0, dtype=np.result_type(a, 1.0)), a.shape).copy()
    return Problem(step, u0, n_steps, t=t, batched_step=batched_step)


def laplacian_1d(n_x: int) -> np.ndarray:
    """Second-difference matrix on n_x interior points of (0, 1), Dirichlet: (n_x, n_x)."""
    dx = 1.0 / (n_x + 1)
    return (np.eye(n_x, k=-1) - 2 * np.eye(n_x) + np.eye(n_x, k=1)) / dx**2


def laplacian_1d_eigenvalues(n_x: int) -> np.ndarray:
    """Eigenvalues ``-4 sin²(kπ dx / 2) / dx²``, k = 1..n_x, of :func:`laplacian_1d`."""
    dx = 1.0 / (n_x + 1)
    k = np.arange(1, n_x + 1)
    return -4.0 * np.sin(k * np.pi * dx / 2) ** 2 / dx**2


@dataclass
class _ImplicitEuler:
    """``u ↦ (I - dt ν L)⁻¹ u`` with the inverse cached per step size."""

    L: np.ndarray
    nu: float
    t: np.ndarray
    cache: dict = field(default_factory=dict)

    def inverse(self, dt: float) -> np.ndarray:
        dt = round(dt, 14)
        inv = self.cache.get(dt)
        if inv is None:
            inv = self.cache[dt] = np.linalg.inv(np.eye(len(self.L)) - dt * self.nu * self.L)
        return inv

    def step(self, u, start, stop):
        return self.inverse(abs(self.t[stop] - self.t[start])) @ u

    def batched_step(self, U, starts, stops):
        """Rows ``(I - dt_j ν L)⁻¹ U[j]``, one stacked product per distinct step size.

        ``inv @ U[:, :, None]`` makes NumPy apply the same matrix-vector kernel to every row
        as :meth:`step` does, so results are bit-identical to it and do not depend on how
        rows are grouped into calls (one GEMM ``U @ inv.T`` would be faster for wide states
        but sums in another order: round-off, and a result that changes with the ranks)."""
        dts = np.round(np.abs(self.t[stops] - self.t[starts]), 14)
        out = np.empty_like(U)
        for dt in np.unique(dts):
            rows = dts == dt
            out[rows] = np.matmul(self.inverse(float(dt)), U[rows][:, :, None])[:, :, 0]
        return out


def heat_1d(n_x: int = 100, n_steps: int = 256, T: float = 0.1, nu: float = 1.0) -> Problem:
    """1-D heat equation, backward Euler in time; u0 = sin(πx) + sin(8πx)/2 + a kink."""
    x = np.linspace(0, 1, n_x + 2)[1:-1]
    u0 = np.sin(np.pi * x) + 0.5 * np.sin(8 * np.pi * x) + np.maximum(0, 0.25 - abs(x - 0.3))
    stepper = _ImplicitEuler(laplacian_1d(n_x), float(nu), _uniform(n_steps, T))
    return Problem(stepper.step, u0, n_steps, t=stepper.t, batched_step=stepper.batched_step)


def nonlinear_ode(n_steps: int = 256, T: float = 4.0, dim: int = 4, seed: int = 0) -> Problem:
    """``y' = -y - y³ + sin(2π t)``, forward Euler, random y(0) in [-2, 2]^dim."""
    t = _uniform(n_steps, T)
    u0 = np.random.default_rng(seed).uniform(-2, 2, size=dim)

    def step(u, start, stop):
        dt = t[stop] - t[start]
        return u + dt * (-u - u**3 + np.sin(2 * np.pi * t[start]))

    def batched_step(U, starts, stops):  # (k, dim): the same operations, row by row
        dt = (t[stops] - t[starts])[:, None]
        return U + dt * (-U - U**3 + np.sin(2 * np.pi * t[starts])[:, None])

    return Problem(step, u0, n_steps, t=t, batched_step=batched_step)


@dataclass(frozen=True)
class LinearODE:
    """``y' = K(t) y`` with ``K(t) = -I + ε (A + sin(2πt) B)``, forward Euler with K at the
    left end of each interval; forward and adjoint problems for adjoint tests.

    Forward step ``start → stop``: ``M u``, ``M = I + dt K(t[start])``.
    Adjoint step ``start → stop`` (start > stop): ``Mᵀ λ``, ``M = I + dt K(t[stop])`` — the
    transposed forward step of the same interval (on the fine level exactly Φ_nᵀ).
    """

    n_steps: int
    dim: int = 3
    T: float = 1.0
    seed: int = 0
    eps: float = 0.5

    @cached_property
    def t(self) -> np.ndarray:
        return _uniform(self.n_steps, self.T)

    @cached_property
    def _AB(self) -> np.ndarray:
        return np.random.default_rng(self.seed).standard_normal((2, self.dim, self.dim))

    def K(self, time: float) -> np.ndarray:
        A, B = self._AB
        return -np.eye(self.dim) + self.eps * (A + np.sin(2 * np.pi * time) * B)

    def matrix(self, left: int, right: int) -> np.ndarray:
        """The step matrix of the interval between fine indices left < right."""
        t = self.t
        return np.eye(self.dim) + (t[right] - t[left]) * self.K(t[left])

    def matrices(self, left, right) -> np.ndarray:
        """:meth:`matrix` of k intervals ``left[j] < right[j]`` at once: (k, d, d)."""
        A, B = self._AB
        t = self.t
        tl = t[np.asarray(left)]
        K = -np.eye(self.dim) + self.eps * (A + np.sin(2 * np.pi * tl)[:, None, None] * B)
        return np.eye(self.dim) + (t[np.asarray(right)] - tl)[:, None, None] * K

    def forward_problem(self, u0, g=None) -> Problem:
        def step(u, start, stop):
            return self.matrix(start, stop) @ u

        def batched_step(U, starts, stops):  # (k, d): rows M_j U[j]
            return np.matmul(self.matrices(starts, stops), U[:, :, None])[:, :, 0]

        return Problem(step, np.asarray(u0, dtype=float), self.n_steps, g=g, t=self.t,
                       batched_step=batched_step)

    def adjoint_problem(self, lam_final, g=None) -> Problem:
        def step(lam, start, stop):
            return self.matrix(stop, start).T @ lam

        def batched_step(L, starts, stops):  # (k, d): rows M_jᵀ L[j]
            Ms = self.matrices(stops, starts)
            return np.matmul(np.swapaxes(Ms, 1, 2), L[:, :, None])[:, :, 0]

        return Problem(
            step,
            np.asarray(lam_final, dtype=float),
            self.n_steps,
            g=g,
            t=self.t,
            direction="backward",
            batched_step=batched_step,
        )

    def spacetime_matrix(self) -> np.ndarray:
        """The forward system ``A u = g`` as one ((N+1)d, (N+1)d) matrix (small N only)."""
        N, d = self.n_steps, self.dim
        A = np.eye((N + 1) * d)
        for i in range(1, N + 1):
            A[i * d : (i + 1) * d, (i - 1) * d : i * d] = -self.matrix(i - 1, i)
        return A
