"""The cost model of refbraid/scaling/parallelisms.py on a machine with given step costs and
message parameters (nothing measured): each formula of its docstring, checked by hand."""

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.network import init_params
from refbraid.parallel.costs import StepCosts
from refbraid.scaling.parallelisms import (
    Cluster,
    all_splits,
    daso_bytes,
    daso_step,
    plain_dp_step,
    predict_split,
)
from refbraid.scaling.predict import calibrate_network, ring_allreduce
from refbraid.training.optim import make_optimizer

ALPHA, BETA = 1e-5, 1e-9


@pytest.fixture(scope="module")
def machine():
    net = build_network("conv", (1, 8, 8), 10, 64, 4, 1.0, "relu")
    params = init_params(net, 0)
    x = np.zeros((16, 1, 8, 8))
    y = np.zeros(16, dtype=np.int64)
    m = calibrate_network(net, params, x, y, LayerParallelSettings(), get_backend("numpy"),
                          optimizer=lambda: make_optimizer("adam", 1e-3), alpha=ALPHA,
                          beta=BETA, step_costs=StepCosts(forward=1e-4, backward=2e-4))
    return net, m, 16 * 4 * 8 * 8


def test_data_and_space_formulas(machine):
    net, m, row = machine
    serial = m.serial[16]
    one = predict_split(m, 1, 1, 1, 8, row)
    assert one.seconds == pytest.approx(serial) and one.bytes_per_rank == 0
    d2 = predict_split(m, 2, 1, 1, 8, row)
    assert d2.seconds == pytest.approx(m.serial[8] + ring_allreduce(m.grad_bytes, 2, ALPHA,
                                                                     BETA))
    s2 = predict_split(m, 1, 2, 1, 8, row)
    halo = 4 * net.n_layers * (ALPHA + row * BETA)
    ghost = (4 + 2) / 4  # 8 rows over 2 ranks: 4 owned + 2 ghost rows convolved
    assert s2.seconds == pytest.approx(serial / 2 * ghost + halo
                                       + ring_allreduce(m.grad_bytes, 2, ALPHA, BETA))
    assert s2.bytes_per_rank == pytest.approx(4 * net.n_layers * row + m.grad_bytes)
    assert predict_split(m, 1, 16, 1, 8, row) is None  # more space ranks than rows
    assert predict_split(m, 32, 1, 1, 8, row) is None  # more data groups than samples


def test_depth_and_combinations_exist_where_the_grid_allows(machine):
    _, m, row = machine
    assert predict_split(m, 1, 1, 4, 8, row) is not None  # 64 layers: 4 coarsest intervals
    assert predict_split(m, 1, 1, 8, 8, row) is None
    splits = all_splits(m, 8, 8, row)
    assert all(s.ranks == 8 for s in splits)
    assert [s.seconds for s in splits] == sorted(s.seconds for s in splits)
    assert {s.name for s in splits} >= {"D8", "S8", "D2×Q4", "S2×Q4"}


def test_daso_reduces_to_plain_inside_one_node_and_saves_across_nodes():
    cl = Cluster()
    n, c = 100e6, 0.25
    assert daso_step(c, n, 4, cl, every=8) == pytest.approx(plain_dp_step(c, n, 4, cl))
    assert daso_step(c, n, 64, cl, every=8, wait=2) < plain_dp_step(c, n, 64, cl)
    block = daso_step(c, n, 64, cl, every=8, wait=0)
    assert daso_step(c, n, 64, cl, every=8, wait=2) <= block < plain_dp_step(c, n, 64, cl)
    intra, inter = daso_bytes(n, 64, 4, every=8)
    assert inter == pytest.approx(2 * 15 / 16 * n / 4 / 8)
    assert intra > 0
