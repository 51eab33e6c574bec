# %% [markdown]
# # Lesson 00 — How to use this course
#
# The course is a sequence of lessons, `lessons/NN_*.py`: plain Python scripts cut into cells
# (`# %%`), with the prose in markdown cells like this one. Each lesson derives one idea of
# layer-parallel training (a ResNet is forward Euler, backprop is its adjoint, MGRIT solves
# both in parallel across layers, ...), checks it numerically with refbraid, draws it, and
# ends with an exercise that checks itself.
#
# **Install** (once, from the refbraid checkout):
#
#     python3 -m venv .venv && .venv/bin/pip install -e ".[data,mpi,lessons]" jupyterlab
#
# **Open the course in Jupyter** — either executed notebooks with every output and figure:
#
#     refbraid lessons build --small && jupyter lab lesson_notebooks/
#
# or the scripts themselves: in JupyterLab right-click a `lessons/NN_*.py` → *Open With →
# Notebook* (jupytext, part of the `lessons` extra, makes scripts open as notebooks); in
# VS Code, open the file and press *Run Cell* above any `# %%`. `refbraid lessons list`
# lists the lessons; `refbraid lessons build 03` builds one.
#
# **Run a lesson as a script**: `python lessons/01_resnet_is_forward_euler.py`. The figures
# then go to `lesson_figures/01/` (the lesson prints each path; `REFBRAID_LESSON_FIGURES=DIR`
# picks another folder). `REFBRAID_LESSON_SMALL=1` runs any lesson at small sizes, in
# seconds: what the tests and `lessons build --small` do. Everything runs on a laptop CPU.

# %%
import numpy as np
from matplotlib.figure import Figure

from refbraid.lessons import exercises, figure_folder, in_notebook, show, small
from refbraid.lessons.notebooks import find_lessons

SMALL = small()
print(f"small sizes: {SMALL};  inside a notebook: {in_notebook()}")
if not in_notebook():
    print(f"figures of this lesson go to {figure_folder('00_how_to_use_this_course')}/")
for lesson in find_lessons():
    print(f"{lesson.number}  {lesson.title}")

# %% [markdown]
# ## Figures
#
# Every lesson builds its figures as `matplotlib` objects and hands each to
# `refbraid.lessons.show(fig, name)`, in the cell that builds it: in a notebook the figure
# appears below that cell; in a script it is saved and its path printed. Here is a first
# one, a preview of lesson 01: forward Euler for `y' = −y`, `y(0) = 1`, on `[0, 3]` with N
# steps; its error at `t = 3` halves when N doubles (first order).

# %%
T = 3.0
fig = Figure(figsize=(8.0, 3.2), layout="constrained")
ax_y, ax_err = fig.subplots(1, 2)
t = np.linspace(0, T, 200)
ax_y.plot(t, np.exp(-t), "k-", lw=1, label="exact e^(−t)")
depths = [4, 8, 16] if SMALL else [4, 8, 16, 32, 64]
errors = []
for N in depths:
    h = T / N
    y = (1 - h) ** np.arange(N + 1)  # y[n+1] = y[n] + h·(−y[n])
    ax_y.plot(np.linspace(0, T, N + 1), y, "o-", ms=3, label=f"N = {N}")
    errors.append(abs(y[-1] - np.exp(-T)))
ax_y.set(xlabel="t", ylabel="y", title="forward Euler steps")
ax_y.legend(fontsize="small")
ax_err.loglog(depths, errors, "o-")
ax_err.set(xlabel="steps N", ylabel="|y[N] − y(T)|", title="error ∝ 1/N")
show(fig, "00_how_to_use_this_course")
orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
print("observed orders:", np.round(orders, 3))

# %% [markdown]
# ## Exercises
#
# Each lesson ends with an exercise: a function to write (it starts as
# `raise NotImplementedError`) and a check from `refbraid.lessons.exercises` that prints one
# line: **PASS**, **TODO** (not written yet), or **FAIL** with what is wrong — which index,
# point or rank, and how large the error. Try it on lesson 09's exercise, the time of a ring
# allreduce of `n` bytes over `P` ranks with α seconds per message and β seconds per byte.
# First a plausible but wrong answer (one message per rank):

# %%


def allreduce_time(nbytes, ranks, alpha, beta):
    """A first guess: every rank sends its whole gradient once."""
    return (ranks - 1) * (alpha + nbytes * beta)


first_try = exercises.check_allreduce_time(allreduce_time)

# %% [markdown]
# The message says which case fails and by how much. A ring allreduce is a reduce-scatter
# and an all-gather, each `P − 1` messages of `n/P` bytes — write that and check again:

# %%


def allreduce_time(nbytes, ranks, alpha, beta):  # noqa: F811 (the corrected answer)
    """Reduce-scatter + all-gather: 2 (P − 1) messages of n/P bytes."""
    return 2 * (ranks - 1) * (alpha + nbytes / ranks * beta)


second_try = exercises.check_allreduce_time(allreduce_time)

# %% [markdown]
# Reference solutions live in `refbraid.lessons.solutions` (same names as the exercises);
# `exercises.check_all()` runs every check on its reference solution.

# %%
assert not first_try and second_try
assert abs(orders[-1] - 1) < 0.2, orders
assert all(exercises.check_all(quiet=True))
print("ready: open lesson 01.")
