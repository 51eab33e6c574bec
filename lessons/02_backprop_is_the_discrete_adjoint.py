# %% [markdown]
# # Lesson 02 — Backprop is the discrete adjoint
#
# Lesson 01 showed that a ResNet's forward pass is forward Euler:
#
#     y[n+1] = Φ_n(y[n]) = y[n] + h σ(z[n]),   z[n] = W[n] y[n] + b[n],   h = T/N.
#
# Training needs the gradient of the loss `L(y[N])` with respect to every `W[n], b[n]`.
# Apply the chain rule backwards through the steps and name the intermediate vector
# `λ[n] = ∂L/∂y[n]` (the *adjoint*, or co-state):
#
#     λ[N] = ∂L/∂y[N]
#     λ[n] = Φ_n'(y[n])ᵀ λ[n+1] = λ[n+1] + h W[n]ᵀ (σ'(z[n]) ⊙ λ[n+1])
#     ∂L/∂W[n] = h (σ'(z[n]) ⊙ λ[n+1]) y[n]ᵀ,      ∂L/∂b[n] = h σ'(z[n]) ⊙ λ[n+1]
#
# (summed over the batch; docs/references.md §1). The λ recurrence runs *backwards in time*: it
# is itself a time stepper, the discrete adjoint of forward Euler (a consistent
# discretisation of `λ' = −(∂F/∂y)ᵀ λ`). Backprop is exactly this recurrence, which is why
# MGRIT can parallelise the backward pass as well: it is one more time integration, on the
# reversed grid.
#
# Below we write the recurrence out by hand with NumPy, and compare it with
# `refbraid.network.backprop` and with central finite differences.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/02_backprop_is_the_discrete_adjoint.py`, it saves
# them to `lesson_figures/02/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import numpy as np
from matplotlib.figure import Figure

import refbraid
from refbraid.data import load_peaks
from refbraid.lessons import show, small
from refbraid.models import build_network

SMALL = small()

N = 8 if SMALL else 16  # layers
WIDTH = 4
T = 2.0

# %% [markdown]
# ## A small ResNet classifier on Peaks
#
# Opening `y[0] = tanh(W_open x + b_open)`, N tanh ResNet steps, closing
# `logits = W_close y[N] + b_close`, mean softmax cross-entropy over a batch of 8 points.

# %%
data = load_peaks(200, seed=0)
x, labels = data.x_train[:8], data.y_train[:8]  # B = 8
net = build_network("resnet", data.input_shape, data.n_classes, N, WIDTH, T, "tanh")
params = refbraid.init_params(net, seed=1)
h = net.h

# %% [markdown]
# ## Forward pass, keeping the states y[0..N]

# %%
logits, states, _ = refbraid.forward(net, params, x)
B = x.shape[0]
shifted = logits - logits.max(axis=1, keepdims=True)
p = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)  # softmax, B,classes
loss = -np.log(p[np.arange(B), labels]).mean()
print(f"loss L = {loss:.6f}")

# %% [markdown]
# ## The adjoint recurrence, by hand
#
# Start from the loss: `∂L/∂logits = (p − onehot(labels)) / B`, then through the closing
# layer `λ[N] = (∂L/∂logits) W_close` (row-vector convention, B rows), then step backwards.

# %%
dlogits = p.copy()
dlogits[np.arange(B), labels] -= 1.0
dlogits /= B  # B,classes
lam = [None] * (N + 1)
lam[N] = dlogits @ params["closing.W"]  # B,C
dW = np.zeros_like(params["steps.W"])  # N,C,C
db = np.zeros_like(params["steps.b"])  # N,C
for n in reversed(range(N)):
    W_n, b_n, y_n = params["steps.W"][n], params["steps.b"][n], states[n]
    z = y_n @ W_n.T + b_n  # B,C
    s = h * (1.0 - np.tanh(z) ** 2) * lam[n + 1]  # h σ'(z) ⊙ λ[n+1]
    lam[n] = lam[n + 1] + s @ W_n  # λ[n] = λ[n+1] + h Wᵀ(σ'(z) ⊙ λ[n+1])
    dW[n] = s.T @ y_n  # Σ_batch h (σ'(z) ⊙ λ[n+1]) y[n]ᵀ
    db[n] = s.sum(axis=0)

# %% [markdown]
# ## Compare with refbraid's backprop
#
# `refbraid.network.backprop` runs the same recurrence through the layer objects' `adjoint`
# methods. Agreement should be at rounding level.

# %%
loss_bp, grads, info = refbraid.backprop(net, params, x, labels)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


errs = {
    "loss": abs(loss - loss_bp) / abs(loss_bp),
    "λ[0..N]": max(rel(lam[n], info["adjoints"][n]) for n in range(N + 1)),
    "dL/dW[n]": rel(dW, grads["steps.W"]),
    "dL/db[n]": rel(db, grads["steps.b"]),
}
for name, e in errs.items():
    print(f"by hand vs backprop, {name:9s}: relative difference {e:.1e}")

# %% [markdown]
# ## Compare with central finite differences
#
# `∂L/∂θ ≈ (L(θ + ε) − L(θ − ε)) / 2ε` for a handful of weights: a check that assumes nothing
# about the recurrence. In float64 with ε = 1e-5 the truncation error is ≈ ε² and the
# rounding error ≈ 1e-16/ε, so agreement to ~1e-9 relative is expected.

# %%
EPS = 1e-5
rng = np.random.default_rng(0)


def loss_at(p_):
    return refbraid.network.loss_and_logits(net, p_, x, labels)[0]


fd_errors = []
for key in ("steps.W", "steps.b", "opening.W", "closing.W"):
    g = grads[key]
    # sample entries whose gradient is not tiny (a relative test needs a scale)
    candidates = np.argwhere(np.abs(g) > 1e-3 * np.abs(g).max())
    picks = candidates[rng.choice(len(candidates), size=min(3 if SMALL else 6, len(candidates)),
                                  replace=False)]
    for idx in map(tuple, picks):
        plus = {k: v.copy() for k, v in params.items()}
        minus = {k: v.copy() for k, v in params.items()}
        plus[key][idx] += EPS
        minus[key][idx] -= EPS
        fd = (loss_at(plus) - loss_at(minus)) / (2 * EPS)
        fd_errors.append((key, idx, abs(fd - g[idx]) / abs(g[idx])))
worst = max(fd_errors, key=lambda e: e[2])
print(f"finite differences: {len(fd_errors)} entries, worst relative error {worst[2]:.1e} "
      f"at {worst[0]}{[int(i) for i in worst[1]]}")

# %% [markdown]
# ## The figure: the adjoint travels backwards
#
# Left: `‖λ[n]‖` against the layer index, computed by hand and by backprop (they coincide),
# from `n = N` back to `0`. Right: the size of each layer's weight gradient
# `‖∂L/∂W[n]‖ = h ‖Σ (σ'(z) ⊙ λ[n+1]) y[n]ᵀ‖` — each layer's gradient needs its forward
# state `y[n]` and the adjoint `λ[n+1]` from above it.

# %%
fig = Figure(figsize=(9.0, 3.5), layout="constrained")
ax_lam, ax_grad = fig.subplots(1, 2)
layers = np.arange(N + 1)
ax_lam.plot(layers, [np.linalg.norm(l_) for l_ in lam], "o-", label="by hand")
ax_lam.plot(layers, [np.linalg.norm(l_) for l_ in info["adjoints"]], "x", ms=8,
            label="refbraid.backprop")
ax_lam.set(xlabel="layer n", ylabel="‖λ[n]‖", title="adjoint, computed from n = N down to 0")
ax_lam.legend(fontsize="small")
ax_grad.bar(np.arange(N), [np.linalg.norm(dW[n]) for n in range(N)])
ax_grad.set(xlabel="layer n", ylabel="‖∂L/∂W[n]‖", title="per-layer weight gradients")
show(fig, "02_backprop_is_the_discrete_adjoint")

# %% [markdown]
# ## Check
#
# The hand-written recurrence equals backprop to rounding (≤ 1e-12 relative) and matches
# finite differences (≤ 1e-7 relative): backprop is the discrete adjoint of forward Euler.

# %%
assert all(e <= 1e-12 for e in errs.values()), errs
assert worst[2] <= 1e-7, worst
print("backprop is the discrete adjoint: checked.")


# %% [markdown]
# ## Exercise: the adjoint of one dense step
#
# Write the adjoint of one step `y_next = y + h tanh(y Wᵀ + b)`: given the cotangent
# `dy_next` (B, C) return `(dy, dW, db)`. With `z = y Wᵀ + b` and `s = h tanh'(z) ⊙ dy_next`:
# `dy = dy_next + s W`, `dW = sᵀ y`, `db = Σ_batch s`. The check runs the dot-product test
# `<J u, w> = <u, Jᵀ w>` for each of `dy`, `dW`, `db` (J from complex-step derivatives of the
# step, no reference needed) and then compares with refbraid's `DenseStep.adjoint`.

# %%
from refbraid.lessons import exercises


def dense_step_adjoint(W, b, y, dy_next, h):
    """Return (dy, dW, db) of y_next = y + h tanh(y Wᵀ + b) for the cotangent dy_next."""
    raise NotImplementedError  # your code here


exercises.check_dense_step_adjoint(dense_step_adjoint)
