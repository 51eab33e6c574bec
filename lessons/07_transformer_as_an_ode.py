# %% [markdown]
# # Lesson 07 — A transformer is an ODE too
#
# A pre-norm transformer layer adds to its input: `X ← X + SA(LN(X))`, then
# `X ← X + MLP(LN(X))`. Put a step size `h` in front of the update (Lu et al. 2019) and a
# stack of N layers is forward Euler, `h = T/N`, for the ODE `X' = F(X)` on the token states
# X (B, T, E):
#
#     X[n+1] = X[n] + h F_enc(θ_n, X[n]),   F_enc(x) = φ1(x) + φ2(x + φ1(x)),
#
# with `φ1 = SA∘LN` and `φ2 = MLP∘LN` (at h = 1 this is exactly
# `torch.nn.TransformerEncoderLayer(norm_first=True)`). Everything of lessons 01–05 carries
# over: backprop is the discrete adjoint, MGRIT solves the layer recurrence, and the layers of
# a transformer can be trained in parallel (TorchBraid's transformer examples).
#
# This lesson checks the ODE view (refining the layers converges like forward Euler),
# measures the layer-parallel gradient error, and trains a small token tagger serially and
# layer-parallel.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/07_transformer_as_an_ode.py`, it saves
# them to `lesson_figures/07/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import tempfile

import numpy as np
from matplotlib.figure import Figure

from refbraid.data import load_dataset
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.lessons import show, small
from refbraid.network import forward
from refbraid.sequence import TransformerModel
from refbraid.training import TrainConfig, train

SMALL = small()

# %% [markdown]
# ## Refining the layers: forward Euler converges with order 1
#
# Take one smooth weight function `θ(t)` on [0, T] (here: two random layers, interpolated
# linearly in t) and sample it at N layers. As N doubles, the final state converges to the
# ODE solution with error `O(h) = O(1/N)`, so the change `‖X_N(T) − X_2N(T)‖` halves too
# (observed order `log2` of successive ratios → 1).

# %%
data = load_dataset("seq-duplicates", n_samples=100)
tokens = data.x_train[:8].astype(np.int64)  # B,T = 8,10
V, L = data.info["vocab_size"], data.info["seq_len"]
rng = np.random.default_rng(0)
ends = TransformerModel(V, L, 2, 2, 16, 2, 32, T=1.0).init_params(rng)


def sampled(n_layers: int) -> dict:
    """θ(t_n) at t_n = n/N, linear between the two random layers of ``ends``."""
    t = np.arange(n_layers) / n_layers
    out = {}
    for k, v in ends.items():
        if k.startswith("steps."):
            w = t.reshape(-1, *([1] * (v.ndim - 1)))
            out[k] = (1 - w) * v[0] + w * v[1]
        else:
            out[k] = v
    return out


def final_state(n_layers: int) -> np.ndarray:
    model = TransformerModel(V, L, 2, n_layers, 16, 2, 32, T=1.0)
    return forward(model.net, sampled(n_layers), tokens, keep=False)[1][-1]


Ns = [4, 8, 16, 32, 64] if SMALL else [4, 8, 16, 32, 64, 128, 256]
finals = {n: final_state(n) for n in [*Ns, 2 * Ns[-1]]}
ode_error = [float(np.linalg.norm(finals[n] - finals[2 * n])) for n in Ns]  # ‖X_N − X_2N‖
orders = np.log2(np.array(ode_error[:-1]) / np.array(ode_error[1:]))
print("N:      " + "  ".join(f"{n:>8d}" for n in Ns))
print("change: " + "  ".join(f"{e:8.2e}" for e in ode_error))
print("order:  " + "  ".join(f"{o:8.2f}" for o in orders))

# %% [markdown]
# ## Layer-parallel gradient of a transformer
#
# The per-token tagger (tag each token 1 if it occurs elsewhere in the sequence — a rule only
# attention can express) with 8 layers. One MGRIT level is backprop; with two levels
# (cfactor 2) the gradient error falls every cycle and is round-off after `N/m = 4` cycles.

# %%
tagger = TransformerModel(V, L, 2, 8, 16, 2, 32, T=2.0, per_token=True)
params = tagger.init_params(np.random.default_rng(1))
x, y = data.x_train[:16], data.y_train[:16]
_, exact, _ = tagger.backprop(params, x, y)
one_level = tagger.layer_parallel_gradient(params, x, y, LayerParallelSettings.exact())[1]
grad_error = [relative_gradient_error(tagger.layer_parallel_gradient(
    params, x, y, LayerParallelSettings.with_iterations(k, k, levels=2, cfactor=2))[1], exact)
    for k in range(5)]
print(f"one level: {relative_gradient_error(one_level, exact):.1e};  cycles 0..4: "
      + ", ".join(f"{e:.1e}" for e in grad_error))

# %% [markdown]
# ## Training the tagger, serial vs layer-parallel
#
# The same run with sequential backprop and with MGRIT (2 levels, cfactor 2, 2 forward and 1
# adjoint cycles). About 54 % of the tokens have a duplicate, so always answering "1" scores
# 54 %: that is chance here.

# %%
common = dict(model="transformer", data="seq-duplicates", backend="numba", quiet=True,
              epochs=4 if SMALL else 10, samples=1000 if SMALL else None, batch_size=32,
              lr=1e-2, levels=2, fwd_iters=2, bwd_iters=1)
acc = {}
with tempfile.TemporaryDirectory() as tmp:  # the runs' logs are not kept
    for serial in (True, False):
        name = "serial" if serial else "layer-parallel"
        run = train(TrainConfig(serial=serial, out=f"{tmp}/{name}", **common))
        acc[name] = run.final["val_acc"]
print("token accuracy: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items()))

# %%
fig = Figure(figsize=(9, 3.4), layout="constrained")
a, b = fig.subplots(1, 2)
a.loglog(Ns, ode_error, "o-", label="‖X_N(T) − X_2N(T)‖")
a.loglog(Ns, ode_error[0] * Ns[0] / np.array(Ns), "k--", lw=0.8, label="O(1/N)")
a.set(xlabel="layers N (h = T/N)", ylabel="change on refinement", title="layers → ODE")
a.set_xticks(Ns, [str(n) for n in Ns])
a.set_xticks([], minor=True)
a.legend()
b.semilogy(range(len(grad_error)), np.maximum(grad_error, 1e-17), "o-")
b.set(xlabel="MGRIT cycles (2 levels, cfactor 2)", ylabel="gradient rel. error",
      title="layer-parallel gradient")
show(fig, "07_transformer_as_an_ode")

# %%
assert np.all(np.abs(orders - 1.0) < 0.2), orders  # forward Euler: first order
assert relative_gradient_error(one_level, exact) <= 1e-12
assert grad_error[-1] <= 1e-12 < grad_error[0]
assert min(acc.values()) > 0.7  # chance is 0.54


# %% [markdown]
# ## Exercise: the adjoint of layer normalisation
#
# Write the adjoint of `y = γ ⊙ (x − μ)/√(σ² + eps) + β` (mean and biased variance over the
# last axis of x (B, T, E)): return `(dx, dgamma, dbeta)` for the cotangent `dy`. With
# `x̂ = (x − μ) r`, `r = 1/√(σ² + eps)` and `g = dy ⊙ γ`:
# `dx = r (g − mean g − x̂ mean(g ⊙ x̂))`, `dγ = Σ dy ⊙ x̂`, `dβ = Σ dy` (sums over B and T).
# The check runs the dot-product test for each output, then compares with
# `refbraid.layers.LayerNorm`.

# %%
from refbraid.lessons import exercises


def layernorm_adjoint(x, gamma, dy, eps):
    """Return (dx, dgamma, dbeta) of layer normalisation over the last axis."""
    raise NotImplementedError  # your code here


exercises.check_layernorm_adjoint(layernorm_adjoint)
