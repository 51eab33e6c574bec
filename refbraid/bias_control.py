"""Gradient-bias control for layer-parallel training.

Inexact MGRIT solves make the layer-parallel gradient g_LP a *biased* estimate of the
mini-batch gradient g. Early in training the bias is small against the noise of the
mini-batch gradient itself and costs nothing; near a minimum the noise shrinks with the
gradient, the bias does not, and training stalls. Every ``every`` steps, on the step's batch::

    g       = sequential backprop on the batch                         (exact)
    bias    = ‖g_LP − g‖₂
    g_i     = backprop on micro-batch i of M (the batch split in M)     i = 1..M
    noise   = √( Σ_i ‖g_i − ḡ‖² / (M (M − 1)) ),   ḡ = mean_i g_i   (std. error of a batch mean)
    ratio   = bias / noise

and beside them the proxy that needs no serial pass: the final forward and adjoint MGRIT
residual norms of the step (``fwd_res``, ``bwd_res``).

The controller (``--bias-control``):

* ``off`` — no measurement; ``measure`` — measure and log, change nothing;
* ``iterations`` — when ratio > ``threshold``: one more forward and one more adjoint cycle
  (up to ``max_iters`` each; with N/m cycles the two-level solve is exact);
* ``serial`` — when ratio > ``threshold``: sequential backprop for the rest of the run.

With ``signal = 'residual'`` the controllers act on the proxy instead, with no serial pass and
no measurement: when the step's final forward residual norm exceeds ``residual``. (Over the
201 measurements of the lm-reverse runs in docs/transformers_bias.md, log fwd_res and log
bias/noise correlate at +0.84, log bwd_res at +0.48.)

Every decision is logged with its numbers (step, ratio, bias, noise, residuals, the settings
before and after). Cost: one measurement is M + 1 sequential backprops; ``step_applications``
counts Φ applications of the training gradient (MGRIT's ``phi_calls``, 2N per serial
backprop: N forward steps, N adjoint steps), ``measure_applications`` those of the
measurements.

Batch norm (``--model conv-stages --batch-norm``): the running statistics are updated once per
training step, from the forward sweep of the gradient that is taken (the final fine MGRIT
sweep, or the serial forward pass once switched to serial), through ``record(info)``; the
measurement's backprops (whole batch and micro-batches) fold nothing into them. With BN the
loss of a batch is not a sum over samples (every sample is normalised with the batch's
statistics), so the micro-batch gradients g_i are gradients of micro-batch-normalised losses
and ``noise`` is an estimate of the spread of the gradient under resampling of the batch, not
of an exact batch mean: the ratio stays a heuristic signal there.

Under ``mpiexec`` the same rule runs in :mod:`refbraid.distributed.bias_control` (the
measurement on world rank 0 from gathered parameters, every rank deciding on its numbers).

Where this differs from the paper: the stored sources here give the paper's abstract only
(detect the transition, then switch to serial or raise the solve accuracy), not its exact
test; this module's test is the bias/noise ratio the issue describes, measured exactly
with sequential backprop beside the layer-parallel gradient.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backends import Backend
from .layer_parallel import LayerParallelSettings

BIAS_MODES = ("off", "measure", "iterations", "serial")
BIAS_SIGNALS = ("measured", "residual")


@dataclass(frozen=True)
class BiasControl:
    """The controller's settings (``refbraid train --bias-*`` flags)."""

    mode: str = "off"
    every: int = 10  # steps between measurements
    threshold: float = 1.0  # act when bias / noise exceeds it
    micro: int = 4  # micro-batches for the noise estimate
    max_iters: int = 8  # cap on forward/adjoint cycles in mode 'iterations'
    signal: str = "measured"  # 'measured' bias/noise, or the 'residual' proxy (no backprop)
    residual: float = 10.0  # proxy threshold on the final forward residual norm

    @property
    def acts(self) -> bool:
        return self.mode in ("iterations", "serial")

    def __post_init__(self):
        if self.mode not in BIAS_MODES:
            raise ValueError(f"`--bias-control` must be one of {BIAS_MODES}, got {self.mode!r}.")
        for name, lo in (("every", 1), ("micro", 2), ("max_iters", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise ValueError(f"`--bias-{name.replace('_', '-')}` must be an integer >= "
                                 f"{lo}, got {v!r}.")
        if self.signal not in BIAS_SIGNALS:
            raise ValueError(f"`--bias-signal` must be one of {BIAS_SIGNALS}, got "
                             f"{self.signal!r}.")
        if self.signal == "residual" and not self.acts:
            raise ValueError("`--bias-signal residual` needs `--bias-control iterations` or "
                             "`serial` (the proxy replaces the measurement; there is nothing "
                             f"to log with mode {self.mode!r}).")
        r = self.residual
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) \
                or r <= 0:
            raise ValueError(f"`--bias-residual` must be a positive number, got {r!r}.")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) \
                or t <= 0:
            raise ValueError(f"`--bias-threshold` must be a positive number, got {t!r}.")


def _flat(grads: dict[str, Any], keys, bk: Backend) -> np.ndarray:
    return np.concatenate([np.ravel(bk.to_numpy(grads[k])) for k in keys])


def bias_and_noise(backprop, params, x, labels, g_lp, micro: int, bk: Backend) -> dict:
    """bias, noise, ratio (module docstring) and the relative bias ‖g_LP − g‖ / ‖g‖."""
    keys = sorted(params)
    _, g, _ = backprop(params, x, labels)
    exact = _flat(g, keys, bk)
    bias = float(np.linalg.norm(_flat(g_lp, keys, bk) - exact))
    parts = [p for p in np.array_split(np.arange(x.shape[0]), micro) if p.size]
    if len(parts) < 2:
        raise ValueError(f"the noise needs at least 2 micro-batches; the batch has "
                         f"{x.shape[0]} sample(s).")
    gs = np.stack([_flat(backprop(params, x[p], labels[p])[1], keys, bk) for p in parts])
    M = gs.shape[0]
    noise = float(np.sqrt(((gs - gs.mean(axis=0)) ** 2).sum() / (M * (M - 1))))
    return {"bias": bias, "noise": noise, "bias_ratio": bias / noise if noise > 0 else math.inf,
            "rel_bias": bias / max(float(np.linalg.norm(exact)), 1e-300),
            "micro_batches": M}


def more_iterations(settings: LayerParallelSettings, cap: int) -> LayerParallelSettings:
    """One more forward and one more adjoint cycle, each at most ``cap`` (the rest of the
    settings, e.g. spatial coarsening, kept)."""
    f, b = settings.forward, settings.backward
    return dataclasses.replace(
        settings, forward=dataclasses.replace(f, max_iter=min(f.max_iter + 1, cap)),
        backward=dataclasses.replace(b, max_iter=min(b.max_iter + 1, cap)))


class ControlledGradient:
    """The layer-parallel gradient with bias measurement and control (module docstring).

    ``backprop(params, x, labels)`` and ``layer_parallel(params, x, labels, settings)`` are the
    model's two gradients; ``forwards`` = (sequential logits, MGRIT logits(settings)) for
    evaluation; ``n_layers`` prices a serial backprop at 2N step applications, and the
    ``serial_steps`` a layer-parallel gradient runs outside MGRIT (buffer layers) add 2 each.
    ``record(info)`` is called once per call with the info of the gradient taken (batch norm's
    running statistics; module docstring), never for the measurement's backprops.
    """

    def __init__(self, backprop, layer_parallel, forwards, settings: LayerParallelSettings,
                 control: BiasControl, n_layers: int, bk: Backend, say=print,
                 serial_steps: int = 0, record=None):
        self.backprop, self.layer_parallel = backprop, layer_parallel
        self.record = record if record is not None else (lambda info: None)
        self.sequential_logits, self.mgrit_logits = forwards
        self.settings, self.control, self.n_layers, self.bk = settings, control, n_layers, bk
        self.say, self.serial_steps = say, serial_steps
        self.serial = False
        self.calls = 0
        self.step_applications = 0.0
        self.measure_applications = 0.0
        self.measurements: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []

    def _iters(self) -> tuple[int, int]:
        return self.settings.forward.max_iter, self.settings.backward.max_iter

    def __call__(self, params, x, labels):
        self.calls += 1
        if self.serial:
            loss, grads, info = self.backprop(params, x, labels)
            stats = {"serial": 1.0, "phi_calls": 2.0 * self.n_layers}
        else:
            loss, grads, info = self.layer_parallel(params, x, labels, self.settings)
            stats = {**info.stats(), "serial": 0.0}
            stats["phi_calls"] += 2.0 * self.serial_steps
        self.record(info)  # the step taken, once (batch norm's running statistics)
        self.step_applications += stats["phi_calls"]
        due = self.due()
        if due and self.control.signal == "residual":  # the proxy: no serial pass
            self.check_residual(stats)
        elif due:
            stats.update(self.take_measurement(self.measure(params, x, labels, grads), stats))
        return loss, grads, stats

    def measure(self, params, x, labels, grads) -> dict[str, Any]:
        """:func:`bias_and_noise` of the layer-parallel ``grads`` on this batch (M + 1
        sequential backprops)."""
        return bias_and_noise(self.backprop, params, x, labels, grads, self.control.micro,
                              self.bk)

    def due(self) -> bool:
        """Whether this call (``calls`` counts it already) measures or checks the proxy."""
        return not self.serial and self.control.mode != "off" \
            and self.calls % self.control.every == 0

    def check_residual(self, stats) -> None:
        """The proxy rule: act when the step's final forward residual exceeds ``residual``."""
        if stats["fwd_res"] > self.control.residual:
            fwd, bwd = self._iters()
            self._decide({"step": self.calls, "fwd_res": stats["fwd_res"],
                          "bwd_res": stats["bwd_res"], "fwd_iters": fwd, "bwd_iters": bwd})

    def take_measurement(self, m: dict[str, Any], stats) -> dict[str, float]:
        """Log measurement ``m`` (:func:`bias_and_noise`) and act on it; the step's stats."""
        self.measure_applications += 2.0 * self.n_layers * (m["micro_batches"] + 1)
        fwd, bwd = self._iters()
        record = {"step": self.calls, **m, "fwd_res": stats["fwd_res"],
                  "bwd_res": stats["bwd_res"], "fwd_iters": fwd, "bwd_iters": bwd}
        self.measurements.append(record)
        if self.control.acts and m["bias_ratio"] > self.control.threshold:
            self._decide(record)
        return {k: float(m[k]) for k in ("bias", "noise", "bias_ratio", "rel_bias")}

    def _decide(self, record: dict[str, Any]) -> None:
        before = self._iters()
        if self.control.mode == "serial":
            self.serial, action = True, "switch to serial backprop"
        else:
            self.settings = more_iterations(self.settings, self.control.max_iters)
            after = self._iters()
            action = (f"MGRIT cycles forward/adjoint {before[0]}/{before[1]} -> "
                      f"{after[0]}/{after[1]}" if after != before else
                      f"MGRIT cycles already at the cap {self.control.max_iters}: no change")
        decision = {**record, "action": action}
        self.decisions.append(decision)
        if "bias_ratio" in record:
            why = (f"bias/noise {record['bias_ratio']:.3g} > {self.control.threshold:g} (bias "
                   f"{record['bias']:.3g}, noise {record['noise']:.3g}, ")
        else:
            why = f"forward residual > {self.control.residual:g} ("
        self.say(f"bias control at step {record['step']}: {why}fwd_res {record['fwd_res']:.3g}, "
                 f"bwd_res {record['bwd_res']:.3g}): {action}")

    def logits(self, params, x):
        """The forward pass training currently uses: MGRIT's, or the sequential one once the
        controller switched to serial."""
        if self.serial:
            return self.sequential_logits(params, x)
        return self.mgrit_logits(params, x, self.settings.forward)

    def summary(self) -> dict[str, Any]:
        """What ``bias_control.json`` holds."""
        return {"control": dataclasses.asdict(self.control), "serial": self.serial,
                "final_iters": list(self._iters()),
                "step_applications": self.step_applications,
                "measure_applications": self.measure_applications,
                "measurements": self.measurements, "decisions": self.decisions}
