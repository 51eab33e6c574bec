"""The distributed training-step gradient (DistributedGradient, the MPI program) on the
virtual cluster: P ranks in one process, D data-parallel groups.

Oracles: the one-process layer-parallel gradient (bit for bit with one data-parallel group:
every row is computed by one rank from the same values, and summing it with zeros is exact;
to round-off with D = 2, whose groups sum shard gradients), the same run at other P (bit for
bit), the cost model's rules event by event, and a known answer (one rank, unit step costs,
α = β = 0: the step time is the number of step applications). The MPI run itself is the
oracle of tests/mpi/test_virtual_vs_mpi.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.models import build_network
from refbraid.network import init_params
from refbraid.parallel.ops import RowExchange, adjoint_mismatch
from refbraid.parallel.virtual import simulate, virtual_topology
from refbraid.scaling.virtual_training import simulate_distributed_gradient

#: 2 levels, cfactor 4, fixed cycles: 160 layers give 40 coarsest intervals (uneven for
#: P = 3, 6, 7), TorchBraid's 3 levels give 10 (uneven for P = 3, 4, 6, 7, 8)
L2 = LayerParallelSettings.with_iterations(2, 2, levels=2, cfactor=4)
TORCHBRAID = LayerParallelSettings()


def _case(kind: str, n_layers: int, B: int = 7):
    if kind == "resnet":
        net = build_network("resnet", (2,), 5, n_layers, 4, 3.0, "tanh")
    else:
        net = build_network("conv", (1, 5, 5), 3, n_layers, 2, 1.0, "relu")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, *net.opening.in_shape))
    return net, init_params(net, 0), x, rng.integers(0, net.closing.out_shape[0], B)


def _check_timeline(run, alpha: float, beta: float) -> None:
    """No rank does two things at once; every receive ends after its send plus α + β·bytes
    (exactly then when it waited); every copy of a collective ends when the last member
    arrived plus a cost ≥ 0, on every member at once."""
    tr = run.trace
    for r in tr.ranks:
        ev = tr.on_rank(r)
        for a, b in zip(ev, ev[1:], strict=False):
            assert b.t0 == a.t1 and b.t1 >= b.t0, f"rank {r}: {a} then {b}"
    pairs = tr.message_pairs()
    assert pairs
    for send, recv in pairs:
        assert recv is not None, f"unmatched {send}"
        arrival = send.t0 + alpha + beta * send.nbytes
        assert recv.t1 == max(recv.t0, arrival) and recv.nbytes == send.nbytes
    rounds: dict[int, list] = {}
    for e in tr.events:
        if e.is_collective:
            rounds.setdefault(e.seq, []).append(e)
    for copies in rounds.values():
        assert len({c.kind for c in copies}) == 1 and len({c.rank for c in copies}) == len(copies)
        assert len({c.t1 for c in copies}) == 1 and copies[0].t1 >= max(c.t0 for c in copies)
    assert run.wall_time == max(run.clocks)


@pytest.mark.parametrize("sharded", [True, False], ids=["sharded", "replicated"])
def test_dense_gradient_is_bit_identical_to_one_process_for_1_to_8_ranks(sharded):
    net, params, x, y = _case("resnet", 160)
    for settings in (L2, TORCHBRAID):
        loss0, g0, _ = layer_parallel_gradient(net, params, x, y, settings)
        for size in range(1, 9):
            out = simulate_distributed_gradient(net, params, x, y, size, 1, settings,
                                                costs=1.0, alpha=0.5, beta=1e-3,
                                                sharded=sharded)
            assert out.loss == loss0
            for k in g0:
                np.testing.assert_array_equal(out.grads[k], g0[k], err_msg=f"{k}, P = {size}")


def test_conv_gradient_is_bit_identical_to_one_process():
    net, params, x, y = _case("conv", 48, B=3)  # 12 coarsest intervals on 5 ranks: uneven
    loss0, g0, _ = layer_parallel_gradient(net, params, x, y, L2)
    for size in (2, 5):
        out = simulate_distributed_gradient(net, params, x, y, size, 1, L2, costs=1.0)
        assert out.loss == loss0
        for k in g0:
            np.testing.assert_array_equal(out.grads[k], g0[k], err_msg=f"{k}, P = {size}")


@pytest.mark.parametrize("kind", ["resnet", "conv"])
def test_two_data_parallel_groups_agree_for_every_layer_split(kind):
    net, params, x, y = _case(kind, 160 if kind == "resnet" else 48, B=7 if kind == "resnet"
                              else 3)  # shards of 4 and 3 (2 and 1) samples
    loss0, g0, _ = layer_parallel_gradient(net, params, x, y, L2)
    first = None
    for size in (2, 4, 6, 8) if kind == "resnet" else (2, 6):
        out = simulate_distributed_gradient(net, params, x, y, size, 2, L2, costs=1.0,
                                            alpha=0.1, beta=1e-6)
        assert out.loss == pytest.approx(loss0, rel=1e-13)
        for k in g0:
            np.testing.assert_allclose(out.grads[k], g0[k], rtol=1e-11, atol=1e-14, err_msg=k)
        first = first or out
        for k in g0:  # Q layer ranks per group change nothing in the bits
            np.testing.assert_array_equal(out.grads[k], first.grads[k], err_msg=f"{k} P={size}")


@pytest.mark.parametrize("size,groups", [(3, 1), (4, 2), (7, 1)])
def test_training_step_timeline_is_consistent(size, groups):
    net, params, x, y = _case("resnet", 160)
    alpha, beta = 0.3, 1e-4
    out = simulate_distributed_gradient(net, params, x, y, size, groups, TORCHBRAID,
                                        costs=1.0, alpha=alpha, beta=beta)
    _check_timeline(out.run, alpha, beta)
    kinds = {e.kind for e in out.run.trace.events}
    assert {"step", "send", "recv", "allreduce", "bcast", "alltoall"} <= kinds
    assert 0 < out.step_time <= out.run.wall_time - out.t0
    assert out.run.critical_path  # pairs collectives across groups by their round number


def test_one_rank_with_unit_costs_takes_one_second_per_step_application():
    net, params, x, y = _case("resnet", 160)
    out = simulate_distributed_gradient(net, params, x, y, 1, 1, TORCHBRAID, costs=1.0)
    assert out.step_time == out.stats["rank_phi_calls"] == out.stats["phi_calls"]


def test_communication_costs_add_to_the_step_time():
    net, params, x, y = _case("resnet", 160)
    free = simulate_distributed_gradient(net, params, x, y, 4, 2, L2, costs=1.0)
    slow = simulate_distributed_gradient(net, params, x, y, 4, 2, L2, costs=1.0, alpha=1.0)
    assert slow.step_time > free.step_time
    for k in free.grads:
        np.testing.assert_array_equal(slow.grads[k], free.grads[k])


def test_subgroup_collectives_values_and_costs():
    def body(comm):
        topo = virtual_topology(comm, 2)  # 6 ranks: groups {0,1,2}, {3,4,5}
        layer, data = topo.layer, topo.data
        got = layer.alltoall([f"{layer.rank}->{q}" for q in range(layer.size)])
        part = layer.scatter([np.full(2, q) for q in range(3)] if layer.rank == 1 else None, 1)
        total = data.sum_to_all(np.full(4, comm.rank, np.float64))
        norm = layer.allreduce_sum(1.0)  # over the whole world
        return got, part, total, norm, (layer.rank, data.rank, topo.group)

    run = simulate(body, 6, alpha=1.0, beta=0.0)
    for w, (got, part, total, norm, ranks) in enumerate(run.results):
        g, q = divmod(w, 3)
        assert ranks == (q, g, g)
        assert got == [f"{p}->{q}" for p in range(3)]
        np.testing.assert_array_equal(part, np.full(2, q))
        np.testing.assert_array_equal(total, np.full(4, float(q + q + 3)))
        assert norm == 6.0
    # alltoall and scatter over 3 ranks: 2 rounds each; the ring over 2: 2α; the world
    # allreduce over 6: 3 rounds; every clock started at 0
    assert run.clocks == (9.0,) * 6


def test_row_exchange_on_the_virtual_cluster_passes_the_dot_product_test():
    def body(comm):
        rng = np.random.default_rng(comm.rank)
        owned = [2 * comm.rank, 2 * comm.rank + 1]
        needed = sorted({(2 * comm.rank + 2) % (2 * comm.size), (2 * comm.rank + 5)
                         % (2 * comm.size)})
        op = RowExchange(comm, owned, needed)
        x = {i: rng.standard_normal(3) for i in owned}
        y = {i: rng.standard_normal(3) for i in needed}
        return adjoint_mismatch(op, x, y)

    for size in (1, 3, 4):
        assert max(simulate(body, size).results) <= 1e-14


def test_bad_splits_raise_the_mpi_errors():
    net, params, x, y = _case("resnet", 160)
    with pytest.raises(ValueError, match="data_parallel"):
        simulate_distributed_gradient(net, params, x, y, 3, 2, L2)
    with pytest.raises(ValueError, match="exceed"):
        simulate_distributed_gradient(net, params, x, y, 11, 1, TORCHBRAID)
