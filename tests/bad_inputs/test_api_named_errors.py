"""Python API calls with a wrong argument raise a named ValueError/TypeError (the argument, the
value, what was expected) — not a NumPy, pickle or attribute error from deep inside."""

from __future__ import annotations

import numpy as np
import pytest

from refbraid import Network, backprop, init_params
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.scaling.predict import predict
from refbraid.sequence.generate import generate
from refbraid.sequence.gpt_model import GPTModel
from refbraid.training.checkpoint import load_checkpoint
from refbraid.training.config import TrainConfig


def _net():
    net = Network(DenseLift(2, 4, "tanh"), DenseStep(4, "tanh"), Classifier((4,), 3), 4, 1.0)
    return net, init_params(net, np.random.default_rng(0))


@pytest.mark.parametrize("value", [None, [("layers", 4)], "layers=4"])
def test_train_config_from_dict_names_a_non_dict(value):
    with pytest.raises(TypeError, match=r"`d` must be a dict of config fields"):
        TrainConfig.from_dict(value)


def test_predict_names_a_missing_machine():
    with pytest.raises(TypeError, match=r"`machine` must be a Machine .*got NoneType"):
        predict(None)


def test_backprop_names_a_string_batch():
    net, params = _net()
    with pytest.raises(TypeError, match=r"`x` must be a numeric array, got dtype <U1"):
        backprop(net, params, np.array([["a", "b"]]), np.array([0]))


@pytest.mark.parametrize("layer, params, name", [
    (DenseStep(4, "tanh"), {"W": np.zeros((4, 4)), "b": np.zeros(4)}, "y"),
    (DenseLift(2, 4, "tanh"), {"W": np.zeros((4, 2)), "b": np.zeros(4)}, "x"),
], ids=["step", "lift"])
def test_a_layer_forward_names_the_wrong_width(layer, params, name):
    from refbraid.backends import get_backend

    bk = get_backend("numpy")
    args = (params, np.zeros((3, 5))) + ((0.1, bk) if name == "y" else (bk,))
    width = params["W"].shape[1]
    with pytest.raises(ValueError, match=rf"`{name}` must have shape \(batch, {width}\) for "
                                         rf"this layer's weights, got \(3, 5\)"):
        layer.forward(*args)


def test_load_checkpoint_names_none():
    with pytest.raises(TypeError, match=r"`path` \(the checkpoint\)"):
        load_checkpoint(None)


def test_generate_names_a_prompt_longer_than_the_window():
    model = GPTModel(vocab_size=5, seq_len=4, layers=2, dim=8, heads=2, hidden=16)
    params = model.init_params(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"`prompt` has 6 tokens, more than the model's window "
                                         r"of 4"):
        generate(model, params, np.zeros((1, 6), dtype=np.int64), 1)
