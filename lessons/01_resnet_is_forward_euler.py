# %% [markdown]
# # Lesson 01 — A ResNet is forward Euler
#
# A residual network updates its hidden state by adding a small correction:
#
#     y[n+1] = y[n] + h · σ(W[n] y[n] + b[n]),   n = 0..N-1,   h = T/N.
#
# Read `t_n = n·h` as time and `W[n] = W(t_n)`, `b[n] = b(t_n)` as samples of
# time-dependent weights: this is **forward Euler** for the ordinary differential equation
#
#     y'(t) = σ(W(t) y(t) + b(t)),   y(0) = x,   t ∈ [0, T]
#
# (Haber & Ruthotto 2017; E 2017; docs/references.md §1). So the forward pass of a deep ResNet
# is a time integration, and as the number of layers N grows with T fixed, `y[N]`
# converges to the ODE solution `y(T)` — with first-order accuracy, the error shrinking
# like `h = T/N`. That view is what makes layer-parallel training possible: a time
# integrator can be parallelised *across time* with multigrid (MGRIT), so a network can
# be parallelised across its layers.
#
# Run it in Jupyter (lesson 00 shows how) and each figure appears in its cell. Run as a
# script, `python lessons/01_resnet_is_forward_euler.py`, it saves
# them to `lesson_figures/01/` (`REFBRAID_LESSON_FIGURES=<folder>` picks another).
# `REFBRAID_LESSON_SMALL=1` makes a quick run.

# %%
import numpy as np
from matplotlib.figure import Figure

import refbraid
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.lessons import show, small

SMALL = small()

T = 2.0  # final time, fixed while the depth N grows
WIDTH = 2  # a 2-D state, so the trajectory can be drawn
ACT = "tanh"

# %% [markdown]
# ## Time-dependent weights
#
# We pick smooth weight functions: a rotation that speeds up over time plus a slow drift,
# and a bias that oscillates. Any smooth choice works; the point is that layer `n` gets
# the weights *at its time* `t_n`.

# %%
A = np.array([[0.0, -2.0], [2.0, 0.0]])  # rotation generator
B = np.array([[-0.5, 0.3], [0.1, -0.4]])  # slow drift


def W_of_t(t: float) -> np.ndarray:
    """W(t) = A + t B."""
    return A + t * B


def b_of_t(t: float) -> np.ndarray:
    """b(t) = 0.5 (sin 3t, cos 2t)."""
    return 0.5 * np.array([np.sin(3 * t), np.cos(2 * t)])


def rhs(t: float, y: np.ndarray) -> np.ndarray:
    """The ODE's right-hand side F(t, y) = σ(W(t) y + b(t)) for a batch y (B, 2)."""
    return np.tanh(y @ W_of_t(t).T + b_of_t(t))


# %% [markdown]
# ## The ResNet, built from refbraid's layers
#
# `refbraid.Network` = opening layer → N ODE steps → closing layer. The opening layer is the
# identity here (`DenseLift` with identity weights and activation), so `y[0] = x`; the
# closing layer is irrelevant for this lesson. The step parameters are stacked over layers:
# `steps.W[n] = W(t_n)`, `steps.b[n] = b(t_n)`.


# %%
def resnet(N: int) -> tuple[refbraid.Network, dict]:
    net = refbraid.Network(
        opening=DenseLift(WIDTH, WIDTH, "identity"),
        step=DenseStep(WIDTH, ACT),
        closing=Classifier((WIDTH,), 2),
        n_layers=N,
        T=T,
    )
    params = refbraid.init_params(net, seed=0)
    params["opening.W"], params["opening.b"] = np.eye(WIDTH), np.zeros(WIDTH)
    t = net.h * np.arange(N)  # t_n = n h
    params["steps.W"] = np.stack([W_of_t(tn) for tn in t])  # N,2,2
    params["steps.b"] = np.stack([b_of_t(tn) for tn in t])  # N,2
    return net, params


def resnet_states(N: int, x: np.ndarray) -> np.ndarray:
    """y[0..N] from refbraid's sequential forward pass; shape (N+1, B, 2)."""
    net, params = resnet(N)
    _, states, _ = refbraid.forward(net, params, x)
    return np.stack(states)


x = np.array([[1.0, 0.0], [0.0, -1.0], [-0.5, 0.8]])  # three starting points, B = 3

# One layer IS one Euler step: check it by hand for N = 4.
net4, params4 = resnet(4)
y = resnet_states(4, x)
by_hand = x + net4.h * rhs(0.0, x)  # y[1] = y[0] + h F(t_0, y[0])
print("one layer == one Euler step:", np.allclose(y[1], by_hand, rtol=0, atol=1e-15))
assert np.allclose(y[1], by_hand, rtol=0, atol=1e-15)

# %% [markdown]
# ## An accurate reference: classical Runge–Kutta (RK4)
#
# To measure the ResNet's error we need `y(T)` itself. RK4 is fourth-order accurate, so with
# a few thousand steps its error (≈ h⁴) is far below anything forward Euler reaches here.
# It is written out below, independently of refbraid.


# %%
def rk4(y0: np.ndarray, n_steps: int) -> np.ndarray:
    """RK4 trajectory of y' = F(t, y) on [0, T]; shape (n_steps+1, B, 2)."""
    h = T / n_steps
    ys = [y0]
    y = y0
    for k in range(n_steps):
        t = k * h
        k1 = rhs(t, y)
        k2 = rhs(t + h / 2, y + h / 2 * k1)
        k3 = rhs(t + h / 2, y + h / 2 * k2)
        k4 = rhs(t + h, y + h * k3)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        ys.append(y)
    return np.stack(ys)


reference = rk4(x, 1024 if SMALL else 4096)
y_T = reference[-1]

# %% [markdown]
# ## Convergence as the network gets deeper
#
# Fix T, double N again and again, and watch the error `max |y[N] − y(T)|` of the final
# state. For a first-order method each doubling halves the error, so the observed order
# `log2(e_N / e_2N)` should approach 1.

# %%
depths = [8, 16, 32, 64] if SMALL else [8, 16, 32, 64, 128, 256, 512]
errors = np.array([np.abs(resnet_states(N, x)[-1] - y_T).max() for N in depths])
orders = np.log2(errors[:-1] / errors[1:])
print(f"{'N':>5} {'h':>9} {'error':>10} {'order':>6}")
for i, N in enumerate(depths):
    order = f"{orders[i - 1]:6.3f}" if i else ""
    print(f"{N:5d} {T / N:9.5f} {errors[i]:10.3e} {order:>6}")

# %% [markdown]
# ## The figure: trajectories and the error
#
# Left: the ResNet's states `y[n]` (dots) for a shallow and a deeper network against the
# ODE trajectory (line). Right: the error against N on log-log axes, parallel to the slope −1
# line — first-order convergence.

# %%
fig = Figure(figsize=(9.0, 3.8), layout="constrained")
ax_traj, ax_err = fig.subplots(1, 2)
for b in range(x.shape[0]):
    ax_traj.plot(reference[:, b, 0], reference[:, b, 1], "k-", lw=1,
                 label="ODE (RK4)" if b == 0 else None)
for N, style in ((8, "o"), (32, ".")):
    states = resnet_states(N, x)
    for b in range(x.shape[0]):
        ax_traj.plot(states[:, b, 0], states[:, b, 1], style, ms=4, color=f"C{b}",
                     label=f"ResNet, N = {N}" if b == 0 else None)
ax_traj.set(xlabel="y₁", ylabel="y₂", title=f"trajectories on [0, T = {T:g}]")
ax_traj.legend(fontsize="small")
ax_err.loglog(depths, errors, "o-", label="max |y[N] − y(T)|")
ax_err.loglog(depths, errors[0] * depths[0] / np.array(depths), "k--", lw=1, label="∝ 1/N")
ax_err.set(xlabel="layers N (h = T/N)", ylabel="error at t = T",
           title="forward Euler: first order")
ax_err.legend(fontsize="small")
show(fig, "01_resnet_is_forward_euler")

# %% [markdown]
# ## Check
#
# The observed order is 1 to within a few per cent once h is small, and the error keeps
# falling as the network deepens: the ResNet's forward pass is forward Euler.

# %%
assert np.all(np.diff(errors) < 0), errors
assert abs(orders[-1] - 1.0) < 0.05, orders
print(f"observed order {orders[-1]:.3f} ≈ 1: a ResNet is forward Euler.")


# %% [markdown]
# ## Exercise: a ResNet forward pass, by hand
#
# Write the forward pass of the ResNet of this lesson yourself: given the input `x` (B, C),
# the stacked weights `W` (N, C, C), `b` (N, C) and the step `h`, return all states
# `y[0..N]` (shape (N+1, B, C)) of `y[n+1] = y[n] + h tanh(y[n] W[n]ᵀ + b[n])`, `y[0] = x`.
# The check compares with `refbraid.forward` and names the first state that is wrong. It
# prints TODO until you replace the `raise`; a reference solution is
# `refbraid.lessons.solutions.resnet_forward` (look only when stuck).

# %%
from refbraid.lessons import exercises


def resnet_forward(x, W, b, h):
    """y[n+1] = y[n] + h tanh(y[n] W[n]ᵀ + b[n]); return y[0..N], shape (N+1, B, C)."""
    raise NotImplementedError  # your code here


exercises.check_resnet_forward(resnet_forward)
