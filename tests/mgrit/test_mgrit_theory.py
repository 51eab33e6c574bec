"""Two-level theory (docs/references.md §3) against the exact propagator and the solver itself.

Chain of oracles, each explaining the next:
    observed per-iteration reduction  ≤  ‖E‖₂ (exact matrix)  ≤  bound (Σ|diagonals| = ‖E‖_∞)
and the solver's own one-iteration propagator, measured column by column, IS that matrix.
"""

import numpy as np
import pytest

from refbraid.mgrit import MGRITSettings, sequential_solve, solve
from refbraid.mgrit.problems import dahlquist
from refbraid.mgrit.theory import (
    dahlquist_eigenvalues,
    measured_propagator,
    propagator_norm,
    two_level_bound,
    two_level_propagator,
)

Z_VALUES = (-0.02, -0.1, -0.3, -0.6)  # a·h, stable fine steps for both schemes
MS = (2, 4)


def _references_formula(lam, mu, m, n_delta, relax):
    """The bound in its N_Δ form (exponents N_Δ and N_Δ - 1; docs/references.md §3, note)."""
    d, amu = abs(lam**m - mu), abs(mu)
    if relax == "F":
        return d * (1 - amu**n_delta) / (1 - amu)
    return abs(lam) ** m * d * (1 - amu ** (n_delta - 1)) / (1 - amu)


@pytest.mark.parametrize("scheme", ["forward", "backward"])
@pytest.mark.parametrize("relax", ["F", "FCF"])
def test_bound_matches_the_exact_propagator(scheme, relax):
    for z in Z_VALUES:
        for m in MS:
            lam, mu = dahlquist_eigenvalues(z, m, scheme)
            if abs(mu) >= 1:
                continue  # the geometric bound needs a stable coarse step
            for n_c in (2, 5, 12):
                E = two_level_propagator(lam, mu, m, n_c, relax)
                b = two_level_bound(lam, mu, m, n_c, relax)
                where = f"{scheme} Euler z={z} m={m} n_c={n_c} {relax}"
                assert np.allclose(E, np.tril(E, -1)), where  # strictly lower triangular
                assert np.abs(np.linalg.matrix_power(E, n_c)).max() < 1e-15, where  # nilpotent
                np.testing.assert_allclose(b, np.abs(E).sum(axis=1).max(), rtol=1e-12, atol=0,
                                           err_msg=where)  # bound = ‖E‖_∞ exactly
                assert np.linalg.norm(E, 2) <= b * (1 + 1e-12), where
                assert b <= _references_formula(lam, mu, m, n_c, relax) * (1 + 1e-12), where
                assert b <= two_level_bound(lam, mu, m, None, relax) * (1 + 1e-12), where


@pytest.mark.parametrize("relax", ["F", "FCF"])
@pytest.mark.parametrize("scheme", ["forward", "backward"])
def test_solver_propagator_is_the_theory_matrix(relax, scheme):
    n_c = 5
    for z in (-0.1, -0.5):
        for m in MS:
            lam, mu = dahlquist_eigenvalues(z, m, scheme)

            def step(u, a, b, lam=lam, mu=mu):
                return u * (lam if b - a == 1 else mu)

            s = MGRITSettings(levels=2, cfactor=m, relax=relax, min_coarse=1)
            E_solver = measured_propagator(step, m * n_c, s, state_shape=(1,))
            E_theory = two_level_propagator(lam, mu, m, n_c, relax)
            np.testing.assert_allclose(E_solver, E_theory, rtol=0, atol=1e-15,
                                       err_msg=f"{scheme} z={z} m={m} {relax}")


@pytest.mark.parametrize("scheme", ["forward", "backward"])
@pytest.mark.parametrize("relax", ["F", "FCF"])
@pytest.mark.parametrize("m", MS)
def test_observed_reduction_never_exceeds_the_bound(scheme, relax, m):
    """Dahlquist y' = a y with several modes a·h at once (state = modes): error and residual
    reductions per iteration stay below max over modes of ‖E‖₂, itself below the bound."""
    n_c = 10
    n = m * n_c
    a = np.array(Z_VALUES) * n  # T = 1, h = 1/n  →  a·h = Z_VALUES
    problem = dahlquist(a, n, T=1.0, scheme=scheme, u0=1.0)
    lam, mu = dahlquist_eigenvalues(np.array(Z_VALUES), m, scheme)
    keep = np.abs(mu) < 1
    sharp = propagator_norm(lam[keep], mu[keep], m, n_c, relax)
    bound = two_level_bound(lam[keep], mu[keep], m, n_c, relax)
    assert sharp <= bound * (1 + 1e-12)
    problem = dahlquist(a[keep], n, T=1.0, scheme=scheme)
    seq = sequential_solve(problem)
    s = MGRITSettings(levels=2, cfactor=m, relax=relax, abs_tol=None, max_iter=6,
                      keep_iterates=True, min_coarse=1)
    res = solve(problem, s)
    c = np.arange(m, n + 1, m)
    err = [np.linalg.norm(u[c] - seq[c]) for u in res.post_cycle_iterates()]
    observed = (("error", err), ("residual", res.norms), ("post-cycle", res.post_cycle_norms))
    for label, seqs in observed:
        for k in range(len(seqs) - 1):
            if seqs[k] < 1e-12:
                break  # round-off level: ratios mean nothing
            assert seqs[k + 1] <= sharp * seqs[k] * (1 + 1e-9) + 1e-15, (
                f"{label} reduction {seqs[k + 1] / seqs[k]:.4g} > ‖E‖₂ = {sharp:.4g} at k={k} "
                f"({scheme} Euler, m={m}, {relax})"
            )


def test_theory_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="`m`"):
        two_level_bound(0.9, 0.8, 1)
    with pytest.raises(ValueError, match="`relax`"):
        two_level_bound(0.9, 0.8, 2, 4, relax="FF")
    with pytest.raises(ValueError, match="`n_coarse`"):
        two_level_propagator(0.9, 0.8, 2, 0)
    with pytest.raises(ValueError, match="`scheme`"):
        dahlquist_eigenvalues(-0.1, 2, "rk4")
    assert two_level_bound(0.9, 1.2, 2) == np.inf  # unstable coarse step: no finite n_c → ∞ bound
