"""Kept per-level arrays (refbraid.mgrit.workspace) on the device stand-ins (strict, CuPy-like).

Oracle: the same standin computation without a workspace, compared exactly on the host; the
kept arrays are scribbled with NaN before every reuse and live on the stand-in's device.
"""

import numpy as np
import pytest

from refbraid.backends.host import to_host
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.mgrit import GradientWorkspace, MGRITSettings, Workspace, solve
from refbraid.models import build_network
from refbraid.network import init_params, to_backend

from .devices import on_device
from .test_strict_solvers import _ode


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("settings", [
    MGRITSettings(levels=3, cfactor=2, relax="FCF", abs_tol=None, max_iter=3, min_coarse=1),
    MGRITSettings.torchbraid(max_iter=1, min_coarse=1),
])
def test_strict_solve_with_a_workspace_is_bit_identical(standin, direction, settings):
    problem = _ode(standin, direction)
    want = solve(problem, settings)
    ws = Workspace()
    for _ in range(3):
        ws.scribble()
        got = solve(problem, settings, workspace=ws)
        assert on_device(got.solution)
        assert np.array_equal(to_host(got.solution), to_host(want.solution))
        assert np.array_equal(got.norms, want.norms)


def test_strict_layer_parallel_gradient_with_a_workspace_is_bit_identical(standin):
    net = build_network("resnet", (2,), 3, 32, 3, 1.0)
    params = to_backend(init_params(net, 0), standin)
    rng = np.random.default_rng(2)
    x, y = standin.asarray(rng.standard_normal((3, 2))), standin.asarray(np.array([0, 2, 1]))
    settings = LayerParallelSettings()
    loss, grads, _ = layer_parallel_gradient(net, params, x, y, settings, standin)
    ws = GradientWorkspace()
    for _ in range(2):
        ws.scribble()
        got_loss, got, _ = layer_parallel_gradient(net, params, x, y, settings, standin, ws)
        assert got_loss == loss
        for k in grads:
            assert np.array_equal(to_host(got[k]), to_host(grads[k])), k
