"""Exercise checks on MGRIT (lessons 03, 04, 05): F-relaxation, the two-level convergence
factor, and MGRIT settings for an accurate layer-parallel gradient at the lowest cost.

The oracles are refbraid's own solver pieces: ``refbraid.mgrit.relax.f_relax``, the two-level
theory ``refbraid.mgrit.theory`` (``‖E‖₂`` of the exact error propagator) and the measured
gradient error and step count of ``refbraid.layer_parallel.layer_parallel_gradient``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..data import load_peaks
from ..layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from ..mgrit.problems import nonlinear_ode
from ..mgrit.relax import f_relax
from ..mgrit.theory import dahlquist_eigenvalues, propagator_norm, two_level_bound
from ..models import build_network
from ..network import backprop, init_params
from .checking import Verdict, Wrong, call, run_check

TOL = 1e-10
FACTOR_TOL = 1e-6  # relative: ‖E‖₂ from an SVD or a power iteration both reach this

# ----------------------------------------------------------------------------- lesson 03


def check_f_relaxation(f_relaxation: Callable, quiet: bool = False) -> Verdict:
    """Lesson 03: ``f_relaxation(u, step, m)`` → a new array (N+1, d) in which every F-point
    (index not a multiple of ``m``) is recomputed in increasing order,
    ``u[k] = step(u[k-1], k-1, k)``, from the value just computed before it; C-points keep
    their values."""

    def body() -> str:
        N, m = 24, 4
        problem = nonlinear_ode(N, T=2.0, dim=3, seed=3)
        u = np.random.default_rng(3).uniform(-1, 1, (N + 1, 3))  # an iterate: any values
        f_points = [k for k in range(1, N + 1) if k % m]
        expected = f_relax(u, np.zeros_like(u), np.arange(N + 1), f_points, problem.step)
        got = call(f_relaxation, u.copy(), problem.step, m)
        got = np.asarray(got, dtype=float) if hasattr(got, "__len__") else got
        if not isinstance(got, np.ndarray) or got.shape != u.shape:
            raise Wrong(f"return the relaxed iterate, shape {u.shape}; got "
                        f"{getattr(got, 'shape', type(got).__name__)}")
        error = np.abs(got - expected).max(axis=1) / np.abs(expected).max()  # per point
        bad = np.flatnonzero(~(error <= TOL))
        if bad.size:
            k = int(bad[0])
            kind = ("a C-point: F-relaxation must leave it as it was" if k % m == 0 else
                    f"F-point {k % m} of interval {k // m}, computed from point {k - 1}")
            raise Wrong(f"point {k} ({kind}): yours {np.array2string(got[k], precision=4)} vs "
                        f"expected {np.array2string(expected[k], precision=4)} (rel err "
                        f"{error[k]:.1e}); {bad.size} of {N + 1} points differ")
        return (f"all {len(f_points)} F-points of N = {N}, m = {m} match refbraid's f_relax "
                f"and the C-points are untouched (max rel err {error.max():.1e})")

    return run_check("03 F-relaxation", body, quiet)


# ----------------------------------------------------------------------------- lesson 04
FACTOR_CASES = (  # (z = a·h, m, n_c, relax): stiff and non-stiff modes, both relaxations
    (-0.05, 4, 16, "F"), (-0.05, 4, 16, "FCF"), (-1.0, 2, 8, "F"), (-1.0, 8, 8, "FCF"),
    (-10.0, 4, 32, "F"), (-0.5, 16, 4, "FCF"),
)


def check_two_level_factor(two_level_factor: Callable, quiet: bool = False) -> Verdict:
    """Lesson 04: ``two_level_factor(z, m, n_c, relax)`` → the predicted error reduction per
    iteration ``‖E‖₂`` of two-level MGRIT with ``relax`` ('F' or 'FCF') for one mode of
    ``y' = a y``, backward Euler, ``z = a h``, cfactor ``m``, ``n_c`` coarse points."""

    def body() -> str:
        worst = 0.0
        for z, m, n_c, relax in FACTOR_CASES:
            lam, mu = dahlquist_eigenvalues(z, m, "backward")
            expected = propagator_norm(lam, mu, m, n_c, relax)
            got = call(two_level_factor, z, m, n_c, relax)
            try:
                got = float(got)
            except (TypeError, ValueError):
                raise Wrong(f"return one number, got {type(got).__name__}") from None
            err = abs(got - expected) / max(abs(expected), 1e-300)
            if not err <= FACTOR_TOL:
                hint = ""
                if abs(got - two_level_bound(lam, mu, m, n_c, relax)) <= 1e-9 * abs(got):
                    hint = ("; yours is the upper bound (sum of the diagonals), not the 2-norm "
                            "of E itself")
                raise Wrong(f"z = {z:g}, m = {m}, n_c = {n_c}, relax {relax}: yours {got:.6g} "
                            f"vs ‖E‖₂ = {expected:.6g} (rel err {err:.1e}){hint}")
            worst = max(worst, err)
        return (f"‖E‖₂ right in all {len(FACTOR_CASES)} cases (max rel err {worst:.1e}), F "
                f"and FCF, stiff and smooth modes")

    return run_check("04 two-level convergence factor", body, quiet)


# ----------------------------------------------------------------------------- lesson 05
GRADIENT_TOL = 1e-3  # the target: relative gradient error against backprop
BUDGET_LAYERS, BUDGET_WIDTH, BUDGET_BATCH = 64, 8, 32


def gradient_cost(settings: LayerParallelSettings) -> tuple[float, int]:
    """(relative gradient error vs backprop, Φ applications of both solves) of ``settings``
    on the exercise's network: Peaks, 64 tanh layers of width 8, T = 3, one batch of 32."""
    data = load_peaks(200, seed=0)
    net = build_network("resnet", data.input_shape, data.n_classes, BUDGET_LAYERS,
                        BUDGET_WIDTH, 3.0, "tanh")
    params = init_params(net, 0)
    x, labels = data.x_train[:BUDGET_BATCH], data.y_train[:BUDGET_BATCH]
    _, exact, _ = backprop(net, params, x, labels)
    _, grads, info = layer_parallel_gradient(net, params, x, labels, settings)
    return relative_gradient_error(grads, exact), int(info.stats()["phi_calls"])


def check_gradient_settings(settings, quiet: bool = False) -> Verdict:
    """Lesson 05: ``settings`` (a LayerParallelSettings) must keep the gradient error under
    1e-3 on the exercise network (:func:`gradient_cost`) with no more step applications
    than the reference solution (``refbraid.lessons.solutions.gradient_settings``)."""
    from .solutions import gradient_settings

    def body() -> str:
        if not isinstance(settings, LayerParallelSettings):
            raise Wrong(f"pass a LayerParallelSettings, got {type(settings).__name__}")
        try:
            error, cost = gradient_cost(settings)
        except Exception as err:  # e.g. too many levels, a diverging solve: the student's
            raise Wrong(f"these settings fail on a {BUDGET_LAYERS}-layer network: "
                        f"{type(err).__name__}: {err}") from None
        _, budget = gradient_cost(gradient_settings())
        if not error <= GRADIENT_TOL:
            raise Wrong(f"gradient error {error:.2e} > {GRADIENT_TOL:g} ({cost} step "
                        f"applications): more iterations, or a smaller cfactor / more FCF")
        if cost > budget:
            raise Wrong(f"gradient error {error:.2e} <= {GRADIENT_TOL:g}, but {cost} step "
                        f"applications: the reference solution needs {budget}; fewer "
                        f"iterations, levels or relaxation sweeps")
        return (f"gradient error {error:.2e} <= {GRADIENT_TOL:g} with {cost} step applications "
                f"(reference solution: {budget})")

    return run_check("05 MGRIT settings for a 1e-3 gradient", body, quiet)
