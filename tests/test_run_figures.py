"""A run's figures: titles that name the run's settings, and histories that switch between
layer-parallel and sequential epochs (``refbraid train --resume RUN --serial``) still plot."""

from __future__ import annotations

import json

from refbraid.cli import main
from refbraid.training.plots import plot_solver_history, plot_training_curves, run_title

SMALL = ["--samples", "200", "--layers", "8", "--width", "4", "--batch-size", "50",
         "--levels", "2", "--cfactor", "2"]


def test_resume_serial_of_a_layer_parallel_run_redraws_its_curves(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "--epochs", "2", "--checkpoint-every", "1", "--quiet",
                 "--out", str(run)]) == 0
    before = (run / "curves.png").read_bytes()
    assert main(["train", *SMALL, "--epochs", "3", "--serial", "--quiet",
                 "--resume", str(run)]) == 0
    assert "internal error" not in capsys.readouterr().err
    log = json.loads((run / "log.json").read_text())
    assert log["status"] == "finished"
    mixed = ["val_acc_sequential_forward" in r for r in log["history"]]
    assert mixed == [True, True, False]
    assert (run / "curves.png").read_bytes() != before  # redrawn with the third epoch


def _epoch(epoch, layer_parallel):
    record = {"epoch": epoch, "train_loss": 1.0 / epoch, "val_loss": 1.1 / epoch,
              "train_acc": 0.5, "val_acc": 0.4, "stats": {}}
    if layer_parallel:
        record["val_acc_sequential_forward"] = 0.45
        record["stats"] = {"fwd_res": 4.0 + epoch, "bwd_res": 0.1}
    return record


def test_mixed_histories_plot_each_series_where_it_was_measured():
    for history in ([_epoch(1, True), _epoch(2, False)], [_epoch(1, False), _epoch(2, True)]):
        fig = plot_training_curves(history, "title")
        acc = fig.axes[1]
        labels = [line.get_label() for line in acc.get_lines()]
        assert "validation (exact forward)" in labels
        texts = sorted(t.get_text().strip() for t in acc.texts)
        assert texts == ["layer-parallel", "sequential"]  # either side of the switch
        assert plot_solver_history(history) is not None


def test_run_titles_name_the_mode_and_settings():
    config = {"levels": 3, "cfactor": 4, "fwd_iters": 1, "bwd_iters": 0, "serial": False}
    meta = {"model": "resnet", "gradient": "layer-parallel", "config": config,
            "network": {"layers": 64}, "data": {"name": "peaks"}}
    assert run_title(meta) == ("peaks: resnet, 64 layers\nlayer-parallel MGRIT: 3 levels, "
                               "cfactor 4, 1 forward / 0 adjoint cycles after the skipped first")
    serial = {**meta, "gradient": "sequential", "config": {**config, "serial": True}}
    assert run_title(serial, "digits") == "digits: resnet, 64 layers\nsequential backprop"
