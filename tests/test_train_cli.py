"""``refbraid train``: flags → config, errors naming the flag, output files, summary, resume."""

from __future__ import annotations

import argparse
import json

import pytest

from refbraid.cli import main
from refbraid.training import cli as train_cli
from refbraid.training.config import TrainConfig, config_from_args

TINY = ["--samples", "200", "--layers", "2", "--width", "4", "--epochs", "2",
        "--batch-size", "50", "--serial"]


def _parse(argv):
    parser = argparse.ArgumentParser()
    train_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["train", *argv])


def test_flag_defaults_are_the_config_defaults():
    assert config_from_args(_parse([])) == TrainConfig()
    cfg = config_from_args(_parse(["--batch-size", "7", "--T", "2.5", "--serial", "--quiet",
                                   "--checkpoint-every", "3", "--optimizer", "sgd"]))
    assert (cfg.batch_size, cfg.T, cfg.serial, cfg.quiet, cfg.checkpoint_every, cfg.optimizer) \
        == (7, 2.5, True, True, 3, "sgd")
    assert cfg.out_dir == "runs/peaks-resnet"


@pytest.mark.parametrize("flag, value", [
    ("--layers", "0"), ("--layers", "-3"), ("--width", "0"), ("--T", "0"), ("--T", "-1"),
    ("--T", "nan"), ("--lr", "0"), ("--lr", "-0.1"), ("--epochs", "0"), ("--batch-size", "0"),
    ("--data", "cifar"), ("--model", "vgg"), ("--backend", "jax"), ("--optimizer", "rmsprop"),
    ("--activation", "sigmoid"), ("--dtype", "float16"), ("--momentum", "1.5"),
    ("--checkpoint-every", "-1"), ("--samples", "1"), ("--val-fraction", "1.0"),
])
def test_bad_flags_are_named_in_the_error(capsys, flag, value):
    assert main(["train", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbraid train: error:") and f"`{flag}`" in err and value in err


def test_model_that_does_not_fit_the_data_names_the_flags(capsys):
    assert main(["train", "--model", "conv", "--data", "peaks"]) == 2
    err = capsys.readouterr().err
    assert "`--model conv`" in err and "`--data peaks`" in err and "image data" in err


def test_mnist_needs_a_data_dir_and_lists_missing_files(capsys, tmp_path):
    assert main(["train", "--data", "mnist"]) == 2
    assert "`--data-dir`" in capsys.readouterr().err
    assert main(["train", "--data", "mnist", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "train-images-idx3-ubyte" in err and "train-labels-idx1-ubyte" in err


def test_non_numeric_values_are_rejected_by_argparse(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--layers", "many"])
    assert "--layers" in capsys.readouterr().err


def test_a_tiny_run_prints_progress_and_a_summary_and_writes_files(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines[:2]] == ["1/2", "2/2"]
    assert lines[-1].startswith("finished peaks-resnet: 2 epochs, val acc")
    assert str(out) in lines[-1] and "log.json" in lines[-1] and "curves.png" in lines[-1]
    log = json.loads((out / "log.json").read_text())
    assert log["config"]["layers"] == 2 and log["config"]["serial"] is True
    assert (out / "curves.png").is_file() and not (out / "checkpoint.npz").exists()


def test_quiet_keeps_only_the_summary(capsys, tmp_path):
    assert main(["train", *TINY, "--out", str(tmp_path), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("finished")


def test_default_output_folder_is_runs_data_model(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *TINY, "--quiet"]) == 0
    assert (tmp_path / "runs" / "peaks-resnet" / "log.json").is_file()


def test_checkpoint_and_resume_through_the_cli(capsys, tmp_path):
    base = [*TINY[:-5], "--batch-size", "50", "--serial"]
    assert main(["train", *base, "--epochs", "3", "--quiet", "--out", str(tmp_path / "a")]) == 0
    assert main(["train", *base, "--epochs", "2", "--quiet", "--checkpoint-every", "1",
                 "--out", str(tmp_path / "b")]) == 0
    assert (tmp_path / "b" / "checkpoint.npz").is_file()
    assert main(["train", *base, "--epochs", "3", "--quiet", "--resume", str(tmp_path / "b"),
                 "--out", str(tmp_path / "c")]) == 0
    a = json.loads((tmp_path / "a" / "log.json").read_text())["history"]
    c = json.loads((tmp_path / "c" / "log.json").read_text())["history"]
    keys = ("train_loss", "train_acc", "val_loss", "val_acc")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in c]
    assert main(["train", *base, "--epochs", "3", "--width", "5", "--resume",
                 str(tmp_path / "b"), "--out", str(tmp_path / "d")]) == 2
    assert "`--width`" in capsys.readouterr().err
    assert main(["train", *base, "--resume", str(tmp_path / "nothing.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err
