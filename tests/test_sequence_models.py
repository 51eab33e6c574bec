"""Sequence models (refbraid.sequence) and their generated tasks (refbraid.data.sequences).

Oracles: sequential BPTT / backprop (the exact discrete adjoint), central finite differences,
the ResNet network's own backprop for the pooled transformer, MGRIT's two-level exactness
(round-off after N/m cycles), and the serial run of the same training in the same test.
"""

from __future__ import annotations

import numpy as np
import pytest

from refbraid.data import DATASETS, load_dataset
from refbraid.data.sequences import (
    SEQUENCE_SETS,
    TokenDataset,
    duplicate_tags,
    match_labels,
    memory_task,
)
from refbraid.layer_parallel import LayerParallelSettings, relative_gradient_error
from refbraid.models import MODEL_DEFAULTS, build_network
from refbraid.network import backprop
from refbraid.sequence import GRUModel, Seq2SeqModel, TransformerModel, cross_entropy, gru_model
from refbraid.sequence.transformer_model import transformer_model
from refbraid.training.config import TrainConfig
from refbraid.training.run import train

EXACT = LayerParallelSettings.exact()


# ----------------------------------------------------------------------------- helpers
def _gru(scheme="classic", L=16):
    return GRUModel(L, 3, 5, 4, scheme)


def _tokens(rng, B, T, V):
    return rng.integers(0, V, size=(B, T))


def _case(name, rng):
    """(model, params, x, labels) small enough for finite differences."""
    if name.startswith("gru"):
        m = _gru("implicit" if name == "gru-implicit" else "classic")
        x = rng.standard_normal((4, m.seq_len, m.input_size))
        y = rng.integers(0, m.n_classes, 4)
    elif name == "transformer":
        m = TransformerModel(7, 5, 3, 8, 8, 2, 12, 2.0)
        x, y = _tokens(rng, 3, 5, 7), rng.integers(0, 3, 3)
    elif name == "tagger":
        m = TransformerModel(7, 5, 3, 8, 8, 2, 12, 2.0, per_token=True)
        x, y = _tokens(rng, 3, 5, 7), rng.integers(0, 3, (3, 5))
    else:
        m = Seq2SeqModel(7, 4, 7, 4, 8, 2, 12, 2.0)
        x, y = _tokens(rng, 3, 4, 7), rng.integers(0, 7, (3, 4))
    return m, m.init_params(rng), x, y


CASES = ("gru", "gru-implicit", "transformer", "tagger", "seq2seq")


# ----------------------------------------------------------------------------- data
def test_sequence_sets_are_registered_and_deterministic():
    assert set(SEQUENCE_SETS) <= set(DATASETS)
    for name in SEQUENCE_SETS:
        a, b = load_dataset(name, n_samples=50, seed=3), load_dataset(name, n_samples=50, seed=3)
        np.testing.assert_array_equal(a.x_train, b.x_train)
        np.testing.assert_array_equal(a.y_val, b.y_val)
        assert a.n_train + a.n_val == 50


def test_task_rules():
    tok = np.array([[1, 2, 1, 3], [4, 2, 3, 5]])
    np.testing.assert_array_equal(match_labels(tok), [1, 0])
    np.testing.assert_array_equal(duplicate_tags(tok), [[1, 0, 1, 0], [0, 0, 0, 0]])
    x, y = memory_task(20, np.random.default_rng(0), length=6, features=4, classes=3)
    assert x.shape == (20, 6, 4) and np.all(x[np.arange(20), 0, y] == 2.0)
    rev = load_dataset("seq-reverse", n_samples=30)
    np.testing.assert_array_equal(rev.y_train, rev.x_train[:, ::-1])
    match = load_dataset("seq-match", n_samples=400)
    assert 0.4 < match.y_train.mean() < 0.6  # balanced by construction
    np.testing.assert_array_equal(match.y_train, match_labels(match.x_train.astype(int)))


def test_token_dataset_keeps_integer_ids_through_astype():
    d = load_dataset("seq-duplicates", n_samples=40)
    assert isinstance(d, TokenDataset) and d.per_token and d.y_train.shape == d.x_train.shape
    f = d.astype("float32")
    assert isinstance(f, TokenDataset) and f.x_train.dtype == np.float32
    np.testing.assert_array_equal(f.x_train, d.x_train)
    with pytest.raises(ValueError, match="y_train"):
        TokenDataset("t", d.x_train, d.y_train[:, :3], d.x_val, d.y_val, 2, d.input_shape,
                     d.mean, d.std)


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", CASES)
def test_one_level_layer_parallel_equals_sequential(name):
    m, p, x, y = _case(name, np.random.default_rng(1))
    loss, g, _ = m.backprop(p, x, y)
    loss1, g1, _ = m.layer_parallel_gradient(p, x, y, EXACT)
    assert abs(loss1 - loss) <= 1e-12 * abs(loss)
    assert relative_gradient_error(g1, g) <= 1e-12


def test_pooled_transformer_backprop_matches_the_network_backprop():
    m, p, x, y = _case("transformer", np.random.default_rng(2))
    loss, g, _ = m.backprop(p, x, y)
    loss_net, g_net, _ = backprop(m.net, p, x, y)
    assert abs(loss - loss_net) <= 1e-14 and relative_gradient_error(g, g_net) <= 1e-14


@pytest.mark.parametrize("name", CASES)
def test_model_gradient_matches_central_differences(name):
    rng = np.random.default_rng(4)
    m, p, x, y = _case(name, rng)
    _, g, _ = m.backprop(p, x, y)
    eps = 1e-5
    for key in p:  # one random direction per parameter array: every gradient piece is checked
        v = rng.standard_normal(p[key].shape)
        plus = m.backprop({**p, key: p[key] + eps * v}, x, y)[0]
        minus = m.backprop({**p, key: p[key] - eps * v}, x, y)[0]
        fd, exact = (plus - minus) / (2 * eps), float(np.sum(g[key] * v))
        assert abs(fd - exact) <= 1e-7 * max(abs(exact), 1e-3), (name, key, fd, exact)


@pytest.mark.parametrize("scheme", ["classic", "implicit"])
def test_gru_multilevel_gradient_error_decays_to_round_off(scheme):
    m, p, x, y = _case("gru" if scheme == "classic" else "gru-implicit", np.random.default_rng(5))
    _, g, _ = m.backprop(p, x, y)
    errors = []
    for k in range(5):  # two levels, cfactor 4: exact after N/m = 4 cycles
        s = LayerParallelSettings.with_iterations(k, k, levels=2, cfactor=4, relax="F")
        errors.append(relative_gradient_error(m.layer_parallel_gradient(p, x, y, s)[1], g))
    assert np.all(np.diff(errors[:4]) < 0), errors
    assert errors[0] > 1e-3 and errors[-1] <= 1e-12, errors
    three = [relative_gradient_error(m.layer_parallel_gradient(
        p, x, y, LayerParallelSettings.with_iterations(k, k, levels=3, cfactor=2))[1], g)
        for k in (0, 2, 4)]
    assert three[0] > three[1] > three[2], three


@pytest.mark.parametrize("name", ["transformer", "tagger", "seq2seq"])
def test_transformer_multilevel_gradient_error_decays_to_round_off(name):
    m, p, x, y = _case(name, np.random.default_rng(6))
    _, g, _ = m.backprop(p, x, y)
    n_coarse = m.n_layers // 2
    errors = [relative_gradient_error(m.layer_parallel_gradient(
        p, x, y, LayerParallelSettings.with_iterations(k, k, levels=2, cfactor=2))[1], g)
        for k in range(n_coarse + 1)]
    assert errors[0] > 1e-3 and errors[-1] <= 1e-12, errors
    assert np.all(np.diff(errors) < 0), errors


def test_coarse_gru_levels_use_the_coarse_scheme():
    m = _gru("classic")
    assert m.cell(1).scheme == "classic" and m.cell(4).scheme == "implicit"
    assert GRUModel(8, 2, 3, 2, "implicit", "implicit").cell(2).scheme == "implicit"


# ----------------------------------------------------------------------------- errors
def test_bad_inputs_raise_naming_the_argument():
    m, p, x, y = _case("gru", np.random.default_rng(0))
    with pytest.raises(ValueError, match="`x`"):
        m.backprop(p, x[:, :3], y)
    with pytest.raises(ValueError, match="`scheme`"):
        GRUModel(4, 2, 3, 2, "rk4")
    t, pt, xt, yt = _case("tagger", np.random.default_rng(0))
    with pytest.raises(ValueError, match="`labels`"):
        t.backprop(pt, xt, yt[:, 0])
    with pytest.raises(ValueError, match="integer token ids"):
        t.logits(pt, xt + 0.5)
    with pytest.raises(ValueError, match="token sequences"):
        transformer_model((2,), 3, 4, 8, 1.0, {})
    with pytest.raises(ValueError, match="sequences"):
        gru_model((3, 4, 4), 2, 8)
    with pytest.raises(TypeError, match="`labels`"):
        cross_entropy(np.zeros((2, 3)), np.zeros(2), None)


# ----------------------------------------------------------------------------- training
def test_model_defaults_fill_unset_flags_only():
    c = TrainConfig(model="gru")
    assert (c.data, c.epochs, c.cfactor) == ("seq-memory", MODEL_DEFAULTS["gru"]["epochs"], 2)
    assert TrainConfig(model="transformer", layers=4).layers == 4
    assert TrainConfig().data == "peaks"
    net = build_network("gru", (1, 8, 8), 10, 1, 6, 1.0)  # digits read row by row
    assert (net.seq_len, net.input_size, net.hidden) == (8, 8, 6)


def _accuracy(tmp_path, serial, **kw):
    cfg = TrainConfig(quiet=True, serial=serial, out=str(tmp_path / f"s{int(serial)}"), **kw)
    return train(cfg).final["val_acc"]


# (model, data, overrides, chance, margin above chance): small runs of each task (the GRU on
# 2 levels with cfactor 4, cheaper than its default 3 levels with cfactor 2)
TRAINING = [
    ("gru", "seq-memory", dict(samples=1000, epochs=10, batch_size=32, lr=2e-2, levels=2,
                               cfactor=4), 0.25, 0.4),
    ("implicit-gru", "digits", dict(samples=600, epochs=6), 0.1, 0.5),
    ("transformer", "seq-duplicates",
     dict(samples=1000, epochs=4, batch_size=32, backend="numba"), 0.54, 0.2),
    ("transformer-decoder", "seq-reverse",
     dict(samples=600, epochs=4, batch_size=32, lr=1e-2, backend="numba"), 0.125, 0.5),
]


@pytest.mark.parametrize("model,data,kw,chance,margin", TRAINING, ids=[t[0] for t in TRAINING])
def test_task_trains_above_chance_layer_parallel_close_to_serial(tmp_path, model, data, kw,
                                                                  chance, margin):
    serial = _accuracy(tmp_path, True, model=model, data=data, **kw)
    parallel = _accuracy(tmp_path, False, model=model, data=data, **kw)
    assert serial > chance + margin and parallel > chance + margin, (serial, parallel)
    assert abs(serial - parallel) <= 0.05, (serial, parallel)


def test_gradient_error_study_rows():
    from refbraid.gradient_error import format_gradient_error_table
    from refbraid.sequence import sequence_gradient_error_study

    m, p, x, y = _case("gru-implicit", np.random.default_rng(7))
    rows = sequence_gradient_error_study(m, p, x, y, range(0, 5), levels=2, cfactor=4,
                                         relax="F")
    assert rows[0].label == "1 level" and rows[0].grad_error <= 1e-12
    assert rows[1].grad_error > 1e-3 and rows[-1].grad_error <= 1e-12
    assert "grad rel err" in format_gradient_error_table(rows)


@pytest.mark.parametrize("model,data", [("gru", "digits"), ("implicit-gru", "seq-memory"),
                                        ("transformer", "seq-match"),
                                        ("transformer-decoder", "seq-reverse")])
def test_cli_trains_every_sequence_model(model, data, tmp_path, capsys):
    from refbraid.cli import main

    out = tmp_path / "run"
    argv = ["train", "--model", model, "--data", data, "--samples", "60", "--epochs", "1",
            "--out", str(out), "--quiet"]
    assert main(argv) == 0
    assert f"finished {data}-{model}: 1 epochs" in capsys.readouterr().out
    assert (out / "log.json").is_file()


def test_cli_rejects_a_model_that_does_not_fit_the_data(capsys):
    from refbraid.cli import main

    assert main(["train", "--model", "transformer", "--data", "peaks"]) == 2
    assert "token sequences" in capsys.readouterr().err
    assert main(["train", "--model", "transformer-decoder", "--data", "seq-match"]) == 2
    assert "per-token labels" in capsys.readouterr().err


@pytest.mark.parametrize("name", CASES)
def test_numba_backend_matches_numpy(name):
    m, p, x, y = _case(name, np.random.default_rng(8))
    s = LayerParallelSettings.with_iterations(1, 1, levels=2, cfactor=2)
    for fn in (lambda bk: m.backprop(p, x, y, bk), lambda bk: m.layer_parallel_gradient(
            p, x, y, s, bk)):
        loss, g, _ = fn("numpy")
        loss_nb, g_nb, _ = fn("numba")
        assert abs(loss_nb - loss) <= 1e-12 and relative_gradient_error(g_nb, g) <= 1e-12
