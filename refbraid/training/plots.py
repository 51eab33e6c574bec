"""Plots of a training run; each returns a matplotlib Figure and never shows it.

* :func:`plot_training_curves` — loss and accuracy per epoch from a log history;
* :func:`plot_decision_regions` — a 2-D data set (Peaks) and the classes the network predicts
  on a grid over the input box;
* :func:`plot_trajectories` — the states y[n], n = 0..N, of a few samples as they flow through
  the layers (the discrete ODE trajectories), projected on their two principal directions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import ScalarFormatter

from ..backends import get_backend
from ..network import forward

GRID = 200  # points per axis of the decision-region grid


def run_title(meta: dict[str, Any], data_name: str = "") -> str:
    """A figure title naming the run: data, model, depth and how the gradient is computed.

    ``meta`` is the summary at the top of ``log.json`` (:func:`refbraid.training.run.
    run_summary`), two lines, e.g. "peaks: resnet, 64 layers" and "layer-parallel MGRIT:
    3 levels, cfactor 4, 1 forward / 0 adjoint cycles after the skipped first" (or "sequential
    backprop").
    """
    config = meta.get("config") or {}
    data = data_name or (meta.get("data") or {}).get("name", "")
    head = ": ".join(filter(None, [data, meta.get("model", "")]))
    layers = (meta.get("network") or {}).get("layers")
    if layers:
        head += f", {layers} layers"
    return "\n".join(filter(None, [head, _gradient_words(meta.get("gradient", ""), config)]))


def _gradient_words(gradient: str, config: dict[str, Any]) -> str:
    """How a run computes its gradient, in words (its MGRIT settings when layer-parallel)."""
    if config.get("serial") or gradient == "sequential":
        return "sequential backprop"
    if not config:
        return gradient
    words = f"layer-parallel MGRIT: {config.get('levels')} levels"
    if config.get("cfactor"):
        words += f", cfactor {config['cfactor']}"
    fwd, bwd = config.get("fwd_iters"), config.get("bwd_iters")
    if fwd is not None and bwd is not None:
        words += f", {fwd} forward / {bwd} adjoint cycles after the skipped first"
    return words


def _series(history: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
    """``key`` of every epoch, NaN where an epoch has none (a resumed run may switch between
    layer-parallel and sequential training, and only the former measures some keys)."""
    return [scale * r[key] if r.get(key) is not None else np.nan for r in history]


def plot_training_curves(history: list[dict[str, Any]], title: str | None = None) -> Figure:
    """Two panels: train/validation loss and train/validation accuracy against the epoch.

    A layer-parallel run's accuracy is measured with the forward pass it trains (the MGRIT
    solve, labelled so); when the history also holds ``val_acc_sequential_forward``, the same
    weights under the exact sequential forward pass are drawn beside it. A history that
    switches between layer-parallel and sequential epochs (``--resume RUN --serial``) draws
    each series where it was measured and marks the switch.
    """
    fig = Figure(figsize=(8.0, 3.4), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    epochs = [r["epoch"] for r in history]
    for key, label, style in (("train_loss", "train", "-"), ("val_loss", "validation", "--")):
        ax_loss.plot(epochs, _series(history, key), style, label=label)
    exact = [r.get("val_acc_sequential_forward") is not None for r in history]
    trained = " (trained forward: MGRIT)" if all(exact) else ""
    for key, label, style in (("train_acc", "train" + trained, "-"),
                              ("val_acc", "validation" + trained, "--"),
                              ("val_acc_sequential_forward", "validation (exact forward)", ":")):
        values = _series(history, key, 100.0)
        if not np.all(np.isnan(values)):
            ax_acc.plot(epochs, values, style, marker="." if len(epochs) < 30 else None,
                        label=label)
    for prev, here, epoch in zip(exact, exact[1:], epochs[1:], strict=False):
        if prev != here:  # a resumed run switched how it computes the gradient
            before, after = ("sequential", "layer-parallel") if here else \
                ("layer-parallel", "sequential")
            for ax in (ax_loss, ax_acc):
                ax.axvline(epoch - 0.5, color="0.5", lw=1, ls="-.")
            ax_acc.text(epoch - 0.5, 3, f"{before} ", ha="right", fontsize="small", color="0.3")
            ax_acc.text(epoch - 0.5, 3, f" {after}", ha="left", fontsize="small", color="0.3")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy loss", yscale="log")
    low, high = ax_loss.get_ylim()
    if high < 10 * low:  # less than a decade: plain numbers, not 1.4×10⁰
        for axis in (ax_loss.yaxis.set_major_formatter, ax_loss.yaxis.set_minor_formatter):
            axis(ScalarFormatter())
    for ax in (ax_loss, ax_acc):
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", ylim=(0, 100))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig


def predict(net, params, x, bk="numpy", batch: int = 4096) -> np.ndarray:
    """Predicted classes argmax logits for inputs x (n, *in_shape), in chunks."""
    bk = get_backend(bk)
    out = []
    for s in range(0, x.shape[0], batch):
        logits, _, _ = forward(net, params, bk.asarray(x[s : s + batch]), bk, keep=False)
        out.append(bk.to_numpy(logits).argmax(axis=1))
    return np.concatenate(out)


def plot_decision_regions(net, params, dataset, bk="numpy", n_points: int = 600,
                          label_fn: Callable[[np.ndarray], np.ndarray] | None = None) -> Figure:
    """Left: the 2-D data (validation points, true class; with ``label_fn`` mapping raw points
    (n, 2) to labels, also the true regions, faint). Right: predicted class on a grid over the
    input box, with the validation points it gets wrong marked."""
    if tuple(dataset.input_shape) != (2,):
        raise ValueError(f"`dataset` must be 2-D (input shape (2,)), got {dataset.input_shape}.")
    box = float(dataset.info.get("box", 3.0))
    t = np.linspace(-box, box, GRID)
    X, Y = np.meshgrid(t, t)
    grid = dataset.normalise(np.stack([X.ravel(), Y.ravel()], axis=1))
    regions = predict(net, params, grid, bk).reshape(X.shape)
    raw_val = dataset.x_val * dataset.std + dataset.mean  # back to [-box, box]²
    k = min(n_points, dataset.n_val)
    pts, labels = raw_val[:k], dataset.y_val[:k]
    wrong = predict(net, params, dataset.x_val[:k], bk) != labels

    fig = Figure(figsize=(8.0, 3.8), layout="constrained")
    ax_data, ax_pred = fig.subplots(1, 2, sharey=True)
    cmap, levels = "viridis", np.arange(dataset.n_classes + 1) - 0.5
    if label_fn is not None:
        truth = label_fn(np.stack([X.ravel(), Y.ravel()], axis=1)).reshape(X.shape)
        ax_data.contourf(X, Y, truth, levels=levels, cmap=cmap, alpha=0.25)
    sc = ax_data.scatter(pts[:, 0], pts[:, 1], c=labels, cmap=cmap, s=8,
                         vmin=levels[0], vmax=levels[-1])
    ax_data.set_title(f"{dataset.name}: validation points, true classes")
    ax_pred.contourf(X, Y, regions, levels=levels, cmap=cmap, alpha=0.8)
    ax_pred.scatter(pts[wrong, 0], pts[wrong, 1], marker="x", c="red", s=14,
                    label=f"misclassified ({wrong.sum()}/{k})")
    ax_pred.set_title("learned decision regions")
    ax_pred.legend(loc="lower right", fontsize="small")
    for ax in (ax_data, ax_pred):
        ax.set(xlim=(-box, box), ylim=(-box, box), xlabel="x", aspect="equal")
    ax_data.set_ylabel("y")
    fig.colorbar(sc, ax=[ax_data, ax_pred], ticks=range(dataset.n_classes), label="class")
    return fig


def plot_trajectories(net, params, x, labels, n_classes: int, bk="numpy") -> Figure:
    """States y[0..N] of the samples x (n, *in_shape), flattened and projected on the two
    leading principal directions of all the states; colour = class, ○ start, ● end."""
    bk = get_backend(bk)
    _, states, _ = forward(net, params, bk.asarray(x), bk, keep=True)
    Y = np.stack([bk.to_numpy(s).reshape(s.shape[0], -1) for s in states], axis=1)  # n,N+1,C
    flat = Y.reshape(-1, Y.shape[-1])
    centre = flat.mean(axis=0)
    _, _, vt = np.linalg.svd(flat - centre, full_matrices=False)
    P = (Y - centre) @ vt[:2].T  # n,N+1,2
    fig = Figure(figsize=(5.0, 4.4), layout="constrained")
    ax = fig.subplots()
    colors = [f"C{c % 10}" for c in range(n_classes)]
    for traj, c in zip(P, np.asarray(labels), strict=True):
        ax.plot(traj[:, 0], traj[:, 1], "-", color=colors[c], lw=1, alpha=0.7)
        ax.plot(*traj[0], "o", mfc="none", color=colors[c], ms=4)
        ax.plot(*traj[-1], "o", color=colors[c], ms=5)
    for c in range(n_classes):
        ax.plot([], [], "-", color=colors[c], label=f"class {c}")
    ax.set(xlabel="principal direction 1", ylabel="principal direction 2",
           title=f"y[n], n = 0..{net.n_layers}: samples flowing through the layers")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def plot_solver_history(history: list[dict[str, Any]], title: str | None = None) -> Figure | None:
    """Per-epoch mean final MGRIT residual norms (forward, adjoint) and, where measured, the
    relative gradient error against sequential backprop; None for a run without MGRIT stats.

    Training runs a fixed number of MGRIT cycles, so these residuals are what those cycles
    leave, not a convergence history: they follow the weights (a larger ‖W‖ makes each
    layer's map less contractive) and rise as training grows them. The figure says so under
    the axes, and draws the first epoch's forward residual as a reference line.
    """
    epochs = [r["epoch"] for r in history]
    series = {
        "forward residual": [(r.get("stats") or {}).get("fwd_res") for r in history],
        "adjoint residual": [(r.get("stats") or {}).get("bwd_res") for r in history],
        "gradient rel. error": [(r.get("stats") or {}).get("grad_error") for r in history],
    }
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    if not series:
        return None
    fig = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = fig.subplots()
    drawn = 0
    for (label, values), style in zip(series.items(), ("o-", "s-", "^--"), strict=False):
        pts = [(e, v) for e, v in zip(epochs, values, strict=True) if v is not None and v > 0]
        if pts:
            line, = ax.semilogy([p[0] for p in pts], [p[1] for p in pts], style, ms=3,
                                label=label)
            if label == "forward residual":
                ax.axhline(pts[0][1], color=line.get_color(), lw=0.8, ls=":",
                           label=f"forward residual at epoch {pts[0][0]} ({pts[0][1]:.3g})")
            drawn += 1
    ax.set(xlabel="epoch", ylabel="mean over the epoch's batches (2-norm)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, which="both")
    if drawn:
        ax.legend(fontsize="small")
    else:  # one MGRIT level: sequential substitution leaves no residual
        ax.text(0.5, 0.5, "all residuals are zero (exact solves)", ha="center",
                transform=ax.transAxes)
    ax.set_title(title or "layer-parallel MGRIT: final residuals per batch", fontsize="medium")
    fig.text(0.01, 0.005, "A fixed number of MGRIT cycles per solve: the residual is what they "
             "leave, not a convergence history.\nIt follows the weights (larger ‖W‖, less "
             "contractive layers) and rises as training grows them;\nwhat it costs the gradient: "
             "gradient_error.png (final weights), --check-gradient-every (during training).",
             fontsize="x-small", color="0.3", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.12, 1, 0.88))
    return fig
