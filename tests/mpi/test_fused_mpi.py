"""The fused cycle (MGRITSettings.fused) under MPI against the textbook cycle on the same ranks.

Oracle: the same solve, or the same distributed gradient, with ``fused=False`` on the same
communicator. Both exchange the same messages and reduce in the same order, so everything
is compared exactly: each rank's block of the solution, every residual norm and vector,
the step counts; the gradient bit for bit. Run at 2 and 3 ranks (tests/test_mpi_launch.py);
the grids below split unevenly over 3.
"""

import numpy as np
import pytest

from refbraid.backends.host import to_host
from refbraid.distributed.network import distributed_gradient
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.mgrit import MGRITSettings, solve
from refbraid.mgrit.problems import LinearODE, nonlinear_ode
from refbraid.models import build_network
from refbraid.network import init_params

SETTINGS = {
    "V-F": MGRITSettings(levels=3, cfactor=2, relax="F", abs_tol=None, max_iter=3,
                         min_coarse=1),
    "F-cycle-FCF": MGRITSettings(levels=3, cfactor=3, relax=("F", "FCF"), cycle="F",
                                 abs_tol=None, max_iter=3, min_coarse=1),
    "torchbraid": MGRITSettings.torchbraid(max_iter=2, abs_tol=None),
    "FMG-FCF2": MGRITSettings(levels=2, cfactor=4, relax="FCF", cf_sweeps=2, abs_tol=None,
                              max_iter=2, fmg=True, keep_iterates=True, final_fc_relax=True),
}


def _bits(x):
    if x is None:
        return None
    x = np.asarray(to_host(x))
    return x.dtype.str, x.shape, x.tobytes()


def _record(res):
    out = [_bits(res.solution), tuple(res.step_counts), res.status, res.iterations]
    for r in res.records:
        out.append((r.norm, r.post_cycle_norm, _bits(r.post_cycle_iterate)))
        out += [(v.level, v.norm, _bits(v.residual), _bits(v.iterate)) for v in r.visits]
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
def test_fused_solves_equal_textbook_solves_on_the_same_ranks(world, name):
    settings = SETTINGS[name]
    g = np.random.default_rng(0).standard_normal((68, 2))
    for problem in (nonlinear_ode(70, T=1.0, dim=3),
                    LinearODE(67, dim=2).adjoint_problem(np.ones(2), g=g)):
        fused = solve(problem, settings, comm=world)
        plain = solve(problem, settings.replace(fused=False), comm=world)
        assert _record(fused) == _record(plain)


@pytest.mark.parametrize("kind", ["resnet", "conv"])
def test_fused_distributed_gradient_is_bit_identical(world, kind):
    if kind == "resnet":
        net = build_network("resnet", (2,), 5, 64, 4, 3.0, "tanh")
    else:
        net = build_network("conv", (1, 5, 5), 3, 64, 2, 1.0, "relu")
    params = init_params(net, 0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, *net.opening.in_shape))
    y = rng.integers(0, net.closing.out_shape[0], 6)
    for s in (LayerParallelSettings(),
              LayerParallelSettings.with_iterations(2, 1, levels=2, cfactor=16, relax="F")):
        plain = LayerParallelSettings(forward=s.forward.replace(fused=False),
                                      backward=s.backward.replace(fused=False))
        got = [distributed_gradient(net, t)(params, x, y) for t in (s, plain)]
        (loss, grads, _), (loss0, grads0, _) = got
        assert loss == loss0
        for k in grads0:
            assert _bits(grads[k]) == _bits(grads0[k]), k
