# %% [markdown]
# # Lesson 04 — Multilevel MGRIT, and the theory that predicts it
#
# Lesson 03 showed that two-level MGRIT with F-relaxation is Parareal. Here we
#
# 1. predict the two-level convergence factor of a linear problem *before* running it
#    (Dobrev et al. 2017, Southworth 2019; docs/references.md §3), check the prediction against
#    the solver, and see which modes limit convergence;
# 2. go multilevel: recurse on the coarse problem (V- and F-cycles), look at the residual of
#    every level, and compare the cost with the sequential solve.
#
# The model problem is the 1-D heat equation `y' = ν y_xx` with backward Euler in time. Its
# spatial operator is symmetric, so it has orthonormal eigenvectors, and for each eigenvalue
# `ℓ_k` a fine step multiplies that mode by `λ_k = 1/(1 - h ν ℓ_k)` and a coarse step by
# `μ_k = 1/(1 - m h ν ℓ_k)`.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/04_multilevel_mgrit_and_theory.py`, it saves
# them to `lesson_figures/04/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import numpy as np
from matplotlib.figure import Figure

from refbraid.lessons import show, small
from refbraid.mgrit import MGRITSettings, sequential_solve, solve
from refbraid.mgrit.plots import plot_hierarchy, plot_residual_heatmap, plot_residual_history
from refbraid.mgrit.problems import heat_1d, laplacian_1d_eigenvalues
from refbraid.mgrit.theory import (
    dahlquist_eigenvalues,
    measured_propagator,
    propagator_norm,
    two_level_bound,
    two_level_propagator,
)

SMALL = small()

n_x, N, m, T, nu = (16, 64, 4, 0.05, 1.0) if SMALL else (48, 512, 8, 0.05, 1.0)
problem = heat_1d(n_x=n_x, n_steps=N, T=T, nu=nu)
u_seq = sequential_solve(problem)
h, n_c = T / N, N // m
z = h * nu * laplacian_1d_eigenvalues(n_x)  # one z = a·h per spatial mode
lam, mu = dahlquist_eigenvalues(z, m, "backward")
print(f"heat equation: n_x = {n_x} modes, N = {N} steps, m = {m}, a·h from {z.max():.3g} "
      f"to {z.min():.3g}")

# %% [markdown]
# ## The two-level error propagator
#
# On the C-points, one two-level iteration maps the error `e` to `E e` with
# (`S` = shift down by one coarse point, `n_c` coarse unknowns)
#
#     A_Δ = I - λ^m S,   B_Δ = I - μ S,
#     E_F = I - B_Δ⁻¹ A_Δ,          E_FCF = (I - B_Δ⁻¹ A_Δ)(I - A_Δ).
#
# These matrices are nilpotent (spectral radius 0!), so the per-iteration factor is their
# 2-norm, and it is bounded by the sum of the absolute diagonals:
#
#     ‖E_F‖ ≤ |λ^m - μ| (1 - |μ|^{n_c-1}) / (1 - |μ|),    ‖E_FCF‖ ≤ |λ|^m × the same with n_c-2.
#
# The solver's actual one-iteration propagator, measured column by column on a single mode,
# is that matrix:

# %%
k = n_x // 2  # a middle mode


def one_mode_step(u, start, stop):
    return u * (lam[k] if stop - start == 1 else mu[k])


for relax in ("F", "FCF"):
    s = MGRITSettings(levels=2, cfactor=m, relax=relax, min_coarse=1)
    E_solver = measured_propagator(one_mode_step, m * 8, s, state_shape=(1,))
    E_theory = two_level_propagator(lam[k], mu[k], m, 8, relax)
    print(f"{relax:>3}: max |E_solver - E_theory| = {np.abs(E_solver - E_theory).max():.1e}")

# %% [markdown]
# ## Prediction versus observation, all modes at once
#
# With orthonormal eigenvectors the 2-norm of the space-time error splits over modes, so the
# predicted factor of the whole problem is the worst mode's `‖E_k‖₂`. We measure the C-point
# error after each cycle against the sequential solution.

# %%
observed, sharp, bound, limit, runs = {}, {}, {}, {}, {}
c_pts = np.arange(m, N + 1, m)
for relax in ("F", "FCF"):
    sharp[relax] = propagator_norm(lam, mu, m, n_c, relax)
    bound[relax] = two_level_bound(lam, mu, m, n_c, relax)
    limit[relax] = two_level_bound(lam, mu, m, None, relax)
    s = MGRITSettings(levels=2, cfactor=m, relax=relax, abs_tol=None, max_iter=5,
                      keep_iterates=True, min_coarse=1)
    runs[relax] = res = solve(problem, s)
    err = [np.linalg.norm(u[c_pts] - u_seq[c_pts]) for u in res.post_cycle_iterates()]
    ratios = [b / a for a, b in zip(err, err[1:], strict=False) if a > 1e-13]
    observed[relax] = max(ratios)

print(f"{'relax':>5} {'observed max':>13} {'‖E‖₂ (sharp)':>13} {'bound':>10} {'n_c → ∞':>10}")
for relax in ("F", "FCF"):
    print(f"{relax:>5} {observed[relax]:>13.4f} {sharp[relax]:>13.4f} {bound[relax]:>10.4f} "
          f"{limit[relax]:>10.4f}")

# %% [markdown]
# Which modes are slow? Plot `‖E_k‖₂` and the bound per mode against `|a h|`: the smooth,
# slowly decaying modes (small |a h|) are propagated well by the coarse step; the stiff ones
# are damped by both steps; the trouble sits in between, where `λ^m` and `μ` differ most.
# FCF multiplies by `|λ|^m`, which kills the stiff half.

# %%
per_mode = {
    relax: [propagator_norm(a, b, m, n_c, relax) for a, b in zip(lam, mu, strict=True)]
    for relax in ("F", "FCF")
}
theory_fig = Figure(figsize=(10, 4), layout="constrained")
ax1, ax2 = theory_fig.subplots(1, 2)
for relax, style in (("F", "o-"), ("FCF", "s-")):
    ax1.loglog(-z, per_mode[relax], style, ms=3, label=f"‖E_{relax}‖₂ per mode")
    ax1.loglog(-z, [two_level_bound(a, b, m, n_c, relax) for a, b in zip(lam, mu, strict=True)],
               ":", color=ax1.lines[-1].get_color(), label=f"bound ({relax})")
    ax1.axhline(observed[relax], color=ax1.lines[-1].get_color(), lw=0.8, ls="--")
ax1.set_xlabel("|a h| of the mode")
ax1.set_ylabel("two-level factor")
ax1.set_title("per-mode theory (dashed: observed max)")
ax1.legend(fontsize=7)
for relax in ("F", "FCF"):
    r = runs[relax]
    ax2.plot(r.iteration_numbers[1:], r.conv_factors[1:], "o-", label=f"observed ({relax})")
    ax2.axhline(sharp[relax], color=ax2.lines[-1].get_color(), ls="--", label=f"‖E‖₂ ({relax})")
ax2.set_xlabel("iteration")
ax2.set_ylabel("residual convergence factor")
ax2.set_title("observed vs predicted")
ax2.legend(fontsize=7)
show(theory_fig, "04_theory")

# %% [markdown]
# ## Going multilevel
#
# The coarse problem of two-level MGRIT is itself a time-stepping problem, `N/m` steps long —
# still sequential. Multilevel MGRIT solves it approximately with the same method,
# recursively: a **V-cycle** visits each coarse level once per iteration, an **F-cycle**
# visits coarse levels more often (an F-cycle, then a V-cycle, on each coarse problem). Only
# the coarsest level is solved sequentially, so its length (not N) bounds the serial part.
#
# Common practice (and TorchBraid's default) relaxes with F on the finest level and FCF on the
# coarse ones. The two-level bound is not a guarantee for more levels, but it is a good guide.

# %%
print(f"{'levels':>6} {'cycle':>5} {'relax':>10} {'iters':>5} {'max factor':>10} "
      f"{'steps ÷ N':>9} {'coarsest':>8}")
table = []
for levels in (2, 3, 4):
    for cycle in ("V", "F"):
        relax = tuple("F" if lvl == 0 else "FCF" for lvl in range(levels - 1))
        s = MGRITSettings(levels=levels, cfactor=m if levels == 2 else 4, relax=relax,
                          cycle=cycle, rel_tol=1e-10, abs_tol=None, max_iter=60, min_coarse=1)
        r = solve(problem, s)
        table.append((levels, cycle, r))
        print(f"{levels:>6} {cycle:>5} {'/'.join(relax):>10} {r.iterations:>5} "
              f"{np.nanmax(r.conv_factors[1:]):>10.3f} {r.total_steps / N:>9.1f} "
              f"{r.hierarchy.coarsest.n_intervals:>8}")

# %% [markdown]
# Every level's residual can be inspected: below, the fine residual and the FAS residual of
# each coarse level per iteration, and the residual over time × iteration (the error front
# travels forward in time, one coarse interval or more per iteration).

# %%
deep = solve(problem, MGRITSettings(levels=3, cfactor=4, relax=("F", "FCF"), cycle="V",
                                    rel_tol=1e-10, abs_tol=None, max_iter=60, min_coarse=1))
print(deep)
show(plot_residual_history(deep), "04_residuals")
show(plot_residual_heatmap(deep), "04_heatmap")
show(plot_hierarchy(deep, max_points=64), "04_hierarchy")

# %%
for relax in ("F", "FCF"):
    assert observed[relax] <= sharp[relax] * (1 + 1e-9) <= bound[relax] * (1 + 1e-9)
assert all(r.converged for _, _, r in table) and deep.converged
np.testing.assert_allclose(deep.solution, u_seq, rtol=0, atol=1e-8 * np.abs(u_seq).max())


# %% [markdown]
# ## Exercise: predict the two-level convergence factor
#
# Predict how much one two-level iteration reduces the error of one mode of `y' = a y`,
# backward Euler, `z = a h`: build `λ = 1/(1 − z)`, `μ = 1/(1 − m z)`, the `n_c × n_c` matrices
# `A = I − λ^m S`, `B = I − μ S` (`S` the down-shift), `E_F = I − B⁻¹A`,
# `E_FCF = E_F (I − A)`, and return `‖E‖₂`. The check compares with
# `refbraid.mgrit.theory.propagator_norm` on six modes, stiff and smooth, F and FCF — and
# tells you if you returned the bound (the sum of the diagonals) instead.

# %%
from refbraid.lessons import exercises


def two_level_factor(z, m, n_c, relax):
    """‖E‖₂ of two-level MGRIT ('F' or 'FCF') for one backward-Euler mode, z = a h."""
    raise NotImplementedError  # your code here


exercises.check_two_level_factor(two_level_factor)
