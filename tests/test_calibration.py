"""The calibration session (refbraid/scaling/calibration.py): interleaved rounds, the trace's
own cost taken out, and the one-rank virtual run reproducing the measured gradient."""

import itertools

import numpy as np
import pytest

from refbraid.backends import get_backend
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.network import Network, init_params
from refbraid.parallel.trace import STEP, Event
from refbraid.scaling.calibration import Session, measure_session, step_costs
from refbraid.scaling.predict import _lp_virtual, calibrate_network
from refbraid.training.optim import make_optimizer


def test_step_costs_split_the_gradient_as_the_trace_does():
    # two traced calls of 3 steps each: level 0 forward 2 s, level 0 backward 4 s, level 1
    # forward 6 s; 80 % of a traced call inside boxes; the untraced gradient takes 12 s
    one = [Event(STEP, 0, 0, 2, 0, 0, 1), Event(STEP, 0, 2, 6, 0, 1, 0),
           Event(STEP, 0, 6, 12, 1, 0, 4)]
    s = Session({64: 1.0}, step=13.0, gradient=12.0, traced=15.0, steps=tuple(one * 2),
                calls=2, rounds=2, covered=0.8)
    c = step_costs(s)
    k, o = 0.8 * 12.0 / 12.0, 0.2 * 12.0 / 3  # box scale; the rest spread per step
    assert c(0, "forward") == pytest.approx(k * 2 + o)
    assert c(0, "backward") == pytest.approx(k * 4 + o)
    assert c(1, "forward") == pytest.approx(k * 6 + o)
    assert c(1, "backward") == pytest.approx(k * 4 + o)  # none seen: the level above
    assert c(0, "forward") + c(0, "backward") + c(1, "forward") == pytest.approx(12.0)
    assert s.trace_factor == pytest.approx(0.8)


def test_session_interleaves_rounds_after_warmup_and_takes_medians():
    calls, ticks = [], itertools.count()

    def fn(name):
        return lambda: calls.append(name)

    s = measure_session({8: fn("serial")}, fn("step"), fn("grad"), rounds=3, warmup=1,
                        clock=lambda: float(next(ticks)))
    assert calls[:3] == ["serial", "step", "grad"]  # warm-up
    assert calls[3:] == ["serial", "step", "grad", "grad"] * 3  # the last one traced
    assert (s.serial[8], s.step, s.gradient, s.traced) == (1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="rounds"):
        measure_session({}, fn("a"), fn("b"), rounds=0)


def test_one_virtual_rank_charges_the_measured_gradient():
    net = Network(DenseLift(2, 4), DenseStep(4, "tanh"), Classifier((4,), 3), 16, 1.0)
    params = init_params(net, 0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 2)), rng.integers(0, 3, 8)
    m = calibrate_network(net, params, x, y, LayerParallelSettings(), get_backend("numpy"),
                          optimizer=lambda: make_optimizer("adam", 1e-3), max_ranks=2,
                          alpha=1e-6, beta=1e-10, rounds=3)
    assert _lp_virtual(m, 1, 1.0) == pytest.approx(float(m.source["gradient_s"]), rel=1e-3)
    assert m.extra >= 0.0 and set(m.serial) == {8, 4}


def test_extra_is_charged_by_the_busiest_ranks_share_of_layers():
    from dataclasses import replace

    from refbraid.distributed.ownership import BlockPlan
    from refbraid.parallel.costs import StepCosts
    from refbraid.scaling.predict import Machine, extra_on

    settings = LayerParallelSettings()
    m = Machine(StepCosts(1.0), 0.0, 0.0, {64: 1.0}, 0.0, 8, 8, (1, 0), 64, 64, settings)
    assert extra_on(m, 4) == 0.0
    m = replace(m, extra=2.0)
    assert extra_on(m, 1) == 2.0
    for ranks in (2, 3, 4):
        layout = BlockPlan.build(64, settings, ranks).forward_layout
        owned = [min(hi, 64) - lo for lo, hi in map(layout.bounds, range(ranks))]
        assert sum(owned) == 64
        assert extra_on(m, ranks) == pytest.approx(2.0 * max(owned) / 64)


def test_per_rank_fixed_cost_is_paid_whole_by_every_rank():
    """F·(1 − busiest share) on top of the spread charge: 0 on one rank and when F = 0, so the
    predictions without a measured F are unchanged; the LP row grows by exactly that."""
    from dataclasses import replace

    from refbraid.parallel.costs import StepCosts
    from refbraid.scaling.predict import Machine, extra_on, per_rank_on, predict

    settings = LayerParallelSettings()
    m = Machine(StepCosts(1e-5), 0.0, 0.0, {64: 1e-3}, 2e-3, 8, 8, (2, 1), 64, 64, settings)
    assert per_rank_on(m, 2) == 0.0
    f = replace(m, per_rank=1e-3)
    assert per_rank_on(f, 1) == 0.0
    for ranks in (2, 4):
        share = extra_on(replace(m, extra=1.0), ranks)
        assert per_rank_on(f, ranks) == pytest.approx(1e-3 * (1.0 - share))
    base, more = predict(m, 4), predict(f, 4)
    assert more[0].layer_parallel == base[0].layer_parallel
    for b, r in zip(base[1:], more[1:], strict=True):
        assert r.layer_parallel == pytest.approx(b.layer_parallel + per_rank_on(f, r.ranks))
