"""Two-level MGRIT convergence theory for a linear problem, one eigenmode at a time.

Setting (Dobrev, Kolev, Petersson, Schroder 2017; Southworth 2019; docs/references.md §3): fine
and coarse steps share eigenvectors; for one mode the fine step multiplies by ``λ``, the coarse
step by ``μ``; cfactor ``m``; ``n_c`` coarse unknowns (C-points t_1..t_{n_c}; t_0 is given).
With ``S`` the down-shift on the C-points::

    A_Δ = I - λ^m S        (ideal coarse operator: m fine steps per coarse step)
    B_Δ = I - μ S          (re-discretised coarse operator: one coarse step)
    E_F   = I - B_Δ⁻¹ A_Δ
    E_FCF = (I - B_Δ⁻¹ A_Δ)(I - A_Δ)

Both are strictly lower-triangular Toeplitz (nilpotent: spectral radius 0, so compare
observed reductions with ``‖E‖₂``). From ``B_Δ⁻¹ = Σ μ^k S^k``::

    E_F   = -(μ - λ^m) Σ_{k≥1} μ^{k-1} S^k           E_FCF = -λ^m (μ - λ^m) Σ_{k≥2} μ^{k-2} S^k

and, with ``δ = |λ^m - μ|``, the 2-norm is at most the sum of the absolute diagonals (which
is exactly ``‖E‖_∞ = ‖E‖_1`` of the n_c × n_c matrix)::

    ‖E_F‖₂   ≤ δ · Σ_{k=0}^{n_c-2} |μ|^k          = δ (1 - |μ|^{n_c-1}) / (1 - |μ|)
    ‖E_FCF‖₂ ≤ |λ|^m δ · Σ_{k=0}^{n_c-3} |μ|^k    = |λ|^m δ (1 - |μ|^{n_c-2}) / (1 - |μ|)
    n_c → ∞:   δ / (1 - |μ|)   and   |λ|^m δ / (1 - |μ|)

Note: the bound is often written with the exponents ``N_Δ`` and ``N_Δ - 1`` (docs/references.md
§3 gives both). That is the same sum for a matrix with one more row (t_0 counted as an unknown);
since the sums grow with the size it is a valid but slightly looser bound for the ``n_c``
unknowns here. The functions below
use the exact diagonal sum; the tests check both.

Dahlquist ``y' = a y`` with ``z = a h``: forward Euler ``λ = 1 + z, μ = 1 + m z``; backward
Euler ``λ = 1/(1 - z), μ = 1/(1 - m z)``.

Shape legend: n_c coarse unknowns, M modes, d state size.
"""

from __future__ import annotations

import numpy as np

from .grid import build_hierarchy
from .problem import Problem
from .settings import MGRITSettings

SCHEMES = ("forward", "backward")


def _check(m: int, n_coarse, relax: str) -> None:
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 2:
        raise ValueError(f"`m` (cfactor) must be an integer >= 2, got {m!r}.")
    if n_coarse is not None and (not isinstance(n_coarse, (int, np.integer)) or n_coarse < 1):
        raise ValueError(
            f"`n_coarse` must be a positive integer or None (n_c → ∞), got {n_coarse!r}."
        )
    if relax not in ("F", "FCF"):
        raise ValueError(f"`relax` must be 'F' or 'FCF', got {relax!r}.")


def dahlquist_eigenvalues(z, m: int, scheme: str = "backward"):
    """Fine and coarse step multipliers ``(λ, μ)`` of ``y' = a y`` with ``z = a h`` (arrays ok)."""
    z = np.asarray(z)
    if scheme == "forward":
        return 1 + z, 1 + m * z
    if scheme == "backward":
        return 1 / (1 - z), 1 / (1 - m * z)
    raise ValueError(f"`scheme` must be one of {SCHEMES}, got {scheme!r}.")


def _geometric(x, n_terms):
    """Σ_{k=0}^{n_terms-1} x^k for x ≥ 0 (elementwise), 0 when n_terms ≤ 0."""
    k = np.arange(max(int(n_terms), 0))
    return np.sum(np.asarray(x)[..., None] ** k, axis=-1)


def two_level_bound(lam, mu, m: int, n_coarse: int | None = None, relax: str = "F") -> float:
    """Upper bound on ``‖E‖₂`` (sum of |diagonals|), maximised over the modes ``(λ, μ)``.

    F:   δ Σ_{k=0}^{n_c-2} |μ|^k,   FCF: |λ|^m δ Σ_{k=0}^{n_c-3} |μ|^k,   δ = |λ^m - μ|;
    ``n_coarse=None`` gives the n_c → ∞ limits δ/(1-|μ|), |λ|^m δ/(1-|μ|) (inf if |μ| ≥ 1).
    """
    _check(m, n_coarse, relax)
    lam, mu = np.broadcast_arrays(np.asarray(lam), np.asarray(mu))
    delta = np.abs(lam**m - mu)
    amu = np.abs(mu)
    if n_coarse is None:
        series = np.full(amu.shape, np.inf)
        np.divide(1.0, 1.0 - amu, out=series, where=amu < 1)
    else:
        series = _geometric(amu, n_coarse - (1 if relax == "F" else 2))
    factor = 1.0 if relax == "F" else np.abs(lam) ** m
    bound = factor * delta * series
    bound = np.where(delta == 0, 0.0, bound)
    return float(np.max(bound))


def two_level_propagator(lam, mu, m: int, n_coarse: int, relax: str = "F") -> np.ndarray:
    """The exact two-level error propagator on the C-points of one mode: (n_c, n_c)."""
    _check(m, n_coarse, relax)
    if n_coarse is None:
        raise ValueError("`n_coarse` must be a positive integer for a matrix.")
    S = np.eye(n_coarse, k=-1)
    identity = np.eye(n_coarse)
    A = identity - lam**m * S
    B = identity - mu * S
    E = identity - np.linalg.solve(B, A)
    return E @ (identity - A) if relax == "FCF" else E


def propagator_norm(lam, mu, m: int, n_coarse: int, relax: str = "F") -> float:
    """Max over modes of ``‖E‖₂`` of :func:`two_level_propagator` (sharp per-iteration factor)."""
    lam, mu = np.broadcast_arrays(np.atleast_1d(lam), np.atleast_1d(mu))
    return max(
        float(np.linalg.norm(two_level_propagator(a, b, m, n_coarse, relax), 2))
        for a, b in zip(lam.ravel(), mu.ravel(), strict=False)
    )


def measured_propagator(
    step, n_steps: int, settings: MGRITSettings, state_shape: tuple[int, ...] = ()
) -> np.ndarray:
    """The error propagator of one iteration of *this solver*, measured column by column.

    For a linear homogeneous ``step`` (Φ(0) = 0) the exact solution with u0 = 0 is zero, so an
    initial guess ``e`` at the fine C-points (zero at F-points) is the error. Column j of
    ``E`` is the C-point part of the iterate right after one cycle started from the unit
    vector ``e_j`` (n_c·d, n_c·d). For two levels it equals :func:`two_level_propagator`.
    """
    s = settings.replace(
        max_iter=1,
        abs_tol=None,
        rel_tol=None,
        keep_iterates=True,
        keep_residuals=False,
        skip_first_down=False,
        fmg=False,
        on_divergence="flag",
    )
    problem = Problem(step, np.zeros(state_shape), n_steps)
    c_pts = build_hierarchy(n_steps, s.cfactors, s.min_coarse)[0].c_points[1:]
    d = int(np.prod(state_shape, dtype=int))
    n = len(c_pts) * d
    E = np.zeros((n, n))
    from .solver import solve

    for j in range(n):
        u_init = np.zeros((n_steps + 1, *state_shape))
        u_init.reshape(n_steps + 1, d)[c_pts[j // d], j % d] = 1.0
        after = solve(problem, s, u_init=u_init).post_cycle_iterates()[1]
        E[:, j] = np.asarray(after)[c_pts].reshape(n)
    return E
