# %% [markdown]
# # Lesson 08 — A GRU, parallel in the sequence
#
# A recurrent network is time stepping in the most literal sense: the hidden state `h` is
# carried from one sequence position to the next. The GRU update (as `torch.nn.GRUCell`),
#
#     h_new = z ⊙ h + (1 − z) ⊙ n  =  h + Δt (1 − z) ⊙ (n − h)   at Δt = 1,
#
# is forward Euler for the ODE `h' = (1 − z) ⊙ (n − h)` (gates `z`, `n` depend on `h` and on
# the input `x_t`). So MGRIT can run over the *sequence* instead of over layers (Moon & Cyr,
# ICLR 2022; TorchBraid's GRU): the time points are the positions, a coarse step from
# position `a` to `b` has size `(b − a)·Δt` and uses the input at `a`.
#
# The catch: forward Euler with a big step is unstable. Moon & Cyr's *implicit* GRU treats
# the decay term implicitly, `h_new = (h + Δt (1 − z) ⊙ n) / (1 + Δt (1 − z))`, which is a
# convex combination of `h` and `n` for every step size. refbraid's model `gru` uses the
# classic cell on the fine grid and the implicit one on coarse grids; `implicit-gru` uses the
# implicit cell everywhere.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/08_gru_parallel_in_sequence.py`, it saves
# them to `lesson_figures/08/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import tempfile

import numpy as np
from matplotlib.figure import Figure

from refbraid.backends import get_backend
from refbraid.data import load_dataset
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.layers import GRUCell
from refbraid.lessons import show, small
from refbraid.sequence import GRUModel
from refbraid.training import TrainConfig, train

SMALL = small()
bk = get_backend("numpy")
rng = np.random.default_rng(0)

# %% [markdown]
# ## Big steps: classic vs implicit
#
# One step of each cell from the same `h`, with growing step size `Δt`. The classic update
# `h + Δt (1 − z)(n − h)` overshoots `n` once `Δt (1 − z) > 1` and leaves the box `[−1, 1]`
# that `n = tanh(…)` lives in; the implicit one always stays between `h` and `n`.

# %%
H, I = 8, 3
classic, implicit = GRUCell(I, H, "classic"), GRUCell(I, H, "implicit")
weights = classic.init(rng)
x_t, h = weights.pop("x"), np.tanh(rng.standard_normal((16, H)))
steps = [1, 2, 4, 8, 16]
largest = {}
for name, cell in (("classic", classic), ("implicit", implicit)):
    largest[name] = [float(np.abs(cell.step(weights, h, dt, x_t, bk)[0]).max()) for dt in steps]
    print(f"{name:>8}: max |h_new| for Δt = {steps}: "
          + ", ".join(f"{v:.2f}" for v in largest[name]))

# %% [markdown]
# ## MGRIT over the sequence
#
# The digits read row by row: 8 positions of 8 pixels. With one level the layer-parallel
# gradient is backprop through time; with two levels (cfactor 2) the error falls with every
# MGRIT cycle and is round-off after `N/m = 4` cycles (two-level MGRIT is exact after the
# number of coarse intervals). The classic fine grid with implicit coarse steps converges
# more slowly than the implicit GRU, whose coarse steps are the *same* scheme as the fine one.

# %%
data = load_dataset("digits", n_samples=200)
x = data.x_train[:32, 0]  # B,L,I = 32,8,8
y = data.y_train[:32]
errors = {}
for scheme in ("classic", "implicit"):
    model = GRUModel(8, 8, 16, 10, scheme)
    params = model.init_params(np.random.default_rng(1))
    _, exact, _ = model.backprop(params, x, y)
    one = model.layer_parallel_gradient(params, x, y, LayerParallelSettings.exact())[1]
    assert relative_gradient_error(one, exact) <= 1e-12
    errors[scheme] = []
    for k in range(5):
        s = LayerParallelSettings.with_iterations(k, k, levels=2, cfactor=2, relax="F")
        errors[scheme].append(relative_gradient_error(
            model.layer_parallel_gradient(params, x, y, s)[1], exact))
    print(f"{scheme:>8}: gradient error per cycle " + ", ".join(f"{e:.1e}" for e in errors[scheme]))

# %% [markdown]
# ## Training: serial vs layer-parallel
#
# The same run twice, once with BPTT and once with MGRIT forward and adjoint solves over the
# sequence (3 levels, cfactor 2, 2 forward and 1 adjoint cycles). Accuracy is measured with
# the forward pass each run trains.

# %%
EPOCHS = 4 if SMALL else 10
common = dict(model="implicit-gru", data="digits", epochs=EPOCHS, quiet=True,
              samples=600 if SMALL else None, fwd_iters=2, bwd_iters=1)
acc = {}
with tempfile.TemporaryDirectory() as tmp:  # the runs' logs are not kept
    for serial in (True, False):
        name = "serial" if serial else "layer-parallel"
        run = train(TrainConfig(serial=serial, out=f"{tmp}/{name}", **common))
        acc[name] = run.final["val_acc"]
print("validation accuracy: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items()))

# %%
fig = Figure(figsize=(9, 3.4), layout="constrained")
a, b = fig.subplots(1, 2)
for name, vals in largest.items():
    a.semilogx(steps, vals, "o-", base=2, label=name)
a.axhline(1.0, color="grey", lw=0.8)
a.set(xlabel="step size Δt", ylabel="max |h_new|", title="one GRU step, growing Δt")
a.legend()
for name, e in errors.items():
    b.semilogy(range(len(e)), np.maximum(e, 1e-17), "o-", label=name)
b.set(xlabel="MGRIT cycles (2 levels, cfactor 2)", ylabel="gradient rel. error",
      title="MGRIT over the sequence")
b.legend()
show(fig, "08_gru_parallel_in_sequence")

# %%
assert max(largest["implicit"]) <= 1.0 < max(largest["classic"])
assert errors["implicit"][-1] <= 1e-12 < errors["implicit"][0]
assert errors["classic"][-1] <= 1e-12 and errors["classic"][1] < errors["classic"][0]
assert min(acc.values()) > 0.5  # chance is 0.1


# %% [markdown]
# ## Exercise: the implicit GRU step
#
# Write one step of the implicit GRU cell: gates as `torch.nn.GRUCell` (order r, z, n),
# `[gx_r|gx_z|gx_n] = x W_ihᵀ + b_ih`, `[gh_r|gh_z|gh_n] = h W_hhᵀ + b_hh`,
# `r = σ(gx_r + gh_r)`, `z = σ(gx_z + gh_z)`, `n = tanh(gx_n + r ⊙ gh_n)`, then
# `h_new = (h + dt (1 − z) ⊙ n) / (1 + dt (1 − z))`. The check compares with refbraid's
# `GRUCell(scheme="implicit")` at dt = 0.5, 1 and 8 (a coarse MGRIT step).

# %%
from refbraid.lessons import exercises


def implicit_gru_step(x, h, W_ih, W_hh, b_ih, b_hh, dt):
    """h_new of the implicit GRU cell, shape (B, H)."""
    raise NotImplementedError  # your code here


exercises.check_implicit_gru_step(implicit_gru_step)
