"""PyTorch ODE-nets and modules ⇄ refbraid: bit-exact round trips, loss and gradients equal to
autograd (≤ 1e-12, float64), clear errors for what cannot be converted."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is optional; the interop tests need it")
from torch import nn  # noqa: E402

from refbraid import backprop  # noqa: E402
from refbraid.backends import get_backend  # noqa: E402
from refbraid.interop import (  # noqa: E402
    NetSpec,
    convert_module,
    from_state_dict,
    from_torch,
    module_state_dict,
    params_from_keyed,
    supported,
    to_state_dict,
)
from refbraid.interop.autograd import torch_loss_and_gradient  # noqa: E402
from refbraid.network import forward  # noqa: E402

from .torch_nets import ODENet, batch, conv_net, dense_net  # noqa: E402

TOL = 1e-12
BK = get_backend("numpy")


def rel(a, b):
    return float(np.linalg.norm(np.ravel(a) - np.ravel(b)) / max(np.linalg.norm(b), 1e-300))


def assert_same_state(a: dict, b: dict):
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("make, shape", [(dense_net, (3,)), (conv_net, (1, 5, 4))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_network_round_trip_is_bit_exact(make, shape, dtype):
    model = make(dtype=dtype)
    conv = from_torch(model, shape)
    assert_same_state(to_state_dict(conv), model.state_dict())
    spec = NetSpec.from_mapping(conv.spec.as_dict())  # the spec survives JSON
    assert_same_state(to_state_dict(from_state_dict(model.state_dict(), spec)),
                      model.state_dict())


@pytest.mark.parametrize("make, shape", [(dense_net, (3,)), (conv_net, (1, 5, 4))])
def test_loss_and_gradient_equal_autograd(make, shape):
    model = make()
    conv = from_torch(model, shape)
    n_classes = conv.net.closing.out_shape[0]
    x, labels = batch(shape, n_classes)
    loss, grads, _ = backprop(conv.net, conv.params, x, labels)
    t_loss, t_grads = torch_loss_and_gradient(model, x, labels)
    assert abs(loss - t_loss) <= TOL * abs(t_loss)
    theirs = params_from_keyed(conv, t_grads)
    for k in grads:
        assert rel(grads[k], theirs[k]) <= TOL, k
    with torch.no_grad():
        logits = model(torch.from_numpy(x)).numpy()
    ours, _, _ = forward(conv.net, conv.params, x)
    assert rel(ours, logits) <= TOL


def test_plain_state_dict_with_a_spec():
    """Users without refbraid's module structure: a state dict with their own names."""
    model = dense_net()
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("steps."):
            n, rest = k.split(".")[1], k.split(".", 3)[3]
            sd[f"blocks.{n}.fc.{rest}"] = v
        else:
            sd[k.replace("opening.0", "inp").replace("closing", "out")] = v
    spec = {"T": 1.5, "input_shape": [3],
            "opening": {"module": "Linear", "key": "inp", "activation": "tanh"},
            "steps": {"module": "Linear", "key": "blocks.{n}.fc", "activation": "tanh"},
            "closing": {"module": "Linear", "key": "out"}}
    conv = from_state_dict(sd, spec)
    assert conv.net.n_layers == 6 and conv.net.step.activation == "tanh"
    assert_same_state(to_state_dict(conv), sd)
    ref = from_torch(model, (3,))
    for k in ref.params:
        assert np.array_equal(conv.params[k], ref.params[k])


# ----------------------------------------------------------------------------- single modules
def _compare_module(module, role, in_shape, x, run_torch, run_ours, **options):
    layer, params, keys = convert_module(module, role, in_shape, **options)
    assert_same_state(module_state_dict(params, keys, module.state_dict()), module.state_dict())
    module = module.double()
    xt = torch.from_numpy(x).requires_grad_(True)
    out_t = run_torch(module, xt)
    w = np.random.default_rng(2).standard_normal(tuple(out_t.shape))
    out_t.backward(torch.from_numpy(w))
    out, dx, dparams = run_ours(layer, params, x, w)
    assert rel(out, out_t.detach().numpy()) <= TOL
    assert rel(dx, xt.grad.numpy()) <= TOL
    named = dict(module.named_parameters())
    for name, key in keys.items():
        assert rel(dparams[name], named[key].grad.numpy()) <= TOL, name


def _run_step(layer, params, y, w, h=0.3):
    out, cache = layer.forward(params, y, h, BK)
    dy, dp = layer.adjoint(params, cache, w, h, BK)
    return out, dy, dp


def _run_layer(layer, params, x, w):
    out, cache = layer.forward(params, x, BK)
    dx, dp = layer.adjoint(params, cache, w, BK)
    return out, dx, dp


RNG = np.random.default_rng(3)
H = 0.3


def test_linear_and_conv_steps():
    _compare_module(nn.Linear(4, 4), "step", (4,), RNG.standard_normal((3, 4)),
                    lambda m, y: y + H * m(y), _run_step)
    _compare_module(nn.Conv2d(2, 2, 3, padding=1), "step", (2, 4, 3),
                    RNG.standard_normal((2, 2, 4, 3)), lambda m, y: y + H * m(y), _run_step)


def test_layernorm_and_attention():
    _compare_module(nn.LayerNorm(4, eps=1e-6), "layer", (3, 4), RNG.standard_normal((2, 3, 4)),
                    lambda m, x: m(x), _run_layer)
    _compare_module(nn.MultiheadAttention(4, 2, batch_first=True), "layer", (3, 4),
                    RNG.standard_normal((2, 3, 4)),
                    lambda m, x: m(x, x, x, need_weights=False)[0], _run_layer)


def test_transformer_encoder_layer_step():
    layer = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    _compare_module(layer, "step", (3, 4), RNG.standard_normal((2, 3, 4)),
                    lambda m, y: y + H * (m(y) - y), _run_step)


def test_transformer_decoder_layer_step():
    layer = nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    memory = RNG.standard_normal((1, 2, 4))
    mask = torch.triu(torch.ones(3, 3, dtype=torch.bool), 1)

    def theirs(m, y):
        return y + H * (m(y, torch.from_numpy(memory).expand(y.shape[0], -1, -1),
                          tgt_mask=mask) - y)

    def ours(step, params, y, w):
        return _run_step(step, {**params, "memory": memory}, y, w)

    _compare_module(layer, "step", (3, 4), RNG.standard_normal((2, 3, 4)), theirs, ours,
                    memory_len=2)


def test_gru_cell_step():
    x_in = RNG.standard_normal((1, 3))

    def theirs(m, y):
        return y + H * (m(torch.from_numpy(x_in).expand(y.shape[0], -1), y) - y)

    def ours(cell, params, y, w):
        return _run_step(cell, {**params, "x": x_in}, y, w)

    _compare_module(nn.GRUCell(3, 4), "step", (4,), RNG.standard_normal((2, 4)), theirs, ours)


# ----------------------------------------------------------------------------- errors
def test_unsupported_module_is_named():
    model = ODENet(nn.Sequential(nn.Linear(3, 5), nn.Tanh()),
                   [nn.Sequential(nn.Linear(5, 5), nn.Softplus())],
                   nn.Linear(5, 2), 1.0)
    with pytest.raises(ValueError, match=r"step 0: unsupported activation `Softplus`"):
        from_torch(model, (3,))
    model.steps[0] = nn.Sequential(nn.Bilinear(5, 5, 5))
    with pytest.raises(ValueError, match=r"unsupported module `Bilinear` as step; supported "
                                         r"step modules: .*Conv2d.*Linear"):
        from_torch(model, (3,))
    assert "Conv2d" in supported("step") and "MultiheadAttention" in supported("layer")
    model.steps[0] = nn.TransformerEncoderLayer(5, 1, 6, batch_first=True, norm_first=True,
                                                dropout=0.0, activation="gelu")
    with pytest.raises(ValueError, match=r"step 0: `TransformerEncoderLayer` converts one "
                                         r"module at a time"):
        from_torch(model, (3,))


def test_unsupported_options_and_shapes_are_named():
    with pytest.raises(ValueError, match="Conv2d: only 3×3 kernels"):
        convert_module(nn.Conv2d(2, 2, 5, padding=2), "step", (2, 4, 4))
    with pytest.raises(ValueError, match="norm_first=True"):
        convert_module(nn.TransformerEncoderLayer(4, 2, 6, batch_first=True), "step", (3, 4))
    with pytest.raises(ValueError, match=r"input shape \(4,\) does not match in_features 3"):
        from_torch(dense_net(), (4,))
    model = dense_net()
    sd = dict(model.state_dict())
    sd["steps.2.0.weight"] = torch.zeros(5, 4, dtype=torch.float64)
    spec = from_torch(model, (3,)).spec
    with pytest.raises(ValueError, match=r"step 2: `steps.2.0.weight` has shape \(5, 4\)"):
        from_state_dict(sd, spec)
    sd = dict(model.state_dict(), extra=torch.zeros(1))
    with pytest.raises(ValueError, match=r"entries the spec does not place: \['extra'\]"):
        from_state_dict(sd, spec)
    with pytest.raises(ValueError, match=r"spec `steps.key` must contain `\{n\}`"):
        NetSpec.from_mapping({**spec.as_dict(), "steps": {"module": "Linear", "key": "s"}})
