# %% [markdown]
# # Lesson 00 — The idea in one page, and how to use this course
#
# **A ResNet is an ODE solver.** A residual layer updates its state by a small step,
#
#     y[n+1] = y[n] + h·σ(W[n] y[n] + b[n]),        n = 0..N−1,
#
# which is exactly one step of *forward Euler* for the ODE `y'(t) = σ(W(t) y + b(t))` with
# step size `h = T/N`: the layers are time steps, depth is time. Forward Euler's error at
# `t = T` is proportional to `h`, so doubling the depth halves it (first order) — the first
# figure shows this on the smallest ODE there is, `y' = −y`.
#
# **MGRIT solves all layers at once.** Computed layer by layer, `y[n+1]` must wait for
# `y[n]`: N sequential steps, however many processors there are. Multigrid reduction in time
# (MGRIT) instead treats the whole trajectory `y[0..N]` as one system of equations and
# improves a guess of *all* of it per iteration: fine steps inside intervals of m layers run
# in parallel (one processor per interval), and one cheap coarse step of size `m·h` per
# interval carries information across the whole depth. A few iterations get close to the
# layer-by-layer answer — the second figure — and backprop, the same kind of recurrence run
# backwards, is solved the same way. That is *layer-parallel training*: the lessons derive it
# step by step (01 ResNet = Euler, 02 backprop = adjoint, 03–04 MGRIT, 05 training, 06 MPI,
# then transformers, GRUs, where it pays off, coarsening, bias, and checking your own code).
#
# **Install** (once, from the refbraid checkout):
#
#     python3 -m venv .venv && .venv/bin/pip install -e ".[data,mpi,lessons]" jupyterlab
#
# **Open the course**: `refbraid lessons build --small && jupyter lab lesson_notebooks/`
# executes every lesson into a notebook with its outputs and figures; or open a script itself
# (JupyterLab: right-click `lessons/NN_*.py` → *Open With → Notebook*; VS Code: *Run Cell*
# above any `# %%`). `refbraid lessons list` lists the lessons; `refbraid lessons build 03`
# builds one. **As a script**: `python lessons/01_resnet_is_forward_euler.py` saves the
# figures to `lesson_figures/01/` (`REFBRAID_LESSON_FIGURES=DIR` picks another folder);
# `REFBRAID_LESSON_SMALL=1` runs any lesson at small sizes, in seconds. A laptop CPU is enough.

# %%
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

import refbraid
from refbraid.layer_parallel import mgrit_forward
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.lessons import exercises, figure_folder, in_notebook, show, small
from refbraid.lessons.notebooks import find_lessons
from refbraid.mgrit import MGRITSettings

SMALL = small()
print(f"small sizes: {SMALL};  inside a notebook: {in_notebook()}")
if not in_notebook():
    print(f"figures of this lesson go to {figure_folder('00_how_to_use_this_course')}/")
for lesson in find_lessons():
    print(f"{lesson.number}  {lesson.title}")

# %% [markdown]
# ## Figure 1: depth is time, and error ∝ 1/N
#
# Forward Euler for `y' = −y`, `y(0) = 1`, on `[0, 3]` with N steps (a one-unit "ResNet"
# with `σ(W y + b) = −y`). Left: the steps against the exact solution `e^(−t)`. Right: the
# error at `t = 3` against N on log–log axes, with the line `C/N` through the last point: the
# points approach its slope −1 (first order), so a network twice as deep is twice as close to
# its ODE.

# %%
T = 3.0
fig = Figure(figsize=(8.0, 3.4), layout="constrained")
ax_y, ax_err = fig.subplots(1, 2)
t = np.linspace(0, T, 200)
ax_y.plot(t, np.exp(-t), "k-", lw=1, label="exact e^(−t)")
depths = np.array([4, 8, 16] if SMALL else [4, 8, 16, 32, 64])
errors = []
for N in depths:
    h = T / N
    y = (1 - h) ** np.arange(N + 1)  # y[n+1] = y[n] + h·(−y[n])
    ax_y.plot(np.linspace(0, T, N + 1), y, "o-", ms=3, label=f"N = {N}")
    errors.append(abs(y[-1] - np.exp(-T)))
ax_y.set(xlabel="t (layer n at t = n·T/N)", ylabel="y", title="forward Euler = a ResNet's layers")
ax_y.legend(fontsize="small")
ax_err.loglog(depths, errors, "o", label="|y[N] − y(T)|")
ax_err.loglog(depths, errors[-1] * depths[-1] / depths, "k--", lw=1, label="C/N (slope −1)")
ax_err.set(xlabel="steps (layers) N", ylabel="error at t = T", title="first order: error ∝ 1/N")
ax_err.set_xticks(depths, [str(n) for n in depths])
ax_err.xaxis.set_minor_locator(NullLocator())  # only the N that were run
ax_err.legend(fontsize="small")
ax_err.grid(alpha=0.3, which="both")
show(fig, "00_euler_error")
orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
print("observed orders:", np.round(orders, 3))

# %% [markdown]
# ## Figure 2: MGRIT, iteration by iteration
#
# A ResNet of N tanh layers, width 2, random weights, one input. The black line is one state
# component computed layer by layer. MGRIT with two levels (coarse steps over m layers)
# starts from the coarse solve alone (iteration 0: one coarse step per interval, then fine
# steps inside each interval — the parallel part) and corrects all layers at once; the right
# panel shows how fast its error falls. Lessons 03–04 build this solver from scratch.

# %%
N, m, WIDTH = (32, 4, 2) if SMALL else (64, 8, 2)
net = refbraid.Network(DenseLift(2, WIDTH, "identity"), DenseStep(WIDTH, "tanh"),
                       Classifier((WIDTH,), 2), n_layers=N, T=4.0)
params = refbraid.init_params(net, seed=3)
params["steps.W"] *= 2.0  # livelier dynamics than the default initialisation
x = np.array([[1.0, -0.5]])
_, states, _ = refbraid.forward(net, params, x)
exact = np.stack(states)[:, 0, 0]  # layer by layer: y[n], first component
settings = MGRITSettings(levels=2, cfactor=m, relax="F", skip_first_down=True, abs_tol=None,
                         max_iter=4, keep_iterates=True, min_coarse=1)
_, result, _ = mgrit_forward(net, params, x, settings)
iterates = [np.stack(u)[:, 0, 0] for u in result.post_cycle_iterates()]

fig = Figure(figsize=(8.0, 3.4), layout="constrained")
ax_y, ax_e = fig.subplots(1, 2)
layers = np.arange(N + 1)
ax_y.plot(layers, exact, "k-", lw=2.5, label="layer by layer (sequential)")
for k, u in enumerate(iterates[:3]):
    ax_y.plot(layers, u, "--", marker=".", ms=4, label=f"MGRIT iteration {k}")
ax_y.plot(layers[::m], exact[::m], "s", mfc="none", color="0.3", label=f"C-points (every {m})")
ax_y.set(xlabel="layer n", ylabel="y[n] (first component)",
         title=f"N = {N} layers, coarse steps over m = {m}")
ax_y.legend(fontsize="x-small")
gaps = [max(float(np.abs(u - exact).max()), 1e-17) for u in iterates]
ax_e.semilogy(range(len(gaps)), gaps, "o-")
ax_e.set(xlabel="MGRIT iteration", ylabel="max |MGRIT − sequential|",
         title="error of every layer, per iteration")
ax_e.xaxis.get_major_locator().set_params(integer=True)
ax_e.grid(alpha=0.3, which="both")
show(fig, "00_mgrit_iterations")
print("max error per iteration:", " ".join(f"{g:.1e}" for g in gaps))

# %% [markdown]
# ## Exercises
#
# Each lesson ends with an exercise: a function to write (it starts as
# `raise NotImplementedError`) and a check from `refbraid.lessons.exercises` that prints one
# line: **PASS**, **TODO** (not written yet), or **FAIL** with what is wrong — which index,
# point or rank, and how large the error. This lesson's: write forward Euler for `y' = λ y`
# on `[0, T]` with N steps, returning all N + 1 values. Here is a plausible wrong answer
# first, to see what a FAIL says (its step is `T/(N+1)`, one interval too many):

# %%


def euler_off_by_one(y0, lam, T, N):
    """A first guess: N + 1 points, so N + 1 intervals? (No: N steps of T/N.)"""
    h = T / (N + 1)
    return y0 * (1 + h * lam) ** np.arange(N + 1)


first_try = exercises.check_euler_steps(euler_off_by_one)

# %% [markdown]
# The message names the case, the first wrong step and the step size it expected. Now yours:
# replace the `raise` and run the cell; it prints TODO until then. (A reference answer lives
# in `refbraid.lessons.solutions` under the same name; the tests check every exercise's
# reference answer, so here you only ever see your own result.)

# %%


def euler_steps(y0, lam, T, N):
    """Forward Euler for y' = λ y, h = T/N: return y[0..N] (N + 1 values)."""
    raise NotImplementedError  # your code here


exercises.check_euler_steps(euler_steps)

# %%
assert not first_try
assert abs(orders[-1] - 1) < 0.2, orders
assert gaps[-1] < 1e-3 * gaps[0], gaps
print("ready: open lesson 01.")
