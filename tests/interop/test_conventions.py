"""One convention for iteration counts and the final FC relaxation across `refbraid train`,
`scale`, `compare` and the Python API (refbraid's: cycles after the skipped first down-cycle,
no final FC relaxation), and TorchBraid's behind `--torchbraid-conventions`, whose `compare`
results are those of :class:`TorchBraidSettings`' defaults (TorchBraid's examples)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from refbraid import init_params
from refbraid.cli import main
from refbraid.conventions import refbraid_counts
from refbraid.interop.compare import _settings_dict
from refbraid.interop.xbraid import TorchBraidSettings
from refbraid.layer_parallel import LayerParallelSettings
from refbraid.models import build_network
from refbraid.training import TrainConfig
from refbraid.training import cli as train_cli
from refbraid.training.checkpoint import save_checkpoint
from refbraid.training.config import config_from_args
from refbraid.training.gradients import layer_parallel_settings
from refbraid.training.optim import SGD


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 16-layer resnet checkpoint and a batch (no PyTorch needed)."""
    d = tmp_path_factory.mktemp("conventions")
    config = TrainConfig(model="resnet", layers=16, width=4)
    net = build_network("resnet", (2,), 5, 16, 4, config.T)
    save_checkpoint(d / "ck.npz", epoch=1, params=init_params(net, 0), optimizer=SGD(0.1),
                    rng=np.random.default_rng(0), config=config.to_dict(), history=[])
    rng = np.random.default_rng(1)
    np.savez(d / "b.npz", x=rng.uniform(-3, 3, (8, 2)), labels=rng.integers(0, 5, 8))
    return d


def _compare(files, out, *flags):
    argv = ["compare", "--model", str(files / "ck.npz"), "--batch", str(files / "b.npz"),
            "--levels", "2", "--cfactor", "4", "--out", str(out), *flags]
    assert main(argv) == 0
    report = json.loads((out / "compare.json").read_text())
    with np.load(out / "gradients.npz") as f:
        grads = {k: f[k] for k in f if k.startswith("layer_parallel/")}
    return report, grads


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_compare_counts_as_train_and_torchbraid_conventions_are_todays_defaults(files,
                                                                                 tmp_path):
    ours, g_ours = _compare(files, tmp_path / "ours")
    theirs, g_theirs = _compare(files, tmp_path / "tb", "--torchbraid-conventions")
    fwd, bwd = ours["settings"]["forward"], ours["settings"]["backward"]
    assert (fwd["max_iter"], bwd["max_iter"]) == (1, 0)  # refbraid train's resnet defaults
    assert not fwd["final_fc_relax"] and not bwd["final_fc_relax"]
    assert ours["settings"]["conventions"] == "refbraid"
    tb = TorchBraidSettings(max_levels=2, cfactor=4)  # TorchBraid's examples, two levels
    assert theirs["settings"]["forward"] == _settings_dict(tb.to_refbraid().forward)
    assert theirs["settings"]["backward"] == _settings_dict(tb.to_refbraid().backward)
    assert theirs["settings"]["backward"]["final_fc_relax"] is True
    assert theirs["settings"]["conventions"] == "torchbraid"
    # the same cycles counted both ways, and the final FC relaxation switched on by hand
    _, g_explicit = _compare(files, tmp_path / "explicit", "--fwd-iters", "1", "--bwd-iters", "0",
                             "--bwd-final-relax")
    _same(g_theirs, g_explicit)
    _, g_tb_counts = _compare(files, tmp_path / "counted", "--torchbraid-conventions",
                              "--fwd-iters", "2", "--bwd-iters", "1", "--no-bwd-final-relax")
    _same(g_ours, g_tb_counts)
    assert not all(np.array_equal(g_ours[k], g_theirs[k]) for k in g_ours)


def test_train_and_scale_count_the_same_way():
    def config(*argv):
        parser = argparse.ArgumentParser()
        train_cli.add_parser(parser.add_subparsers(dest="command"))
        return config_from_args(refbraid_counts(parser.parse_args(["train", *argv])))

    assert config("--torchbraid-conventions", "--fwd-iters", "2", "--bwd-iters", "1") == \
        config("--fwd-iters", "1", "--bwd-iters", "0")
    assert config("--torchbraid-conventions", "--no-skip-down", "--fwd-iters", "2") == \
        config("--no-skip-down", "--fwd-iters", "2")  # without the skip both count cycles
    settings = layer_parallel_settings(config())
    assert (settings.forward.max_iter, settings.backward.max_iter) == (1, 0)
    assert not settings.forward.final_fc_relax and not settings.backward.final_fc_relax
    api = LayerParallelSettings()  # the Python API: the same counts, no final FC relaxation
    assert (api.forward.max_iter, api.backward.max_iter) == (1, 0)
    assert not api.forward.final_fc_relax and not api.backward.final_fc_relax
    tb = TorchBraidSettings().to_refbraid()  # TorchBraid's, explicitly: 2 / 1 counted its way
    assert (tb.forward.max_iter, tb.backward.max_iter) == (1, 0) and tb.backward.final_fc_relax
    with pytest.raises(ValueError, match="`--fwd-iters` must be >= 1 with "
                                         "--torchbraid-conventions"):
        config("--torchbraid-conventions", "--fwd-iters", "0")
