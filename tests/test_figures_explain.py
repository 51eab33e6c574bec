"""Figures say what they show: the MGRIT residual history names every level (the coarsest,
solved exactly, too) and draws coinciding conventions once; compare's figure spans whole
iterations and says when XBraid reports nothing."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np

from refbraid import init_params
from refbraid.interop.compare import compare
from refbraid.interop.convert import Converted
from refbraid.interop.plots import plot_comparison
from refbraid.interop.xbraid import TorchBraidSettings
from refbraid.mgrit import MGRITSettings, solve
from refbraid.mgrit.plots import plot_residual_history
from refbraid.mgrit.problems import heat_1d
from refbraid.models import build_network


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_residual_history_names_every_level_once():
    res = solve(heat_1d(n_x=20, n_steps=64),
                MGRITSettings(levels=3, cfactor=4, relax=("F", "FCF"), min_coarse=1))
    ax = plot_residual_history(res, "heat").axes[0]
    labels = _legend(ax)
    assert labels == ["level 0 (XBraid's ‖r‖ = after the cycle here)", "level 1 (FAS residual)",
                      "level 2: coarsest, solved exactly (no residual)"]
    assert ax.get_title().startswith("heat\nMGRIT forward solve (converged), N = 64: 3 levels,"
                                     "\ncfactors 4/4, relax F/FCF")
    fcf = solve(heat_1d(n_x=20, n_steps=64),
                MGRITSettings(levels=2, cfactor=4, relax="FCF", min_coarse=1))
    labels = _legend(plot_residual_history(fcf).axes[0])
    assert labels[:2] == ["level 0 (XBraid: before correction)", "level 0 (after cycle)"]


def test_compare_figure_uses_whole_iterations_and_says_when_nothing_is_reported():
    net = build_network("resnet", (2,), 3, 16, 4, 2.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (6, 2)), rng.integers(0, 3, 6)
    conv = Converted(net, params, {k: k for k in params}, {k: None for k in params}, None)
    settings = TorchBraidSettings(max_levels=2, cfactor=4, bwd_finalrelax=False).to_refbraid()
    report, _ = compare(conv, x, y, settings)
    fig = plot_comparison(report)
    fwd, bwd = fig.axes
    for ax in (fwd, bwd):
        ticks = ax.get_xticks()
        assert np.array_equal(ticks, np.round(ticks)) and ax.get_xlim()[0] == -0.5
    low, high = bwd.get_ylim()  # the adjoint's single measurement: a decade each side
    assert high / low > 50
    assert any("report no norm for this solve" in t.get_text() and "getBwdStats: −1" in
               t.get_text() for t in bwd.texts)
    assert fig._suptitle.get_text().startswith(
        "refbraid compare: 2 levels, cfactor 4, 1 forward / 0 adjoint cycles after the skipped "
        "first, final FC relaxation: none")
