"""Every combination of flags, data and model that cannot work — or would do nothing — is
refused with one line naming the flags, before any work: no epoch trained, no run folder
left behind (never one with status "error" for a config error). And each model's default
data fits it. Also: no raw library text (NumPy warnings) before a divergence message."""

from __future__ import annotations

import re

import pytest

from refbraid.cli import EXIT_DIVERGED, EXIT_USAGE, main

TINY = ["--samples", "100", "--epochs", "1", "--quiet"]

CASES = [  # (id, flags, pattern of the one line)
    ("daso-sync-one-process", ["--global-sync-every", "4"],
     r"`--global-sync-every` \(DASO\) .* in one process there is nothing to group or average"),
    ("daso-groups-one-process", ["--dp-groups", "2"], r"`--dp-groups` \(DASO\)"),
    ("bias-control-serial", ["--bias-control", "measure", "--serial"],
     r"`--bias-control measure` controls the bias of the layer-parallel gradient; with "
     r"`--serial`"),
    ("gru-on-next-token-data", ["--model", "gru", "--data", "lm-reverse"],
     r"`--model gru` does not fit `--data lm-reverse`: the model predicts one class per "
     r"sample, the data labels one class per position"),
    ("gpt-two-layers", ["--model", "gpt", "--layers", "2"],
     r"`--levels 3` with `--cfactor 2` does not fit `--layers 2`"),
    ("trace-single-step", ["--trace", "--samples", "50", "--batch-size", "64", "--layers",
                           "8", "--levels", "2"],
     r"`--trace` records training step 2 \(step 1 warms up\), and this run has 1"),
    ("trace-serial-one-process", ["--trace", "--serial"],
     r"`--trace` records MGRIT's step applications .* `--serial` run in one process"),
]


@pytest.mark.parametrize("case_id, flags, pattern", CASES, ids=[c[0] for c in CASES])
def test_a_combination_that_cannot_work_is_refused_before_any_work(case_id, flags, pattern,
                                                                   tmp_path, capsys):
    out = tmp_path / "new" / "run"
    assert main(["train", *TINY, *flags, "--out", str(out)]) == EXIT_USAGE
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refbraid train: error: "), lines
    assert re.search(pattern, lines[0]), lines[0]
    assert not (tmp_path / "new").exists()  # no folder, so no log with status "error"


@pytest.mark.parametrize("model", ["resnet", "conv"])
def test_each_models_default_data_fits_it(model, tmp_path, capsys):
    assert main(["train", "--model", model, *TINY, "--samples", "60", "--layers", "8",
                 "--width", "2", "--levels", "2", "--serial", "--out", str(tmp_path)]) == 0


def test_every_model_default_data_fits_its_model():
    from refbraid.data import DATASETS
    from refbraid.models import MODEL_DEFAULTS
    from refbraid.training.config import TrainConfig

    for model in MODEL_DEFAULTS:
        config = TrainConfig(model=model)
        assert config.data in DATASETS
        if model in ("conv", "conv-stages"):
            assert config.data != "peaks"  # image models train on images


def test_a_divergence_is_one_line_without_numpy_warnings(tmp_path, capfd):
    code = main(["train", *TINY, "--samples", "200", "--layers", "16", "--width", "4",
                 "--T", "1e300", "--serial", "--out", str(tmp_path / "run")])
    err = capfd.readouterr().err
    assert code == EXIT_DIVERGED
    assert len(err.strip().splitlines()) == 1, err
    assert "RuntimeWarning" not in err and "overflow" not in err
