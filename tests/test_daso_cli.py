"""``refbraid train --data-parallel D --dp-groups G --global-sync-every K`` under mpiexec.

k = 1 reproduces plain data parallelism's log exactly; a cycling run finishes, logs its
bytes per step (less inter-node traffic than plain data parallelism) and stays close in
accuracy; a bad split is one clear line, no traceback. The numerics are checked in
tests/mpi/test_daso.py; this file checks the command line.
"""

import json
from pathlib import Path

import pytest

from refbraid.parallel.launch import run_mpi

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120
FLAGS = ["-m", "refbraid", "train", "--serial", "--layers", "8", "--samples", "400",
         "--epochs", "3", "--quiet", "--data-parallel", "2"]


def _log(path):
    return json.loads((path / "log.json").read_text())


@pytest.mark.mpi
@pytest.mark.slow  # 3 mpiexec launches: 15-20 s on the loaded 2-core machine
def test_daso_runs_and_k1_equals_plain_data_parallelism(tmp_path):
    runs = {"plain": [], "k1": ["--dp-groups", "2", "--global-sync-every", "1"],
            "daso": ["--dp-groups", "2", "--global-sync-every", "4"]}
    for name, extra in runs.items():
        run = run_mpi(2, [*FLAGS, *extra, "--out", str(tmp_path / name)], timeout=TIMEOUT,
                      cwd=ROOT)
        assert run.ok, run.output
    plain, k1, daso = (_log(tmp_path / n) for n in runs)
    assert k1["gradient"] == daso["gradient"] == "daso-mpi"
    for a, b in zip(plain["history"], k1["history"], strict=True):
        assert a["train_loss"] == b["train_loss"] and a["val_acc"] == b["val_acc"]
    cycling = [h["stats"] for h in daso["history"][1:-1]]
    assert [s["daso_every"] for s in cycling] == [4.0]
    plain_inter = k1["history"][0]["stats"]["bytes_inter"]
    assert all(s["bytes_inter"] < plain_inter / 2 for s in cycling)
    assert abs(daso["history"][-1]["val_acc"] - plain["history"][-1]["val_acc"]) < 0.05


def test_daso_needs_every_rank_data_parallel(tmp_path, capsys):
    from refbraid.cli import main

    code = main(["train", "--dp-groups", "2", "--data-parallel", "2", "--epochs", "1",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err, err
    assert err.count("need every rank to be a data-parallel rank") == 1, err
    assert not (tmp_path / "run").exists()
