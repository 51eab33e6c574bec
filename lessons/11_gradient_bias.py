# %% [markdown]
# # Lesson 11 — Gradient bias in layer-parallel transformers
#
# Layer-parallel training replaces the forward pass and backprop by MGRIT solves over the
# layers. Solved to convergence, the gradient *is* backprop's (lessons 05 and 07). Trained
# with a fixed, small number of MGRIT cycles — the way TorchBraid trains — it is not: the
# gradient carries a **systematic bias**. Jiang et al. (arXiv 2601.09026) report that this
# bias is harmless early in training and harmful near a minimum, and they detect the
# transition and then either raise the accuracy of the solves or switch to serial training.
#
# refbraid can measure the bias *exactly*, because sequential backprop sits beside every
# layer-parallel gradient. Here we train a small GPT (decoder-only, causal self-attention,
# tied head) on a generated language — reverse a string of 5 symbols — and
#
# 1. check that the converged layer-parallel gradient equals backprop;
# 2. train serially and layer-parallel side by side, measuring every few steps the bias
#    ‖g_MGRIT − g‖ against the noise of the mini-batch gradient (the spread over
#    micro-batches), and the cheap proxy: the MGRIT residuals;
# 3. let the controller act on the ratio: more MGRIT cycles (`iterations`) or backprop
#    (`serial`), and compare what each costs in step applications.
#
# Run it: `python lessons/11_gradient_bias.py` (`REFBRAID_LESSON_SMALL=1` for a quick run; in
# Jupyter the figure appears in its cell, as a script it goes to `lesson_figures/11/`, or to
# `REFBRAID_LESSON_FIGURES`). The same from the command line:
# `refbraid train --model gpt --bias-control measure|iterations|serial`.

# %%
import numpy as np
from matplotlib.figure import Figure

from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.lessons import show, small
from refbraid.training.config import TrainConfig
from refbraid.training.evaluate import evaluate
from refbraid.training.gradients import select_gradient
from refbraid.training.language import language_report
from refbraid.training.run import setup
from refbraid.training.trainer import fit

SMALL = small()
SIZE = (dict(layers=4, width=8, samples=240, epochs=2, batch_size=32) if SMALL else
        dict(layers=8, width=32, samples=2000, epochs=6, batch_size=64))
COMMON = dict(model="gpt", backend="numba", seed=0, quiet=True, bias_every=2 if SMALL else 5,
              bias_threshold=0.7 if SMALL else 1.0, **SIZE)

# %% [markdown]
# ## 1. Converged, the layer-parallel gradient is backprop's
#
# Three MGRIT levels with coarsening factor 2 over the layers; k forward and k adjoint cycles.

# %%
config = TrainConfig(**COMMON)
model, data, state, bk = setup(config)
x, y = data.x_train[:16], data.y_train[:16]
_, exact, _ = model.backprop(state.params, x, y, bk)
print(" cycles   ‖g_MGRIT − g‖ / ‖g‖")
errors = []
for k in range(0, model.n_layers // 2 + 1):
    s = LayerParallelSettings.with_iterations(k, k, levels=3 if not SMALL else 2, cfactor=2)
    g = model.layer_parallel_gradient(state.params, x, y, s, bk)[1]
    errors.append(relative_gradient_error(g, exact, bk))
    print(f"{k:7d}   {errors[-1]:.2e}")
assert errors[-1] <= 1e-10 and errors[0] > 1e-6

# %% [markdown]
# ## 2. Bias and noise during training
#
# Every few steps, on the step's own batch: g = backprop, bias = ‖g_MGRIT − g‖, and the noise
# √(Σ‖g_i − ḡ‖² / (M(M−1))) over M = 4 micro-batches — the standard error of a batch-mean
# gradient. A ratio below 1 means the bias hides inside the noise SGD lives with anyway.
# We train with TorchBraid's cycle counts (1 forward cycle after the skipped down-cycle, no
# adjoint cycle), measuring only; then with each controller (threshold 1; 0.7 in the small
# run, so that it has something to decide); and serially.

# %%
RUNS = {
    "serial": dict(serial=True),
    "fixed 1/0 (TorchBraid)": dict(fwd_iters=1, bwd_iters=0, bias_control="measure"),
    "controller: iterations": dict(fwd_iters=1, bwd_iters=0, bias_control="iterations"),
    "controller: serial": dict(fwd_iters=1, bwd_iters=0, bias_control="serial"),
}
outcome = {}
for name, extra in RUNS.items():
    config = TrainConfig(**COMMON, **extra)
    model, data, state, bk = setup(config)
    _, gradient = select_gradient(config, model, bk)
    result = fit(model, state, data, gradient, epochs=config.epochs,
                 batch_size=config.batch_size, bk=bk, quiet=True)
    report = language_report(model, state.params, data, bk)
    steps = sum(r["steps"] for r in result.state.history)
    applications = getattr(gradient, "step_applications", 2.0 * model.n_layers * steps)
    outcome[name] = dict(gradient=gradient, history=result.state.history, report=report,
                         applications=applications,
                         val_loss=evaluate(model, state.params, data.x_val, data.y_val, bk)[0])

print(f"\n{'run':<24} {'train loss':>10} {'perplexity':>10} {'exact match':>11} "
      f"{'step applications':>17}  (+ measuring)")
for name, o in outcome.items():
    g = o["gradient"]
    extra = getattr(g, "measure_applications", 0.0)
    print(f"{name:<24} {o['history'][-1]['train_loss']:10.4f} "
          f"{o['report']['sequential']['perplexity']:10.3f} "
          f"{100 * o['report']['sequential']['exact_match']:10.1f}% {o['applications']:17.0f}"
          f"  (+{extra:.0f})")

# %% [markdown]
# The measurements of the fixed run, and every decision the controllers took, with its
# numbers:

# %%
fixed = outcome["fixed 1/0 (TorchBraid)"]["gradient"]
print(f"\n{'step':>5} {'bias':>9} {'noise':>9} {'ratio':>7} {'rel. bias':>9} {'fwd_res':>9} "
      f"{'bwd_res':>9}")
for m in fixed.measurements:
    print(f"{m['step']:5d} {m['bias']:9.3g} {m['noise']:9.3g} {m['bias_ratio']:7.2f} "
          f"{m['rel_bias']:9.3f} {m['fwd_res']:9.3g} {m['bwd_res']:9.3g}")
for name in ("controller: iterations", "controller: serial"):
    for d in outcome[name]["gradient"].decisions:
        print(f"{name}: step {d['step']}, bias/noise {d['bias_ratio']:.2f} → {d['action']}")
ratios = [m["bias_ratio"] for m in fixed.measurements]
proxy = [m["fwd_res"] for m in fixed.measurements]
assert all(np.isfinite(ratios)) and len(ratios) >= 2
assert outcome["serial"]["report"]["sequential"]["perplexity"] >= 1.0
if len(ratios) > 2:
    print(f"\ncorrelation of the ratio with the forward residual (the proxy): "
          f"{np.corrcoef(ratios, proxy)[0, 1]:+.2f}")

# %% [markdown]
# What to look for: with one MGRIT cycle the *relative* bias ‖g_MGRIT − g‖/‖g‖ stays large
# throughout, while both the gradient and its noise shrink as the loss falls — the ratio is
# what tells whether the bias matters for SGD. The controller in `iterations` mode buys back
# accuracy with cycles (each is ~2 N step applications), `serial` pays backprop's 2 N per step
# from the switch on. On an easy task all runs reach the answer; the question the ratio answers
# is how much of the work was needed.

# %%
fig = Figure(figsize=(11, 4))
axes = fig.subplots(1, 2)
steps = [m["step"] for m in fixed.measurements]
axes[0].semilogy(steps, [m["bias"] for m in fixed.measurements], "o-", label="bias ‖g_MGRIT − g‖")
axes[0].semilogy(steps, [m["noise"] for m in fixed.measurements], "s-", label="mini-batch noise")
axes[0].set_xlabel("training step")
axes[0].set_title("fixed 1/0 cycles: bias and noise")
axes[0].legend()
for name in ("fixed 1/0 (TorchBraid)", "controller: iterations"):
    ms = outcome[name]["gradient"].measurements
    axes[1].plot([m["step"] for m in ms], [m["bias_ratio"] for m in ms], "o-", label=name)
axes[1].axhline(1.0, color="k", lw=0.8, ls="--", label="threshold")
axes[1].set_xlabel("training step")
axes[1].set_title("bias / noise")
axes[1].legend()
fig.tight_layout()
show(fig, "11_gradient_bias")

# %% [markdown]
# ## Exercise
#
# The controllers act on one number: the bias of the layer-parallel gradient against the noise
# of the mini-batch gradient. Given flat gradients — `g_lp` (layer-parallel) and `g`
# (sequential backprop, same batch), both of P parameters, and `micro`, the M gradients of the
# batch's micro-batches (M, P) — write `bias_noise_ratio(g_lp, g, micro)` returning
# `(bias, noise, ratio)`: bias = ‖g_lp − g‖₂, noise = the standard error of the *mean* of the
# micro-batch gradients, √(Σ_i ‖g_i − ḡ‖² / (M(M − 1))), and ratio = bias / noise. Why does
# the noise shrink near a minimum while the bias of a fixed number of MGRIT cycles does not?
# The check compares with `refbraid.bias_control.bias_and_noise`, the measurement
# `--bias-control` makes.

# %%
from refbraid.lessons import exercises  # noqa: E402


def bias_noise_ratio(g_lp, g, micro):
    """(‖g_lp − g‖, standard error of the mean of the micro-batch gradients, their ratio)."""
    raise NotImplementedError  # your code here


exercises.check_bias_noise_ratio(bias_noise_ratio)
