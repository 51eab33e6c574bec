"""Plot functions take a record and return a Figure (Agg; nothing is shown)."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure

from refbraid.mgrit import MGRITSettings, sequential_solve, solve
from refbraid.mgrit.plots import (
    plot_error,
    plot_hierarchy,
    plot_residual_heatmap,
    plot_residual_history,
)
from refbraid.mgrit.problems import LinearODE, heat_1d


@pytest.fixture(scope="module")
def heat():
    problem = heat_1d(n_x=20, n_steps=64)
    s = MGRITSettings(levels=3, cfactor=4, relax=("F", "FCF"), keep_iterates=True, min_coarse=1)
    return problem, solve(problem, s)


def test_every_plot_returns_a_figure(heat, tmp_path):
    problem, res = heat
    figs = [
        plot_residual_history(res),
        plot_residual_heatmap(res),
        plot_hierarchy(res),
        plot_hierarchy(res.hierarchy),
        plot_error(res, sequential_solve(problem)),
    ]
    for i, fig in enumerate(figs):
        assert isinstance(fig, Figure)
        fig.savefig(tmp_path / f"f{i}.png")
    assert len(figs[0].axes[0].lines) == 3  # level 0 (two conventions) and level 1
    assert len([ax for ax in figs[1].axes if ax.get_label() != "<colorbar>"]) == 2  # levels 0, 1
    assert len(figs[4].axes[0].lines) == len(res.records) + 1  # each iterate and the solution


def test_heatmap_needs_residual_vectors():
    problem = heat_1d(n_x=10, n_steps=32)
    res = solve(problem, MGRITSettings(levels=2, cfactor=4, keep_residuals=False))
    with pytest.raises(ValueError, match="keep_residuals"):
        plot_residual_heatmap(res)


def test_plots_of_an_adjoint_solve_use_fine_indices(tmp_path):
    ode = LinearODE(32, dim=2)
    problem = ode.adjoint_problem([1.0, -1.0])
    res = solve(problem, MGRITSettings(levels=2, cfactor=4, keep_iterates=True))
    fig = plot_error(res, sequential_solve(problem))
    x = fig.axes[0].lines[0].get_xdata()
    assert x[0] == 32 and x[-1] == 0  # solver order s = N - i
    plot_residual_heatmap(res).savefig(tmp_path / "h.png")
