"""TorchBraid/XBraid settings in refbraid's terms, and XBraid's residual reporting."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid import Network, init_params
from refbraid.interop import TorchBraidSettings, xbraid_stats
from refbraid.layer_parallel import LayerParallelSettings, layer_parallel_gradient
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.mgrit import MGRITSettings, Problem, solve


def test_torchbraid_defaults_map_to_refbraid_defaults_plus_final_relax():
    s = TorchBraidSettings().to_refbraid()
    f, b = s.forward, s.backward
    assert (f.levels, f.cfactors, f.max_iter, b.max_iter) == (3, (4, 4), 1, 0)
    assert [f.relax_on(lvl) for lvl in range(2)] == ["F", "FCF"]
    assert f.skip_first_down and b.skip_first_down and f.abs_tol == 1e-9
    assert not f.final_fc_relax and b.final_fc_relax
    # without the adjoint's final FC relaxation it is refbraid's own default (min_coarse aside)
    ref = LayerParallelSettings()
    mine = TorchBraidSettings(bwd_finalrelax=False, min_coarse=1).to_refbraid()
    assert mine.forward == ref.forward.replace(cfactor=(4, 4), cf_sweeps=(1, 1))
    assert mine.backward == ref.backward.replace(cfactor=(4, 4), cf_sweeps=(1, 1))


def test_iteration_counting_and_nrelax():
    s = TorchBraidSettings(fwd_max_iters=3, skip_downcycle=False, fwd_nrelax=(2, 0)).to_refbraid()
    assert s.forward.max_iter == 3 and not s.forward.skip_first_down
    assert [s.forward.relax_on(lvl) for lvl in range(2)] == ["FCF", "F"]
    assert s.forward.sweeps_on(0) == 2
    assert TorchBraidSettings(max_levels=1).to_refbraid().forward.levels == 1


@pytest.mark.parametrize("values, match", [
    ({"fwd_max_iters": 0}, r"`fwd_max_iters` must be an integer >= 1"),
    ({"relax_only_cg": True}, r"`relax_only_cg` cannot be mapped.*solved exactly"),
    ({"crelax_wt": 0.5}, r"`crelax_wt` cannot be mapped"),
    ({"bogus": 1}, r"unknown setting\(s\) \['bogus'\]"),
    ({"fwd_nrelax": (0,)}, r"`fwd_nrelax` needs one entry per coarsening level"),
])
def test_settings_that_cannot_be_mapped_are_named(values, match):
    with pytest.raises(ValueError, match=match):
        TorchBraidSettings.from_mapping(values).to_refbraid()


def _net_batch():
    net = Network(DenseLift(2, 4), DenseStep(4, "tanh"), Classifier((4,), 3), 32, 2.0)
    rng = np.random.default_rng(1)
    return net, init_params(net, 2), rng.standard_normal((6, 2)), rng.integers(0, 3, 6)


def test_xbraid_reporting_of_torchbraid_defaults():
    """Forward: "2 iterations" and one printed norm, refbraid's first measurement (the one
    after the skipped cycle); backward: "1 iteration" and no norm (getBwdStats → −1)."""
    net, params, x, y = _net_batch()
    _, _, info = layer_parallel_gradient(net, params, x, y,
                                         TorchBraidSettings().to_refbraid())
    fwd, bwd = xbraid_stats(info.forward), xbraid_stats(info.backward)
    assert (fwd.iterations, fwd.iteration_numbers) == (2, (1,))
    assert fwd.norms == (info.forward.norms[0],) and fwd.last == info.forward.norms[0]
    assert (bwd.iterations, bwd.norms, bwd.last) == (1, (), -1.0)
    assert len(info.backward.records) == 1  # refbraid measured it: the final relaxation


def test_converged_solve_reports_every_norm():
    p = Problem(step=lambda u, s, t: u / (1 + 0.5 * (t - s) / 16), u0=np.ones(2), n_steps=16)
    r = solve(p, MGRITSettings(levels=2, cfactor=4, max_iter=20, abs_tol=1e-12))
    st = xbraid_stats(r)
    assert r.converged and st.norms == tuple(r.norms) and st.iterations == r.iterations
