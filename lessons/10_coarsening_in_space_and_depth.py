# %% [markdown]
# # Lesson 10 — Coarsening in space and depth
#
# MGRIT coarsens a network in *time* (depth): a coarse level takes one step of size m·h where
# the fine level takes m steps of size h. The TorchBraid paper adds two more directions:
#
# 1. **space** — coarse MGRIT levels run the conv ODE step on coarser feature maps (2×2
#    average pooling R down, bilinear P up), so their steps are cheaper;
# 2. **depth, for the optimiser** — train a shallower network first (nested initialisation), or
#    let a shallow network correct the deep one during training (MG/Opt).
#
# Here we draw the hierarchy (time levels × spatial resolutions), measure what spatial
# coarsening does to MGRIT's convergence, see why it needs FCF relaxation, push states of
# changing shape (a pooling stage) through MGRIT, and give a deep network a head start.
# The derivations are in docs/coarsening.md.
#
# Run it: `python lessons/10_coarsening_in_space_and_depth.py` (`REFBRAID_LESSON_SMALL=1` for
# a quick run). In Jupyter the figures appear in their cells; as a script they go to
# `lesson_figures/10/` (`REFBRAID_LESSON_FIGURES` picks another folder).

# %%
import numpy as np
from matplotlib.figure import Figure

from refbraid.data.digits import load_digits_dataset
from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    relative_gradient_error,
)
from refbraid.layers import Classifier, ConvLift, ConvStep, Pool
from refbraid.lessons import show, small
from refbraid.mgrit import MGRITSettings, spatial
from refbraid.mgrit.transfer import SpatialCoarsening
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.stages import Stage, StagedNetwork, staged_layer_parallel_gradient
from refbraid.stages import backprop as staged_backprop
from refbraid.stages import init_params as staged_init
from refbraid.training.evaluate import evaluate
from refbraid.training.gradients import sequential_gradient
from refbraid.training.multilevel import MGOpt, MGOptSettings, prolong_weights, restrict_gradient

SMALL = small()

# %% [markdown]
# ## 1. R and P, and their transposes
#
# A digit, upsampled to 16×16, restricted by 2×2 averaging and interpolated back bilinearly.
# Both operators are linear; their transposes are exact (`<R x, y> = <x, Rᵀ y>`), which the
# adjoint MGRIT solve needs.

# %%
digits = load_digits_dataset(n_samples=300 if SMALL else 1797, seed=0)
img = spatial.interpolate(digits.x_train[:1], "linear", 2)  # 1,1,16,16
coarse = spatial.restrict(img, "average", 2)  # 1,1,8,8
back = spatial.interpolate(coarse, "linear", 2)
rng = np.random.default_rng(0)
y = rng.standard_normal(coarse.shape)
dot = abs(np.vdot(coarse, y) - np.vdot(img, spatial.restrict_adjoint(y, "average", 2)))
print(f"|<R x, y> - <x, Rᵀ y>| = {dot:.1e};  ‖x − P R x‖/‖x‖ = "
      f"{np.linalg.norm(img - back) / np.linalg.norm(img):.3f}")
assert dot < 1e-12

# %% [markdown]
# ## 2. The hierarchy, and what spatial coarsening does to convergence
#
# A conv ODE-net of N layers on 16×16 maps, MGRIT with 3 levels and cfactor 4. With
# `SpatialCoarsening((1, 2))` level 1 runs on 8×8 and level 2 on 4×4 maps. The FAS coarse
# problem is `g_c = R r + A_c(R u)`, the correction `u ← u + P(w − R u)`.

# %%
N = 16 if SMALL else 32
x = (img - img.mean()) / img.std()
xb = np.concatenate([x] * 2) + 0.1 * rng.standard_normal((2, 1, 16, 16))
labels = np.array([0, 1])
net = build_network("conv", (1, 16, 16), 10, N, 4, 1.0, "tanh")
params = init_params(net, 0)
_, ref, _ = backprop(net, params, xb, labels)


def settings(relax="FCF", max_iter=30):
    return MGRITSettings(levels=3, cfactor=4, relax=relax, max_iter=max_iter, abs_tol=None,
                         rel_tol=1e-10, min_coarse=1)


fig = Figure(figsize=(10, 4.2))
axes = fig.subplots(1, 2)
ax = axes[0]
for ell, res in enumerate([(16, 16, 16), (16, 8, 4)]):
    for level in range(3):
        pts = np.arange(0, N + 1, 4**level)
        ax.scatter(pts, np.full(pts.shape, level + 0.25 * ell), s=8 + 12 * (res[level] / 4),
                   label=f"{'time only' if ell == 0 else 'space @1,2'}" if level == 0 else None)
        ax.text(N + 1, level + 0.25 * ell, f"{res[level]}²", fontsize=8, va="center")
ax.set(xlabel="layer (fine index)", ylabel="MGRIT level", title="time levels × resolutions")
ax.invert_yaxis()
ax.legend(fontsize=8)

ax = axes[1]
for name, sc in [("time only", None), ("space @1", SpatialCoarsening((1,))),
                 ("space @1,2", SpatialCoarsening((1, 2)))]:
    lp = LayerParallelSettings(settings(), settings(), spatial=sc)
    _, grads, info = layer_parallel_gradient(net, params, xb, labels, lp)
    err = relative_gradient_error(grads, ref)
    print(f"{name:11s} forward cycles {info.forward.iterations:2d}, adjoint "
          f"{info.backward.iterations:2d}, gradient error {err:.1e}")
    assert err < 1e-9  # converged: the sequential gradient whatever the coarse levels
    ax.semilogy(info.forward.norms, "o-", label=name)
ax.set(xlabel="MGRIT cycle", ylabel="fine C-point residual", title="forward solve")
ax.legend(fontsize=8)
fig.tight_layout()
show(fig, "10_coarsening_in_space_and_depth")

# %% [markdown]
# Spatial coarsening converges much more slowly here: the coarse levels cannot represent the
# fine maps' detail, and a ResNet step does not damp it (unlike a heat equation), so that part
# of the error is only carried forward by C-relaxation — one coarse interval per cycle. With
# F-relaxation alone (C-points changed only by `P(w − R u)`), the part `(I − P R) e` is never
# corrected at all: the solve stagnates, and refbraid refuses that combination.

# %%
stagnating = MGRITSettings(levels=3, cfactor=4, relax="F", max_iter=8, abs_tol=None,
                           rel_tol=None, min_coarse=1)
try:
    layer_parallel_gradient(net, params, xb, labels,
                            LayerParallelSettings(stagnating, stagnating,
                                                  spatial=SpatialCoarsening((1,))))
    raise AssertionError("F-relaxation with spatial coarsening should be refused")
except ValueError as err:
    print("refused:", str(err)[:90], "…")

# %% [markdown]
# ## 3. States that change shape
#
# A two-stage network: 8×8 maps, a 2×2 average pooling transition, 4×4 maps. The coarse
# step splits at the transition (it is applied exactly wherever it falls), so transitions
# need not be C-points; states are packed into one row per point for MGRIT.

# %%
staged = StagedNetwork(ConvLift(1, 2, 16, 16, "tanh"),
                       (Stage(ConvStep(2, 16, 16, "tanh"), N // 2),
                        Stage(ConvStep(2, 8, 8, "tanh"), N // 2)),
                       (Pool(2, (16, 16)),), Classifier((2, 8, 8), 10))
sp = staged_init(staged, 1)
_, sref, _ = staged_backprop(staged, sp, xb, labels)
_, sgrad, sinfo = staged_layer_parallel_gradient(
    staged, sp, xb, labels, LayerParallelSettings(settings(), settings(),
                                                  spatial=SpatialCoarsening((1,))))
serr = relative_gradient_error(sgrad, sref)
print(f"pooling stage + spatial coarsening: gradient error {serr:.1e} "
      f"({sinfo.forward.iterations} forward cycles)")
assert serr < 1e-9

# %% [markdown]
# ## 4. Coarsening in depth: a head start, and MG/Opt's coherence
#
# Train N/4 layers for an epoch, interpolate the weights in t to N/2, train, interpolate to N,
# and compare the N-layer network's accuracy with training from random weights for the same
# number of epochs at full depth. (Dense ResNet on the digits, gradient descent.)

# %%
xv, yv = digits.x_val.reshape(len(digits.x_val), -1), digits.y_val
xt, yt = digits.x_train.reshape(len(digits.x_train), -1), digits.y_train
deep = build_network("resnet", (64,), 10, 16 if SMALL else 32, 16, 3.0, "tanh")


def epoch(n, p, lr=0.1, batch=64):
    grad = sequential_gradient(n)
    for s in range(0, len(xt), batch):
        _, g, _ = grad(p, xt[s:s + batch], yt[s:s + batch])
        p = {k: p[k] - lr * g[k] for k in p}
    return p


epochs = 2 if SMALL else 5
plain, curve_plain = init_params(deep, 0), []
for _ in range(epochs):
    plain = epoch(deep, plain)
    curve_plain.append(evaluate(deep, plain, xv, yv)[1])
shallow = build_network("resnet", (64,), 10, deep.n_layers // 4, 16, 3.0, "tanh")
p = epoch(shallow, init_params(shallow, 0))
mid = build_network("resnet", (64,), 10, deep.n_layers // 2, 16, 3.0, "tanh")
p = epoch(mid, prolong_weights(p, mid.n_layers, "linear"))
p, curve_nested = prolong_weights(p, deep.n_layers, "linear"), []
for _ in range(epochs):
    p = epoch(deep, p)
    curve_nested.append(evaluate(deep, p, xv, yv)[1])
print("val accuracy, plain :", np.round(curve_plain, 3))
print("val accuracy, nested:", np.round(curve_nested, 3))
fig_nested = Figure(figsize=(5.5, 4.2))
ax = fig_nested.subplots()
ax.plot(range(1, epochs + 1), curve_plain, "o-", label="random init")
ax.plot(range(1, epochs + 1), curve_nested, "s-", label="nested N/4 → N/2 → N")
ax.set(xlabel="epochs at full depth", ylabel="validation accuracy", title="head start")
ax.legend(fontsize=8)
fig_nested.tight_layout()
show(fig_nested, "10_nested_initialisation")

# MG/Opt: the corrected coarse objective ψ_c = f_c − vᵀθ is first-order coherent
mg = MGOpt.build(deep, sequential_gradient, MGOptSettings(levels=2))
_, g, _ = mg.gradients[0](plain, xt[:32], yt[:32])
theta_c, v = mg.coarse_correction_term(0, plain, g, xt[:32], yt[:32])
_, g_c, _ = mg.gradients[1](theta_c, xt[:32], yt[:32])
want = restrict_gradient(g, mg.nets[1].n_layers)
gap = max(float(np.max(np.abs((g_c[k] - v[k]) - want[k]))) for k in want)
print(f"max |∇ψ_c(R θ) − Pᵀ ∇f(θ)| = {gap:.1e}")
assert gap < 1e-12

# %% [markdown]
# The shallow network's weights, interpolated in t, are a good ODE discretisation of the
# same flow, so the deep network starts near where a trained one would be. Measured
# time-to-accuracy for nested initialisation and MG/Opt, and spatial coarsening's cost and
# predicted speedup: docs/coarsening.md.

# %% [markdown]
# ## 5. Batch norm inside the parallel section, and its running statistics
#
# `--model conv-stages --batch-norm`: BN conv steps `y + h σ(BN(W * y))` in both stages and a
# BN transition after the pool. In training mode every MGRIT step normalises with the batch
# statistics of the state it is given (on any level); the running statistics are folded in
# once per training step from the final fine sweep (TorchBraid's rule). With converged MGRIT
# they are serial training's; with one cycle they come from that cycle's final sweep.

# %%
from refbraid.stages.model import ConvStagesModel  # noqa: E402
from refbraid.training.gradients import mgrit_gradient  # noqa: E402

bn_runs = {}
for label, kind in (("serial", None), ("converged MGRIT", (15, "FCF")),
                    ("one MGRIT F-cycle", (1, "F"))):
    model = ConvStagesModel((1, 8, 8), 10, 8, 2, 1.0, "tanh", batch_norm=True)
    p = model.init_params(np.random.default_rng(0))
    step_grad = (sequential_gradient(model) if kind is None else mgrit_gradient(
        model, LayerParallelSettings(*(MGRITSettings(levels=3, cfactor=2, relax=kind[1],
                                                     max_iter=kind[0], abs_tol=1e-13,
                                                     min_coarse=1),) * 2)))
    for s in range(0, 3 * 32, 32):
        _, g, _ = step_grad(p, xt[s:s + 32].reshape(-1, 1, 8, 8), yt[s:s + 32])
        p = {k: v - 0.1 * g[k] for k, v in p.items()}
    bn_runs[label] = model
    print(f"{label:16s} running-statistics updates: {model.updates}, "
          f"stage-1 running mean (layer 0): {np.round(model.running['stage1.running_mean'][0], 5)}")
for label in ("converged MGRIT", "one MGRIT F-cycle"):
    gap = max(float(np.max(np.abs(bn_runs[label].running[k] - v)))
              for k, v in bn_runs["serial"].running.items())
    print(f"{label} vs serial running statistics: max difference {gap:.1e}")
    assert label != "converged MGRIT" or gap < 1e-10
assert all(m.updates == 3 for m in bn_runs.values())

# %% [markdown]
# The running statistics are *state*, not weights: `checkpoint.npz` saves them beside the
# weights (`buffer/stage0.running_mean`, …), so `--resume` continues with them, and
# `--bias-control`'s exact backprops fold nothing into them. In depth a conv-stages network
# moves stage by stage (every stage halved; transitions copied; BN's γ, β moved like the
# convolution), and MG/Opt's coherence holds for it exactly as for the plain ResNet:

# %%
staged_model = ConvStagesModel((1, 8, 8), 10, 8, 2, 1.0, "tanh", batch_norm=True)
ps = staged_model.init_params(np.random.default_rng(1))
xs, ys = xt[:32].reshape(-1, 1, 8, 8), yt[:32]
mg_s = MGOpt.build(staged_model, sequential_gradient, MGOptSettings(levels=2))
_, g, _ = mg_s.gradients[0](ps, xs, ys)
theta_c, v = mg_s.coarse_correction_term(0, ps, g, xs, ys)
_, g_c, _ = mg_s.gradients[1](theta_c, xs, ys)
want = restrict_gradient(g, mg_s.nets[1].n_layers)
gap = max(float(np.max(np.abs((g_c[k] - v[k]) - want[k]))) for k in want)
print(f"stages {[st.n_layers for st in mg_s.nets[1].net.stages]} on the coarse level; "
      f"max |∇ψ_c(R θ) − Pᵀ ∇f(θ)| = {gap:.1e}")
assert gap < 1e-12


# %% [markdown]
# ## Exercises: the restriction R and its transpose
#
# 1. Write `restrict_average(x)`: (B, C, H, W) feature maps, H and W even, to (B, C, H/2, W/2),
#    each coarse cell the mean of its 2×2 block,
#    `(R x)[i, j] = (x[2i, 2j] + x[2i+1, 2j] + x[2i, 2j+1] + x[2i+1, 2j+1]) / 4`.
#    The check compares with `refbraid.mgrit.spatial.restrict` (what the coarse levels use).
# 2. Write its transpose `restrict_average_transpose(v)`: (B, C, h, w) to (B, C, 2h, 2w).
#    Hint: which fine cells does `v[i, j]` appear with in `<R x, v>`, and with what weight?
#    The check runs the dot-product test `<R x, v> = <x, Rᵀ v>` with the package's R (no
#    reference needed), then compares with `spatial.restrict_adjoint`. Compare your answer
#    with `spatial.interpolate(v, "constant")`: why is that not Rᵀ, and why can the adjoint
#    MGRIT solve not use it in its place?

# %%
from refbraid.lessons import exercises


def restrict_average(x):
    """2×2 average pooling of (B, C, H, W) feature maps: (B, C, H/2, W/2)."""
    raise NotImplementedError  # your code here


def restrict_average_transpose(v):
    """Rᵀ of the 2×2 average: (B, C, h, w) → (B, C, 2h, 2w), <R x, v> = <x, Rᵀ v>."""
    raise NotImplementedError  # your code here


exercises.check_restrict_average(restrict_average)
exercises.check_restrict_average_transpose(restrict_average_transpose)
