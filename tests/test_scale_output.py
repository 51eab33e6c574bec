"""`refbraid scale` explains its own output: --help lists its own flags (the training flags
it accepts are one line), each table is followed by what its columns mean and why a column
is blank, and the timelines are drawn from 0 in a unit that fits the window."""

from __future__ import annotations

import pytest

from refbraid.cli import main


def test_scale_help_lists_its_own_flags_and_every_file(capsys):
    with pytest.raises(SystemExit):
        main(["scale", "--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 45
    for name in ("scaling.png", "timeline.png", "timeline_step.png", "scaling.json",
                 "--max-ranks", "--step-ranks", "refbraid train --help"):
        assert name in text, name
    assert "--bias-control" not in text and "--nested-init" not in text


def test_scale_explains_both_tables_and_why_columns_are_blank(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["scale", "--layers", "64", "--width", "4", "--samples", "200",
                 "--batch-size", "16", "--step-cost", "1e-4,2e-4", "--alpha", "1e-6",
                 "--beta", "1e-10", "--max-ranks", "128", "--step-ranks", "2",
                 "--torchbraid-conventions", "--fwd-iters", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "LP is blank from P = 8: 8 ranks exceed the 4 intervals of the coarsest" in text
    assert "DP is blank from P = 32: every rank needs at least one sample of the batch of " \
           "16." in text
    assert "best is blank from P = 128: at most D = 16 groups × Q = 4 layer ranks." in text
    assert "+ extra" not in text
    joined = " ".join(line.strip() for line in text.splitlines())  # explanations are wrapped
    assert "in the scaling table Q = 1 is serial backprop (DP)" in joined


def test_a_timeline_window_is_drawn_from_zero_in_milliseconds():
    from refbraid.layer_parallel import LayerParallelSettings
    from refbraid.parallel.costs import StepCosts
    from refbraid.parallel.plots import plot_timeline
    from refbraid.scaling.virtual_step import simulate_gradient_schedule

    run = simulate_gradient_schedule(64, 240, 4, LayerParallelSettings(),
                                     StepCosts(1e-4, (1e-4, 2e-4)), alpha=1e-6)
    t_end = max(e.t1 for e in run.trace.events)
    fig = plot_timeline(run.trace, t_range=(2.5e-4, t_end))
    ax = fig.axes[0]
    assert ax.get_xlim() == pytest.approx((0.0, 1e3 * (t_end - 2.5e-4)))
    assert ax.get_xlabel() == "time from the window's start (ms)"
