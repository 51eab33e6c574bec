"""The worked MPI adapter of docs/architecture.md, executed as written: the least-squares
ResNet's distributed gradient against sequential backprop under the same loss.

Launched like every file here (``mpiexec -n N python -m mpi4py -m pytest tests/mpi``,
N = 1..4). Seven layers split unevenly over 2–4 layer ranks (at 4 ranks one computes no
gradient row); every data-parallel split D of the world, 7 samples (uneven shards). Oracle:
:func:`refbraid.sequence.block_gradient.block_backprop` on the full batch. With one MGRIT
level the solves are sequential substitutions, so the gradients agree to round-off (≤ 1e-12
relative); with MGRIT iterated to the solves' fixed point, to the solver's tolerance.
"""

import re
from pathlib import Path

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.models import build_network
from refbraid.network import init_params
from refbraid.parallel.mpi import split_world
from refbraid.sequence.block_gradient import block_backprop

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _adapter() -> dict:
    """The namespace of the doc's adapter block (the python block after "A worked adapter")."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### A worked adapter"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 (our own documentation)
    return namespace


def _problem(seed=2):
    net = build_network("resnet", (2,), 3, 7, 6, 2.0, "tanh")
    rng = np.random.default_rng(seed)
    x, t = rng.standard_normal((7, 2)), rng.standard_normal((7, 3))
    return net, init_params(net, 0), x, t


def _backprop(net, params, x, t):
    def dloss(p):
        r = (p - t) / len(t)
        return 0.5 * float(np.sum((p - t) * r)), r

    loss, grads, _ = block_backprop(net, params, x, dloss, get_backend("numpy"))
    return loss, grads


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("settings,tol,max_q", [  # max_q: coarsest intervals of 7 layers
    (LayerParallelSettings.exact(), 1e-12, 7),
    (LayerParallelSettings.with_iterations(8, 8, levels=2, cfactor=2), 1e-9, 3),
])
def test_doc_adapter_equals_sequential_backprop(world, settings, tol, max_q):
    gradient_class = _adapter()["LeastSquaresGradient"]
    net, params, x, t = _problem()
    loss0, g0 = _backprop(net, params, x, t)
    for D in _divisors(world.size):
        if world.size // D > max_q:
            continue
        gradient = gradient_class(net, split_world(D, world), settings)
        loss, g, stats = gradient(params, x, t)
        assert set(g) == set(g0)
        assert relative_gradient_error(g, g0) <= tol, D
        assert loss == pytest.approx(loss0, rel=tol)
        others = world.allgather(g["steps.W"])
        for other in others:  # the same gradient on every rank
            np.testing.assert_array_equal(other, others[0])
