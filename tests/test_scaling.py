"""``refbraid scale`` and the prediction behind it (refbraid/scaling/predict.py).

The oracle for every number is something that explains itself: the ring-allreduce formula,
the virtual cluster's own time for the same schedule, the measured one-process run the
calibration must reproduce, and the serial time the speedups divide.
"""

from __future__ import annotations

import json
import math

import pytest

from refbraid.cli import EXIT_USAGE, main
from refbraid.parallel.costs import StepCosts
from refbraid.scaling.predict import (
    calibrate,
    data_parallel_batches,
    predict,
    ring_allreduce,
    serial_time,
)
from refbraid.scaling.virtual_step import simulate_gradient_schedule
from refbraid.training.config import TrainConfig
from refbraid.training.gradients import layer_parallel_settings

TINY = dict(samples=200, layers=32, width=4, batch_size=16)


def test_ring_allreduce_is_seed_002s_formula():
    assert ring_allreduce(1e6, 1, 1e-6, 1e-9) == 0.0
    assert ring_allreduce(1e6, 4, 1e-6, 1e-9) == pytest.approx(2 * 3 * 1e-6 + 2 * 3 / 4 * 1e-3)


def test_data_parallel_shards_halve_the_batch():
    assert data_parallel_batches(64, 1024) == [64, 32, 16, 8, 4, 2, 1]
    assert data_parallel_batches(10, 4) == [10, 5, 3]


def test_predictions_from_given_costs_equal_the_virtual_cluster_and_the_formulas():
    config = TrainConfig(**TINY)
    costs = StepCosts(forward=1e-4, backward=(2e-4, 3e-4))
    machine = calibrate(config, max_ranks=16, alpha=1e-6, beta=1e-10, step_costs=costs)
    rows = predict(machine, max_ranks=16)
    assert [r.ranks for r in rows] == [1, 2, 4, 8, 16]
    settings = layer_parallel_settings(config)
    for r in rows[:2]:  # N = 32, 3 levels, cfactor 4: at most 2 layer ranks
        run = simulate_gradient_schedule(32, machine.state_bytes, r.ranks, settings, costs,
                                         1e-6, 1e-10, machine.iterations)
        assert r.layer_parallel == pytest.approx(run.wall_time, rel=1e-12)
    assert rows[2].layer_parallel is None  # 4 ranks > 2 coarsest intervals
    serial = serial_time(machine)
    assert serial == pytest.approx(32 * (1e-4 + 2e-4))  # N (c_fwd + c_adj) at the full batch
    for r in rows:
        d = r.ranks
        want = machine.serial[math.ceil(16 / d)] + ring_allreduce(machine.grad_bytes, d, 1e-6,
                                                                   1e-10)
        assert r.data_parallel == pytest.approx(want, rel=1e-12)
        candidates = [t for t in (r.layer_parallel, r.data_parallel) if t is not None]
        assert r.best <= min(candidates) + 1e-15
        assert r.best_split[0] * r.best_split[1] == d
    assert rows[0].best == pytest.approx(serial)  # one rank: serial training is the best


def test_calibration_reproduces_the_measured_one_process_run():
    machine = calibrate(TrainConfig(**TINY), max_ranks=4, measure_messages=lambda: (2e-6, 1e-10))
    assert machine.source["messages"] == "calibrated here (2-rank ping-pong)"
    one = predict(machine, max_ranks=1)[0]
    if machine.extra > 0:  # the constant part fills the gap: one rank = the measured run
        assert one.layer_parallel == pytest.approx(machine.lp_measured, rel=1e-9)
    else:  # timing noise made the traced gradient alone slower than the measured step
        assert one.layer_parallel >= machine.lp_measured
    assert machine.extra >= 0 and all(c > 0 for c in machine.costs.forward)
    assert machine.iterations == (1, 0)  # TorchBraid's settings, after the skipped down-cycle


def test_refbraid_scale_prints_the_table_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "scale"
    assert main(["scale", "--layers", "64", "--width", "4", "--samples", "200",
                 "--step-cost", "1e-4,2e-4", "--alpha", "1e-6", "--beta", "1e-10",
                 "--max-ranks", "64", "--step-ranks", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "P    LP ms" in text and \
        "wrote scaling.png, timeline.png, timeline_step.png, scaling.json" in text
    assert "whole distributed training step" in text
    # 7 rows P = 1..64, then the training-step rows 1×1, 1×2, 2×1
    assert len([ln for ln in text.splitlines() if ln.strip().split(" ")[0].isdigit()]) == 10
    for name in ("scaling.png", "timeline.png", "timeline_step.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((out / "scaling.json").read_text())
    assert [r["ranks"] for r in saved["rows"]] == [1, 2, 4, 8, 16, 32, 64]
    assert saved["source"]["steps"] == "given (--step-cost)"
    steps = saved["training_step_rows"]
    assert [(r["ranks"], r["groups"]) for r in steps] == [(1, 1), (2, 1), (2, 2)]
    assert steps[0]["step"] == pytest.approx(steps[0]["solves"], rel=1e-9)  # P = 1: no glue
    assert steps[1]["comm"] > 0  # two ranks: messages on the critical path


@pytest.mark.parametrize("flags, pattern", [
    (["--max-ranks", "0"], "`--max-ranks` must be a positive integer"),
    (["--timeline-ranks", "0"], "`--timeline-ranks` must be a positive integer"),
    (["--step-ranks", "-1"], "`--step-ranks` must be 0 (skip) or a positive integer"),
    (["--levels", "1"], "`--levels` must be at least 2"),
    (["--model", "gru"], "`--model gru`: `refbraid scale` models the resnet and conv"),
    (["--layers", "0"], "`--layers` must be a positive integer"),
    (["--out", "/dev/null"], "`--out` '/dev/null' is not a folder"),
], ids=["max-ranks", "timeline-ranks", "step-ranks", "one-level", "sequence-model", "layers",
        "out"])
def test_bad_scale_flags_are_named(flags, pattern, capsys, tmp_path):
    argv = ["scale", "--step-cost", "1e-4", "--alpha", "1e-6", "--beta", "1e-10", *flags]
    if "--out" not in flags:
        argv += ["--out", str(tmp_path / "s")]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and pattern in err, err


def test_a_malformed_step_cost_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["scale", "--step-cost", "fast"])
    assert info.value.code == 2 and "--step-cost" in capsys.readouterr().err
