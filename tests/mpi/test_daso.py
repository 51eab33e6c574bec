"""DASO (refbraid/distributed/daso.py) under mpiexec, against plain data parallelism and against a
one-process simulation of the same schedule.

* k = 1, every node count G dividing the world: the parameters after several Adam steps are
  bit-identical to plain data parallelism (DistributedGradient over all ranks);
* k > 1 with SGD: every rank's parameters equal a one-process simulation of DASO (node
  gradients by backprop on the node's samples, stale merges, end-of-epoch averages) to
  round-off, and every epoch ends with the same parameters on every rank.
"""

import numpy as np
import pytest

from refbraid.distributed.daso import (
    DasoGradient,
    DasoSchedule,
    initial_rate,
    stale_merge,
)
from refbraid.distributed.engine import shard_sizes
from refbraid.distributed.network import DistributedGradient
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import backprop, init_params
from refbraid.parallel.mpi import split_world
from refbraid.training.optim import make_optimizer

EXACT = LayerParallelSettings.exact()


def _net():
    return build_network("resnet", (2,), 3, 4, 4, 1.0, "tanh")


def _batches(net, n, B=12, seed=3):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((B, 2)), rng.integers(0, 3, B)) for _ in range(n)]


class _State:  # what fit hands the epoch hooks
    def __init__(self, params, optimizer):
        self.params, self.optimizer = params, optimizer


def _train(gradient, params, optimizer, epochs, batches):
    state = _State(params, optimizer)
    for epoch in range(1, epochs + 1):
        if hasattr(gradient, "begin_epoch"):
            gradient.begin_epoch(epoch)
        total = 0.0
        for x, y in batches:
            loss, grads, _ = gradient(state.params, x, y)
            state.optimizer.step(state.params, grads)
            total += loss
        if hasattr(gradient, "end_epoch"):
            gradient.end_epoch(epoch, state, total / len(batches))
    return state.params


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def test_k1_is_plain_data_parallelism_bit_for_bit(world):
    net = _net()
    batches = _batches(net, 4)
    plain = DistributedGradient(net, split_world(world.size), EXACT)
    want = _train(plain, init_params(net, 0), make_optimizer("adam", 1e-2), 3, batches)
    for groups in _divisors(world.size):
        daso = DasoGradient(net, DasoSchedule(groups=groups, max_global_skips=1), 3, EXACT)
        got = _train(daso, init_params(net, 0), make_optimizer("adam", 1e-2), 3, batches)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"G={groups} {k}")
        assert daso.counts["local_steps"] == 0 and daso.counts["sync_steps"] == 12


def _simulate(net, schedule, epochs, batches, size, lr):
    """One process: G node copies of θ, SGD, the DASO schedule of the module docstring."""
    G, L = schedule.groups, size // schedule.groups
    theta = [init_params(net, 0) for _ in range(G)]
    rate = initial_rate(schedule)
    for epoch in range(1, epochs + 1):
        phase = schedule.phase(epoch, epochs)
        pending = []
        for b, (x, y) in enumerate(batches):
            sizes = shard_sizes(x.shape[0], size)
            if phase != "cycling":
                _, g, _ = backprop(net, theta[0], x, y)
                for t in theta:
                    for k in t:
                        t[k] = t[k] - lr * g[k]
                continue
            for _, sent in [p for p in pending if p[0] <= b]:
                for t in theta:
                    for k in t:
                        t[k] = stale_merge(t[k], sent[k], G, rate.wait)
            pending = [p for p in pending if p[0] > b]
            if b > 0 and b % rate.every == 0:
                sent = {k: sum(t[k] for t in theta) for k in theta[0]}
                if rate.wait == 0:
                    theta = [{k: sent[k] / G for k in sent} for _ in range(G)]
                else:
                    pending.append((b + rate.wait, sent))
            for g_, t in enumerate(theta):
                lo, hi = sum(sizes[: g_ * L]), sum(sizes[: (g_ + 1) * L])
                _, g, _ = backprop(net, t, x[lo:hi], y[lo:hi])
                for k in t:
                    t[k] = t[k] - lr * g[k]
        if phase == "cycling":
            for _, sent in pending:
                for t in theta:
                    for k in t:
                        t[k] = stale_merge(t[k], sent[k], G, rate.wait)
            mean = {k: sum(t[k] for t in theta) / G for k in theta[0]}
            theta = [dict(mean) for _ in range(G)]
    return theta[0]


@pytest.mark.parametrize("k", [2, 3, 8])
def test_k_above_1_equals_a_one_process_simulation(world, k):
    if world.size == 1:
        pytest.skip("one rank is one node: nothing to cycle")
    net = _net()
    batches = _batches(net, 7)
    for groups in [g for g in _divisors(world.size) if g > 1]:
        schedule = DasoSchedule(groups=groups, max_global_skips=k, adaptive=False,
                                warmup_epochs=1, cooldown_epochs=1)
        daso = DasoGradient(net, schedule, 4, EXACT)
        got = _train(daso, init_params(net, 0), make_optimizer("sgd", 0.1), 4, batches)
        want = _simulate(net, schedule, 4, batches, world.size, 0.1)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-13,
                                       err_msg=f"G={groups} k={k} {key}")
            everyone = world.allgather(got[key])
            for other in everyone:
                np.testing.assert_array_equal(other, everyone[0])
        assert daso.counts["local_steps"] == 2 * len(batches)
        assert daso.bytes_sent["inter"] > 0 and daso.bytes_sent["intra"] >= 0


def test_bad_groups_raise_the_same_clear_error_everywhere(world):
    from refbraid.errors import CollectiveError

    with pytest.raises(CollectiveError, match="does not divide"):
        DasoGradient(_net(), DasoSchedule(groups=world.size + 1), 2, EXACT)
    with pytest.raises(ValueError, match="`max_global_skips` must be a positive integer"):
        DasoSchedule(max_global_skips=0)
