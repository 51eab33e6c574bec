# %% [markdown]
# # Lesson 03 — Parareal is two-level MGRIT
#
# A residual network, an ODE solver and a recurrent net all compute a *time-stepping
# recurrence*
#
#     u[0] = u0,    u[i] = Φ(u[i-1]) + g[i],   i = 1..N,
#
# which looks hopelessly sequential. Parareal (Lions, Maday, Turinici 2001) and MGRIT
# (Falgout et al. 2014, docs/references.md §2) solve it iteratively instead, with most of the work
# parallel over time. This lesson shows that the two are the same algorithm:
#
# * cut the N steps into N/m intervals of m steps (the **C-points** start the intervals, the
#   rest are **F-points**);
# * **F** = m fine steps over an interval (parallel over intervals), **G** = one cheap coarse
#   step of size m·h over the same interval;
# * Parareal's update is `U[j+1] ← G(U[j]) + F(U_old[j]) - G(U_old[j])`, a *sequential* sweep
#   of cheap G steps that corrects the parallel F results.
#
# refbraid's MGRIT knows nothing about Parareal; we write Parareal here in a few lines and
# check that two-level MGRIT with F-relaxation produces *the same iterates*.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/03_parareal_is_two_level_mgrit.py`, it saves
# them to `lesson_figures/03/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import numpy as np
from matplotlib.figure import Figure

from refbraid.lessons import show, small
from refbraid.mgrit import MGRITSettings, sequential_solve, solve
from refbraid.mgrit.plots import plot_error
from refbraid.mgrit.problems import nonlinear_ode

SMALL = small()

N, m = (48, 4) if SMALL else (256, 8)
problem = nonlinear_ode(N, T=N * 0.08 / m, dim=3)  # y' = -y - y³ + sin(2πt), forward Euler
u_seq = sequential_solve(problem)  # the oracle: N steps, one after another
print(f"N = {N} steps, m = {m}: {N // m} intervals; state shape {problem.state_shape}")

# %% [markdown]
# ## Parareal, written out
#
# `F(U, j)` runs the m fine steps of interval j; `G(U, j)` makes one coarse step over it.
# The problem's step function takes fine indices (start, stop), so a coarse step is just
# `step(u, j·m, (j+1)·m)` — the step decides that this means step size m·h.


# %%
def F(u, j):
    for i in range(j * m, (j + 1) * m):
        u = problem.step(u, i, i + 1)
    return u


def G(u, j):
    return problem.step(u, j * m, (j + 1) * m)


def parareal(n_iter):
    """U^0 = G-sweep from u0; U^{k+1}[j+1] = G(U^{k+1}[j]) + F(U^k[j]) - G(U^k[j])."""
    U = [problem.u0]
    for j in range(N // m):
        U.append(G(U[-1], j))
    history = [np.array(U)]
    for _ in range(n_iter):
        fine = [F(U[j], j) for j in range(N // m)]  # parallel over j
        coarse_old = [G(U[j], j) for j in range(N // m)]  # parallel over j
        new = [problem.u0]
        for j in range(N // m):  # the only sequential part: cheap coarse steps
            new.append(G(new[-1], j) + fine[j] - coarse_old[j])
        U = new
        history.append(np.array(U))
    return history


pr = parareal(n_iter=N // m)

# %% [markdown]
# ## The same thing as two-level MGRIT
#
# Two-level MGRIT with F-relaxation does, per iteration (docs/references.md §2):
#
# 1. **F-relaxation**: from every C-point, step through the F-points of its interval
#    (this is `F`, parallel over intervals);
# 2. **residual at C-points**: `r[j+1] = F(U[j]) - U[j+1]`;
# 3. **FAS coarse problem**: `g_Δ[j+1] = r[j+1] + U[j+1] - G(U[j]) = F(U[j]) - G(U[j])`,
#    solved exactly by the coarse sweep `W[j+1] = G(W[j]) + g_Δ[j+1]` — Parareal's update;
# 4. **correction**: `U[C] ← U[C] + (W - U[C]) = W`.
#
# Parareal's initial guess (a G-sweep) is MGRIT's *skipped first down-cycle*
# (`skip_first_down=True`): no relaxation, just the coarse solve interpolated to the fine grid.
# `post_cycle_iterates()` returns the fine iterate after each cycle; its C-points are U^k.

# %%
settings = MGRITSettings(levels=2, cfactor=m, relax="F", skip_first_down=True,
                         abs_tol=None, max_iter=N // m, keep_iterates=True, min_coarse=1)
res = solve(problem, settings)
mgrit_U = [u[::m] for u in res.post_cycle_iterates()]
gap = max(np.abs(a - b).max() for a, b in zip(pr, mgrit_U, strict=True))
print(f"max |Parareal - MGRIT| over all {len(pr)} iterates: {gap:.2e} (round-off)")
print(solve(problem, settings.replace(max_iter=6)))

# %% [markdown]
# The record prints like XBraid: `||r||` is the fine C-point residual, measured after
# relaxation and before the coarse correction (the post-cycle column is PyMGRIT's convention;
# with F-relaxation they coincide). Parareal has a finite-termination property: after k iterations
# the first k intervals are exact (the error propagator is nilpotent), so after N/m iterations
# everything is — which is also why nobody runs it that long: the point is to stop after a
# few iterations, each of which costs about two sequential coarse sweeps plus one parallel
# fine sweep.

# %%
errors = [np.abs(u - u_seq).max() for u in res.post_cycle_iterates()]
exact_after = next(k for k, e in enumerate(errors) if e < 1e-12)
print(f"error below 1e-12 after {exact_after} iterations (bound: N/m = {N // m})")

# %% [markdown]
# ## F- versus FCF-relaxation
#
# MGRIT adds a choice Parareal does not have: relax with **FCF** (F, then update every C-point
# from its predecessor, then F again). Each iteration costs one more fine sweep but usually
# needs far fewer iterations — the two-level theory of lesson 04 says by how much.

# %%
fcf = solve(problem, settings.replace(relax="FCF", abs_tol=1e-10, max_iter=50))
f_only = solve(problem, settings.replace(abs_tol=1e-10, max_iter=50))
for name, r in (("F (Parareal)", f_only), ("FCF", fcf)):
    print(f"{name:<13} iterations {r.iterations:>3}   fine steps {r.step_counts[0]:>6}"
          f"   coarse steps {r.step_counts[1]:>5}   (sequential: {N})")

fig = Figure(figsize=(10, 4), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
for name, r in (("F (Parareal)", f_only), ("FCF", fcf)):
    ax1.semilogy(r.iteration_numbers, r.norms, "o-", label=name)
ax1.set_xlabel("iteration")
ax1.set_ylabel("fine C-point residual")
ax1.set_title("F vs FCF relaxation")
ax1.legend()
ax2.semilogy(range(len(errors)), np.maximum(errors, 1e-17), "s-")
ax2.axvline(N // m, color="0.5", ls="--", label="N/m")
ax2.set_xlabel("Parareal / MGRIT iteration k")
ax2.set_ylabel("max error vs sequential")
ax2.set_title("finite termination")
ax2.legend()
show(fig, "03_f_vs_fcf")
show(plot_error(res, u_seq), "03_error_over_time")

# %%
assert gap < 1e-12, "Parareal and two-level MGRIT with F-relaxation must agree"
assert exact_after <= N // m
assert fcf.converged and fcf.iterations < f_only.iterations


# %% [markdown]
# ## Exercise: F-relaxation
#
# Write F-relaxation on the fine grid: given an iterate `u` (N+1, d), the step function
# `step(u_prev, start, stop)` and the cfactor `m`, return a new array in which every F-point
# `k` (`k % m ≠ 0`) is recomputed, in increasing order, from the value just before it:
# `u[k] = step(u[k-1], k-1, k)`; C-points keep their values. The check compares with
# refbraid's `mgrit.relax.f_relax` and names the first point that differs (and whether it is
# an F- or a C-point).

# %%
from refbraid.lessons import exercises


def f_relaxation(u, step, m):
    """Return a copy of u with every F-point k (k % m != 0) set to step(u[k-1], k-1, k)."""
    raise NotImplementedError  # your code here


exercises.check_f_relaxation(f_relaxation)
