"""``refbraid train --space-parallel S`` under mpiexec: the conv model's feature maps split by
rows (refbraid/space) trains to one process's numbers; a bad split is one clear line. The
numerics of every D × S × Q split are in tests/mpi/test_space_depth.py."""

import json
from pathlib import Path

import pytest

from refbraid.parallel.launch import run_mpi

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120
FLAGS = ["train", "--data", "digits", "--model", "conv", "--layers", "4", "--width", "2",
         "--levels", "2", "--cfactor", "2", "--samples", "120", "--epochs", "1", "--quiet"]


@pytest.mark.mpi
@pytest.mark.slow  # an mpiexec launch and a one-process run: ~18 s loaded
def test_space_parallel_training_equals_one_process(tmp_path):
    from refbraid.cli import main

    assert main([*FLAGS, "--out", str(tmp_path / "one")]) == 0
    run = run_mpi(2, ["-m", "refbraid", *FLAGS, "--space-parallel", "2", "--out",
                      str(tmp_path / "space")], timeout=TIMEOUT, cwd=ROOT)
    assert run.ok, run.output
    one, space = (json.loads((tmp_path / n / "log.json").read_text()) for n in ("one", "space"))
    assert space["gradient"] == "space-depth-mpi"
    a, b = one["history"][-1], space["history"][-1]
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-12)
    assert b["val_acc"] == a["val_acc"]


def test_space_parallel_needs_the_conv_model(tmp_path, capsys):
    from refbraid.cli import main

    code = main(["train", "--space-parallel", "2", "--epochs", "1", "--out",
                 str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err
    assert err.count("needs the conv model") == 1, err
