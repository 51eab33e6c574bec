"""The Python API rejects bad input with a named error: a catalogue, one case per row.

Every case asserts the exception type and that the message names the argument (in backticks,
as the house style writes it). The classes, each fixed at its root by one shared check:

1. params whose names, shapes or dtypes differ from ``init_params`` — at every entry point
   (``forward``, ``backprop``, ``mgrit_forward``, ``layer_parallel_gradient``, the sequence
   models): :func:`refbraid.input_checks.check_params`;
2. an adjoint ``d…`` that would broadcast (a batch of 1 for a batch of 3), on every layer of
   the verification catalogue: :func:`refbraid.layers.init.check_adjoint`;
3. float32 and float64 mixed in one call: entry points and every layer's forward;
4. NaN/inf in inputs, parameters, ``h`` or the gradients handed to an optimizer;
5. MGRIT problems with an integer/bool ``u0`` or ``g``, or a non-finite one; where a
   divergence arose (level and iteration);
6. the MGRIT modules import one way (no cycle, not even a lazy one);
7. :class:`~refbraid.training.config.TrainConfig` fields of the wrong type.

The positive cases at the end show the checks let correct calls through unchanged.
"""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import numpy as np
import pytest

import refbraid.mgrit as mgrit_pkg
from refbraid.backends import get_backend
from refbraid.input_checks import check_params
from refbraid.layer_parallel import (
    LayerParallelSettings,
    layer_parallel_gradient,
    mgrit_forward,
)
from refbraid.layers import Classifier, DenseLift, DenseStep
from refbraid.layers.catalog import verification_catalog
from refbraid.layers.init import NonFiniteError
from refbraid.mgrit import MGRITDiverged, MGRITSettings, Problem, sequential_solve, solve
from refbraid.network import (
    Network,
    backprop,
    forward,
    init_params,
    loss_and_logits,
)
from refbraid.sequence import GRUModel, Seq2SeqModel, TransformerModel
from refbraid.training.config import TrainConfig
from refbraid.training.optim import SGD, Adam

B = 3  # batch
NUMPY = get_backend("numpy")
N = 4  # layers
EXACT = LayerParallelSettings.exact()
TWO_LEVEL = LayerParallelSettings.with_iterations(2, 2, levels=2, cfactor=2)


def _net() -> Network:
    return Network(DenseLift(2, 5, "tanh"), DenseStep(5, "tanh"), Classifier((5,), 3), N, 1.0)


def _batch(dtype=np.float64):
    rng = np.random.default_rng(1)
    return rng.standard_normal((B, 2)).astype(dtype), np.array([0, 2, 1])


# ----------------------------------------------------------------------------- 1, 3, 4: params
def _extra_row(p):
    p["steps.W"] = np.concatenate([p["steps.W"], p["steps.W"][:1]])


def _set(key, value):
    def edit(p):
        p[key] = value(p[key]) if callable(value) else value
    return edit


def _nan_at(key, index, value=np.nan):
    def edit(p):
        p[key] = p[key].copy()
        p[key][index] = value
    return edit


#: (id, edit of a good params dict, exception, the named key as a regex)
BAD_PARAMS = [
    ("extra-row-in-steps.W", _extra_row, ValueError, r"`steps\.W` must have shape \(4, 5, 5\)"),
    ("extra-same-shape-key", lambda p: p.update({"steps.W2": p["steps.W"].copy()}), ValueError,
     r"unexpected entries `steps\.W2`"),
    ("missing-key", lambda p: p.pop("steps.b"), ValueError, r"missing `steps\.b` \(shape"),
    ("transposed-closing.W", _set("closing.W", lambda v: v.T.copy()), ValueError,
     r"`closing\.W` must have shape \(3, 5\), got \(5, 3\)"),
    ("one-layer-of-steps.b", _set("steps.b", lambda v: v[0]), ValueError,
     r"`steps\.b` must have shape \(4, 5\) \(one row per layer"),
    ("integer-opening.W", _set("opening.W", lambda v: v.astype(np.int64)), TypeError,
     r"`opening\.W` must be a floating array"),
    ("float32-closing.W-among-float64", _set("closing.W", lambda v: v.astype(np.float32)),
     TypeError, r"`closing\.W` has dtype float32 but `opening\.W` has float64"),
    ("nan-in-steps.W", _nan_at("steps.W", (2, 1, 3)), NonFiniteError, r"`steps\.W` must be finite"),
    ("inf-in-closing.b", _nan_at("closing.b", 1, np.inf), NonFiniteError,
     r"`closing\.b` must be finite"),
    ("list-instead-of-array", _set("steps.b", lambda v: v.tolist()), TypeError,
     r"`steps\.b` must be an array, got list"),
]

ENTRY_POINTS = {
    "forward": lambda net, p, x, y: forward(net, p, x),
    "backprop": lambda net, p, x, y: backprop(net, p, x, y),
    "loss_and_logits": lambda net, p, x, y: loss_and_logits(net, p, x, y),
    "mgrit_forward": lambda net, p, x, y: mgrit_forward(net, p, x, TWO_LEVEL.forward),
    "layer_parallel_gradient": lambda net, p, x, y: layer_parallel_gradient(net, p, x, y,
                                                                            TWO_LEVEL),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("edit", "exc", "named"),
                         [pytest.param(e, x, m, id=i) for i, e, x, m in BAD_PARAMS])
def test_entry_points_reject_params_that_do_not_match_the_network(entry, edit, exc, named):
    net = _net()
    params = init_params(net, 0)
    edit(params)
    x, y = _batch()
    with pytest.raises(exc, match=named):
        ENTRY_POINTS[entry](net, params, x, y)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_params_that_are_not_a_dict_are_named(entry):
    x, y = _batch()
    with pytest.raises(TypeError, match=r"`params` must be a dict of named arrays"):
        ENTRY_POINTS[entry](_net(), list(init_params(_net()).values()), x, y)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("params_dtype", "x_dtype"), [(np.float32, np.float64),
                                                       (np.float64, np.float32)],
                         ids=["float32-params-float64-x", "float64-params-float32-x"])
def test_entry_points_reject_float32_and_float64_mixed(entry, params_dtype, x_dtype):
    net = _net()
    params = init_params(net, 0, params_dtype)
    x, y = _batch(x_dtype)
    with pytest.raises(TypeError, match=r"`x` has dtype .* but the parameters have"):
        ENTRY_POINTS[entry](net, params, x, y)


@pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_entry_points_reject_a_non_finite_batch(entry, bad):
    net = _net()
    x, y = _batch()
    x[1, 0] = bad
    with pytest.raises(NonFiniteError, match=r"`x` must be finite"):
        ENTRY_POINTS[entry](net, init_params(net), x, y)


# ----------------------------------------------------------------------------- sequence models
def _gru():
    m = GRUModel(seq_len=4, input_size=2, hidden=3, n_classes=2)
    x = np.random.default_rng(0).standard_normal((B, 4, 2))
    return m, m.init_params(np.random.default_rng(0)), x, np.array([0, 1, 1])


def _tagger():
    m = TransformerModel(vocab_size=5, seq_len=4, n_classes=2, layers=2, dim=4, heads=2,
                         hidden=6)
    x = np.random.default_rng(0).integers(0, 5, (B, 4))
    return m, m.init_params(np.random.default_rng(0)), x, np.array([0, 1, 1])


def _seq2seq():
    m = Seq2SeqModel(vocab_size=5, seq_len=4, n_classes=5, layers=2, dim=4, heads=2, hidden=6)
    x = np.random.default_rng(0).integers(0, 5, (B, 4))
    return m, m.init_params(np.random.default_rng(0)), x, x.copy()


SEQUENCE_CASES = [
    pytest.param(_gru, lambda p: p.update({"cell.W_xx": p["cell.W_hh"]}), ValueError,
                 r"`cell\.W_xx`", id="gru-extra-key"),
    pytest.param(_gru, lambda p: p.pop("cell.b_hh"), ValueError, r"`cell\.b_hh`",
                 id="gru-missing-key"),
    pytest.param(_gru, _nan_at("cell.W_ih", (0, 0)), NonFiniteError, r"`cell\.W_ih`",
                 id="gru-nan-weight"),
    pytest.param(_tagger, _set("steps.mlp.W1", lambda v: np.concatenate([v, v[:1]])),
                 ValueError, r"`steps\.mlp\.W1` must have shape \(2, 6, 4\)",
                 id="transformer-extra-row"),
    pytest.param(_seq2seq, lambda p: p.pop("decoder.closing.W"), ValueError,
                 r"`decoder\.closing\.W`", id="seq2seq-missing-key"),
    pytest.param(_seq2seq, lambda p: p.update({"decoder.steps.memory": np.zeros((2, 1, 4, 4))}),
                 ValueError, r"`decoder\.steps\.memory`", id="seq2seq-memory-is-not-a-param"),
]


@pytest.mark.parametrize("method", ["backprop", "layer_parallel_gradient", "logits"])
@pytest.mark.parametrize(("make", "edit", "exc", "named"), SEQUENCE_CASES)
def test_sequence_models_check_their_params(make, edit, exc, named, method):
    model, params, x, y = make()
    edit(params)
    call = {"backprop": lambda: model.backprop(params, x, y),
            "layer_parallel_gradient": lambda: model.layer_parallel_gradient(params, x, y, EXACT),
            "logits": lambda: model.logits(params, x)}[method]
    with pytest.raises(exc, match=named):
        call()


def test_gru_model_rejects_float32_input_with_float64_params():
    model, params, x, y = _gru()
    with pytest.raises(TypeError, match=r"`x` has dtype float32"):
        model.backprop(params, x.astype(np.float32), y)


# ----------------------------------------------------------------------------- 2, 3: layers
CATALOG = verification_catalog()


def _layer_call(layer, dtype=np.float64, x_dtype=None):
    """(forward output, cache, params, x) of a catalogue layer at batch B."""
    rng = np.random.default_rng(2)
    params = layer.init(rng, dtype)
    step = hasattr(layer, "state_shape")
    shape = layer.state_shape if step else layer.in_shape
    x = rng.standard_normal((B, *shape)).astype(x_dtype or dtype)
    if step:
        out, cache = layer.forward(params, x, 0.1, NUMPY)
    else:
        out, cache = layer.forward(params, x, NUMPY)
    return out, cache, params, x


@pytest.mark.parametrize(("name", "layer"), CATALOG, ids=[n for n, _ in CATALOG])
def test_adjoint_rejects_an_adjoint_that_would_broadcast_over_the_batch(name, layer):
    out, cache, params, _ = _layer_call(layer)
    one = np.ones((1, *out.shape[1:]))  # a batch of 1 where the forward had B
    with pytest.raises(ValueError, match=r"`d(y_next|out|logits|h_new)` must have the shape of "
                                         r"the forward output"):
        if hasattr(layer, "state_shape"):
            layer.adjoint(params, cache, one, 0.1, NUMPY)
        else:
            layer.adjoint(params, cache, one, NUMPY)


@pytest.mark.parametrize("backend_name", ["numpy", "numba", "cuda"])
def test_adjoint_broadcast_is_rejected_on_every_backend(backend_name):
    bk = get_backend(backend_name)
    layer = DenseStep(4)
    rng = np.random.default_rng(0)
    params = layer.init(rng)
    out, cache = layer.forward(params, rng.standard_normal((B, 4)), 0.1, bk)
    with pytest.raises(ValueError, match=r"`dy_next` must have the shape of the forward output "
                                         r"\(3, 4\), got \(1, 4\)"):
        layer.adjoint(params, cache, np.ones((1, 4)), 0.1, bk)


#: layers with weights (pooling and zero-channel widening have none: no dtype to mix with)
WEIGHTED = [(n, layer) for n, layer in CATALOG if layer.init(np.random.default_rng(0))]


@pytest.mark.parametrize(("name", "layer"), WEIGHTED, ids=[n for n, _ in WEIGHTED])
def test_layer_forward_rejects_float32_input_with_float64_params(name, layer):
    with pytest.raises(TypeError, match=r"`(x|y|h)` has dtype float32 but `params\["):
        _layer_call(layer, np.float64, x_dtype=np.float32)


STEPS = [(n, layer) for n, layer in CATALOG if hasattr(layer, "state_shape")]


@pytest.mark.parametrize("h", [float("nan"), float("inf"), 0.0, -0.1, "0.1"],
                         ids=["nan", "inf", "zero", "negative", "string"])
@pytest.mark.parametrize(("name", "layer"), STEPS, ids=[n for n, _ in STEPS])
def test_step_forward_rejects_a_bad_step_size(name, layer, h):
    rng = np.random.default_rng(2)
    y = rng.standard_normal((B, *layer.state_shape))
    with pytest.raises(ValueError, match=r"`(h|dt)` must be a positive finite number"):
        layer.forward(layer.init(rng), y, h, NUMPY)


@pytest.mark.parametrize(("name", "layer"), STEPS, ids=[n for n, _ in STEPS])
def test_step_adjoint_rejects_a_non_finite_step_size(name, layer):
    out, cache, params, _ = _layer_call(layer)
    with pytest.raises(ValueError, match=r"`(h|dt)` must be a positive finite number"):
        layer.adjoint(params, cache, np.ones_like(out), float("nan"), NUMPY)


# ----------------------------------------------------------------------------- 4: optimizers
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("make", [lambda: SGD(0.1, momentum=0.9), lambda: Adam(1e-3)],
                         ids=["sgd", "adam"])
def test_optimizers_reject_non_finite_gradients_and_leave_params_alone(make, bad):
    params = init_params(_net(), 0)
    before = {k: v.copy() for k, v in params.items()}
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    grads["steps.W"][1, 2, 0] = bad
    opt = make()
    with pytest.raises(NonFiniteError, match=r"`grads\['steps\.W'\]` must be finite"):
        opt.step(params, grads)
    assert all(np.array_equal(params[k], before[k]) for k in params) and opt.t == 0


def test_optimizer_rejects_a_gradient_that_is_not_an_array():
    params = init_params(_net(), 0)
    grads = {k: np.zeros_like(v) for k, v in params.items()}
    grads["closing.b"] = [0.0, 0.0, 0.0]
    with pytest.raises(TypeError, match=r"`grads\['closing\.b'\]` must be an array"):
        SGD(0.1).step(params, grads)


# ----------------------------------------------------------------------------- 5: MGRIT
def _double(u, start, stop):
    return 2 * u


BAD_PROBLEMS = [
    pytest.param(dict(u0=np.array([1, 1])), TypeError, r"`u0` must be a floating .* int64",
                 id="integer-u0"),
    pytest.param(dict(u0=np.array([True, False])), TypeError, r"`u0` must be a floating",
                 id="bool-u0"),
    pytest.param(dict(u0=np.array([1.0, np.nan])), ValueError, r"`u0` must be finite",
                 id="nan-u0"),
    pytest.param(dict(u0=np.array([np.inf, 1.0])), ValueError, r"`u0` must be finite",
                 id="inf-u0"),
    pytest.param(dict(u0=np.ones(2), g=np.ones((4, 2), dtype=np.int64)), TypeError,
                 r"`g` must be a floating", id="integer-g"),
    pytest.param(dict(u0=np.ones(2), g=np.full((4, 2), np.nan)), ValueError,
                 r"`g` must be finite", id="nan-g"),
]


@pytest.mark.parametrize("how", ["Problem", "sequential_solve", "solve"])
@pytest.mark.parametrize(("kwargs", "exc", "named"), BAD_PROBLEMS)
def test_mgrit_rejects_integer_or_non_finite_u0_and_g(kwargs, exc, named, how):
    class Duck:  # the solvers also take any object with step, u0, n_steps (and g)
        step, n_steps, g = staticmethod(_double), 3, None

    duck = Duck()
    for k, v in kwargs.items():
        setattr(duck, k, v)
    build = {"Problem": lambda: Problem(_double, n_steps=3, **kwargs),
             "sequential_solve": lambda: sequential_solve(duck),
             "solve": lambda: solve(duck, MGRITSettings(levels=2, cfactor=3, min_coarse=1))}[how]
    with pytest.raises(exc, match=named):
        build()


def _nan_on(span: int):
    """A step that is NaN on intervals of ``span`` fine steps (one coarse level), else 0.9 u."""
    def step(u, start, stop):
        return u * np.nan if abs(stop - start) == span else 0.9 * u
    return step


@pytest.mark.parametrize(("span", "level", "where"), [
    (1, 0, r"on level 0 \(the fine grid\)"),
    (2, 1, r"on level 1 \(a coarse level; the NaN/inf arose there in the cycle after "
           r"iteration 0"),
    (4, 2, r"on level 2 \(the coarsest, solved exactly; the NaN/inf arose there"),
], ids=["fine", "middle", "coarsest"])
def test_mgrit_diverged_names_the_iteration_and_the_level_where_it_arose(span, level, where):
    problem = Problem(_nan_on(span), np.ones(2), 16)
    with pytest.raises(MGRITDiverged, match=rf"MGRIT diverged at iteration \d+ {where}") as info:
        solve(problem, MGRITSettings(levels=3, cfactor=2, max_iter=5))
    assert info.value.level == level
    assert info.value.iteration == info.value.result.iterations
    assert "nan" in str(info.value)


# ----------------------------------------------------------------------------- 6: imports
def _imports(path: Path) -> set[str]:
    """Sibling modules of refbraid.mgrit that ``path`` imports, at any depth (lazy too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_mgrit_modules_import_one_way():
    folder = Path(mgrit_pkg.__file__).parent
    graph = {p.stem: _imports(p) for p in folder.glob("*.py") if p.stem != "__init__"}
    state: dict[str, str] = {}

    def visit(node, path):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            assert state.get(nxt) != "open", f"import cycle: {' -> '.join([*path, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    from refbraid.mgrit.problem import namespace  # still importable from its old home

    assert namespace(np.ones(1)) is np


# ----------------------------------------------------------------------------- 7: TrainConfig
BAD_CONFIGS = [
    ("quiet-string", dict(quiet="no"), TypeError, r"`--quiet` must be True or False"),
    ("serial-string", dict(serial="yes"), TypeError, r"`--serial` must be True or False"),
    ("skip_down-int", dict(skip_down=1), TypeError, r"`--skip-down` must be True or False"),
    ("overwrite-string", dict(overwrite="yes"), TypeError, r"`--overwrite` must be True"),
    ("out-int", dict(out=123), TypeError, r"`--out` must be a folder name \(a string\)"),
    ("out-empty", dict(out=""), ValueError, r"`--out` must be a folder name, got ''"),
    ("data_dir-int", dict(data_dir=5), TypeError, r"`--data-dir` must be a folder name"),
    ("data_dir-blank", dict(data_dir="  "), ValueError, r"`--data-dir` must be a folder name"),
    ("resume-empty", dict(resume=""), ValueError, r"`--resume` must be a checkpoint file"),
    ("backend-int", dict(backend=1), ValueError, r"`--backend` must be one of"),
    ("dtype-numpy-dtype", dict(dtype=np.float32), ValueError, r"`--dtype` must be one of"),
    ("cycle-list", dict(cycle=["V"]), ValueError, r"`--cycle` must be one of"),
    ("optimizer-array", dict(optimizer=np.array(["adam", "sgd"])), ValueError,
     r"`--optimizer` must be one of"),
    ("relax-empty-entry", dict(relax="F,,FCF"), ValueError, r"`--relax` .* empty entry"),
    ("relax-trailing-comma", dict(relax="F,"), ValueError, r"`--relax` .* empty entry"),
    ("relax-unknown", dict(relax="F,C"), ValueError, r"`--relax` must be a comma-separated"),
    ("relax-list", dict(relax=["F", "FCF"]), ValueError, r"`--relax` must be a comma-separated"),
    ("relax-too-long", dict(relax="F,FCF,FCF"), ValueError,
     r"`--relax` lists 3 levels .* `--levels 3` has only 2 levels that relax"),
    ("relax-too-long-2-levels", dict(levels=2, relax="F,FCF"), ValueError,
     r"`--relax` lists 2 levels .* `--levels 2` has only 1 level that relaxes"),
    ("layers-float", dict(layers=2.5), ValueError, r"`--layers` must be a positive integer"),
    ("layers-bool", dict(layers=True), ValueError, r"`--layers` must be a positive integer"),
    ("seed-numpy-float", dict(seed=np.float64(1.0)), ValueError, r"`--seed` must be a non-neg"),
    ("T-string", dict(T="3"), ValueError, r"`--T` must be a positive finite number"),
    ("lr-bool", dict(lr=True), ValueError, r"`--lr` must be a positive finite number"),
    ("momentum-numpy-1.5", dict(momentum=np.float64(1.5)), ValueError,
     r"`--momentum` must be a number in \[0, 1\)"),
]


@pytest.mark.parametrize(("kwargs", "exc", "named"),
                         [pytest.param(k, e, m, id=i) for i, k, e, m in BAD_CONFIGS])
def test_train_config_rejects_fields_of_the_wrong_type(kwargs, exc, named):
    with pytest.raises(exc, match=named):
        TrainConfig(**kwargs)


# ----------------------------------------------------------------------------- positive cases
def test_numpy_scalars_are_accepted_and_stored_as_plain_python_values():
    cfg = TrainConfig(layers=np.int64(16), width=np.int32(8), seed=np.int64(3),
                      T=np.float64(2.0), lr=np.float32(0.5), momentum=np.float64(0.5),
                      quiet=np.bool_(True), out=Path("some/folder"))
    assert (cfg.layers, cfg.width, cfg.seed, cfg.T, cfg.quiet, cfg.out) == \
        (16, 8, 3, 2.0, True, "some/folder")
    for name in ("layers", "width", "seed"):
        assert type(getattr(cfg, name)) is int, name
    for name in ("T", "lr", "momentum"):
        assert type(getattr(cfg, name)) is float, name
    assert type(cfg.quiet) is bool
    assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_overwrite_is_a_validated_field_after_resume():
    from dataclasses import fields

    from refbraid.training.config import RESUME_MUST_MATCH

    names = [f.name for f in fields(TrainConfig)]
    assert names[names.index("resume") + 1] == "overwrite"
    assert TrainConfig().overwrite is False and TrainConfig(overwrite=True).overwrite is True
    assert "overwrite" not in RESUME_MUST_MATCH


def test_relax_fits_the_levels_and_a_model_default_is_cut_to_fit():
    assert TrainConfig().relax_per_level == ("F", "FCF")
    assert TrainConfig(relax="f, fcf").relax_per_level == ("F", "FCF")
    two = TrainConfig(levels=2)  # the resnet default 'F,FCF' is written for 3 levels
    assert two.relax == "F" and two.relax_per_level == ("F",)
    assert TrainConfig.from_dict(two.to_dict()) == two
    one = TrainConfig(levels=1, relax="F,FCF,FCF,F")  # nothing relaxes: any list is unused
    assert one.relax_per_level == ()
    assert TrainConfig(levels=4, relax="FCF").relax_per_level == ("FCF",) * 3


def test_correct_calls_still_work_and_match_a_hand_written_forward():
    net = _net()
    params = init_params(net, 0)
    x, y = _batch()
    v = np.tanh(x @ params["opening.W"].T + params["opening.b"])  # the network, by hand
    for n in range(N):
        v = v + net.h * np.tanh(v @ params["steps.W"][n].T + params["steps.b"][n])
    by_hand = v @ params["closing.W"].T + params["closing.b"]
    logits, states, _ = forward(net, params, x)
    np.testing.assert_allclose(logits, by_hand, rtol=1e-14, atol=1e-14)
    loss, grads, _ = backprop(net, params, x, y)
    loss_lp, grads_lp, _ = layer_parallel_gradient(net, params, x, y, EXACT)
    assert loss_lp == pytest.approx(loss, rel=1e-14)
    for k in params:
        np.testing.assert_allclose(grads_lp[k], grads[k], rtol=1e-12, atol=1e-15, err_msg=k)
    assert check_params(net, params) == np.float64
    assert check_params(net, {k: v.astype(np.float32) for k, v in params.items()}) == np.float32


@pytest.mark.parametrize("make", [_gru, _tagger, _seq2seq], ids=["gru", "transformer",
                                                                  "seq2seq"])
def test_sequence_models_accept_their_own_init_params(make):
    model, params, x, y = make()
    loss, grads, _ = model.backprop(params, x, y)
    assert math.isfinite(loss) and set(grads) == set(params)
    loss_lp, _, _ = model.layer_parallel_gradient(params, x, y, EXACT)
    assert loss_lp == pytest.approx(loss, rel=1e-12)


def test_a_python_number_u0_is_taken_as_float64_and_never_truncated():
    assert sequential_solve(Problem(_double, 1, 3)).tolist() == [1.0, 2.0, 4.0, 8.0]
    u0 = np.ones(2)
    exact = sequential_solve(Problem(lambda u, a, b: 2 * u, u0, 3))
    res = solve(Problem(lambda u, a, b: 2 * u, u0, 3),
                MGRITSettings(levels=2, cfactor=3, min_coarse=1))
    np.testing.assert_array_equal(exact[-1], [8.0, 8.0])
    np.testing.assert_allclose(res.solution[-1], [8.0, 8.0])
