"""``--bias-control`` under ``mpiexec``: the controller of
:mod:`refbraid.bias_control` over ranks (training owns the rule; this is its MPI).

The training gradient is the distributed one (:class:`~refbraid.distributed.sharded.ShardedGradient`
for the layer-parallel models, :class:`~refbraid.distributed.gru.SequenceParallelGRU`
for the GRUs). Every ``every`` steps the controller needs, on the step's batch, the exact
gradient g and the micro-batch gradients g_i (bias = ‖g_LP − g‖, noise from the g_i). Here
they are computed **serially on gathered data**, on world rank 0::

    θ, g_LP  gathered on world rank 0              (collective: the shards' rows stacked)
    m = core.measure(θ, x, y, g_LP)                on rank 0 only: M + 1 sequential backprops
    m  broadcast from rank 0                       every rank now holds the same numbers
    every rank applies the same rule to m          (ControlledGradient.take_measurement)

so every rank takes the same decision, by construction (the rule is deterministic and sees
the same floats), and only rank 0 prints it and writes ``bias_control.json``. The residual
proxy (``--bias-signal residual``) uses the step's final forward residual norm, which MGRIT
reduces over the whole world; rank 0's value is broadcast all the same.

After a decision every rank rebuilds the distributed gradient with the new MGRIT cycles
(``iterations``; collective, the layer blocks are unchanged), or switches to serial backprop
(``serial``): then each step gathers θ on rank 0, which runs backprop on the full batch, and
every rank takes its shard of the broadcast gradient. That is sequential training, not
parallel: it matches one process bit for bit and is as slow as one process (plus messages).

Against one process: with pure layer (sequence) parallelism the layer-parallel gradient, the
measurements, the decisions and the trained parameters are bit-identical; with data
parallelism the gradient differs by round-off, so the measured numbers do, and a ratio within
round-off of the threshold could decide differently (the tests use ratios far from it).

Cost per measurement: two gathers and one broadcast of the parameters' size, M + 1 backprops
on rank 0 while the others wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine import WorldHooks


def _quiet(*args, **kwargs) -> None:
    return None


class MPIControlledGradient(WorldHooks):
    """The controlled layer-parallel gradient over MPI (module docstring).

    ``core`` is the single-process :class:`ControlledGradient` of the same model and flags
    (its rule, its bookkeeping, its sequential backprop and logits); ``build(settings)`` makes
    the distributed gradient for MGRIT ``settings`` (collective). Trainer hooks: ``is_root``,
    ``logits``, ``share``, ``localize``, ``gather_params``, ``gather_optimizer`` (see
    :func:`refbraid.training.trainer.fit`).
    """

    __name__ = "layer-parallel-mpi-bias-control"

    def __init__(self, core, build: Callable[[Any], Any], world):
        self.core, self.build, self.world = core, build, world
        self.inner = build(core.settings)
        if not self.is_root:
            core.say = _quiet

    # -- the trainer's hooks --------------------------------------------------------------
    @property
    def decisions(self) -> list[dict[str, Any]]:
        return self.core.decisions

    def summary(self) -> dict[str, Any]:
        """What ``bias_control.json`` holds (the same on every rank; rank 0 writes it)."""
        return self.core.summary()

    def localize(self, state) -> None:
        self.inner.localize(state)

    def gather_params(self, shard, root: int = 0):
        return self.inner.gather_params(shard, root)

    def gather_optimizer(self, optimizer, params, root: int = 0):
        return self.inner.gather_optimizer(optimizer, params, root)

    def logits(self, params, x):
        """The forward pass training now uses (MGRIT's at the current cycles, or the
        sequential one after a switch), on full params in this process."""
        return self.core.logits(params, x)

    # -- full arrays on rank 0, and back ----------------------------------------------------
    def _full(self, local: dict[str, Any]) -> dict[str, Any] | None:
        """Full arrays (params or gradient) on world rank 0, None elsewhere. Collective."""
        return self.inner.gather_params(local)

    def _local(self, full: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's full arrays, as this rank holds them (its shard). Collective."""
        full = self.world.bcast(full if self.is_root else None)
        shard = getattr(self.inner, "gradient", self.inner).shard  # ShardedGradient or GRU
        return shard(full)

    # -- one step ---------------------------------------------------------------------------
    def __call__(self, params, x, labels):
        core = self.core
        core.calls += 1
        if core.serial:  # sequential backprop of the full batch on rank 0
            full = self._full(params)
            loss, grads = (None, None)
            if self.is_root:
                loss, grads, _ = core.backprop(full, x, labels)
                loss = float(loss)
            loss, grads = self.world.bcast(loss), self._local(grads)
            stats = {"serial": 1.0, "phi_calls": 2.0 * core.n_layers}
        else:
            loss, grads, stats = self.inner(params, x, labels)
            stats = {**stats, "serial": 0.0}
            stats["phi_calls"] += 2.0 * core.serial_steps
        core.step_applications += stats["phi_calls"]
        if not core.due():
            return loss, grads, stats
        before = core.settings
        if core.control.signal == "residual":
            fwd_res, bwd_res = self.world.bcast((stats["fwd_res"], stats["bwd_res"]))
            core.check_residual({**stats, "fwd_res": fwd_res, "bwd_res": bwd_res})
        else:
            full_params, full_grads = self._full(params), self._full(grads)
            m = None
            if self.is_root:
                m = core.measure(full_params, x, labels, full_grads)
            stats.update(core.take_measurement(self.world.bcast(m), stats))
        if core.settings != before:  # more MGRIT cycles: every rank rebuilds together
            self.inner = self.build(core.settings)
        return loss, grads, stats
