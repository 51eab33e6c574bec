"""`refbraid verify` and the harness itself: the table, the exit codes, and proof that the
checks can fail (deliberately broken adjoints, a broken backend kernel)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import refbraid.verify.suite as suite
from refbraid.backends import Backend, get_backend
from refbraid.cli import main
from refbraid.layers import DenseLift, DenseStep
from refbraid.verify import CheckResult, check_layer, check_step, format_table, run_all


# ----------------------------------------------------------------------------- broken layers
class DropsIdentity(DenseStep):
    """Forgets the identity term: dy = s W instead of dy_next + s W."""

    def adjoint(self, params, cache, dy_next, h, bk, grads=True):
        dy, dparams = super().adjoint(params, cache, dy_next, h, bk, grads)
        return dy - dy_next, dparams


class TransposedWeightGradient(DenseStep):
    """Returns dWᵀ instead of dW."""

    def adjoint(self, params, cache, dy_next, h, bk, grads=True):
        dy, dparams = super().adjoint(params, cache, dy_next, h, bk, grads)
        return dy, (None if dparams is None else {**dparams, "W": dparams["W"].T})


class ForgetsActivationSlope(DenseLift):
    """Backpropagates through σ as if σ' = 1."""

    def adjoint(self, params, cache, dout, bk):
        x, _ = cache
        dx, dW, db = bk.linear_adjoint(x, params["W"], dout)
        return dx, {"W": dW, "b": db}


def _failed(results) -> dict[str, CheckResult]:
    return {r.check: r for r in results if not r.passed}


def test_an_adjoint_without_the_identity_term_fails_on_y_only():
    failed = _failed(check_step(DropsIdentity(4, "tanh"), name="broken"))
    assert set(failed) == {"dot:y", "fd:y"}
    assert failed["fd:y"].max_rel_error > 0.1
    assert failed["fd:y"].detail.startswith("`y`[")  # names the argument and the index
    assert "central difference" in failed["fd:y"].detail
    assert "broken fd:y" in str(failed["fd:y"])


def test_a_transposed_weight_gradient_fails_on_W_only():
    failed = _failed(check_step(TransposedWeightGradient(4, "gelu"), name="broken"))
    assert set(failed) == {"dot:W", "fd:W"}
    assert "`W`" in failed["dot:W"].detail and "<J u, w>" in failed["dot:W"].detail


def test_a_lift_that_ignores_the_activation_slope_fails_everywhere():
    failed = _failed(check_layer(ForgetsActivationSlope(3, 4, "tanh"), name="broken"))
    assert set(failed) == {"dot:x", "dot:W", "dot:b", "fd:x", "fd:W", "fd:b"}


def test_a_wrong_backend_kernel_fails_against_numpy_and_the_dot_product():
    numpy_bk = get_backend("numpy")

    def linear_adjoint(x, W, dz):
        dx, dW, db = numpy_bk.linear_adjoint(x, W, dz)
        return dx, dW * (1 + 1e-9), db  # a tiny error in one output

    kernels = {**numpy_bk.kernels, "linear_adjoint": linear_adjoint}
    broken = Backend(name="broken", xp=np, kernels=kernels, overrides=("linear_adjoint",))
    failed = _failed(check_step(DenseStep(4, "tanh"), broken, name="dense"))
    assert set(failed) == {"dot:W", "numpy:dW"}  # 1e-9 is below what central differences see
    assert failed["numpy:dW"].backend == "broken"
    assert failed["numpy:dW"].detail.startswith("`dW`[")


def test_an_adjoint_with_the_wrong_arguments_is_reported():
    class NoBias(DenseStep):
        def adjoint(self, params, cache, dy_next, h, bk, grads=True):
            dy, dparams = super().adjoint(params, cache, dy_next, h, bk, grads)
            return dy, (None if dparams is None else {"W": dparams["W"]})

    failed = _failed(check_step(NoBias(3), name="nobias"))
    assert set(failed) == {"adjoint:layout"}
    assert "expected ['W', 'b', 'y']" in failed["adjoint:layout"].detail


# ----------------------------------------------------------------------------- table
def test_format_table_lists_every_check_and_the_verdict():
    results = [
        CheckResult("dense", "dot:y", "numpy", "float64", 1e-16, 1e-12, True),
        CheckResult("dense", "fd:W", "numpy", "float64", 3e-3, 1e-7, False, "`W`[1, 2]: ..."),
    ]
    table = format_table(results)
    lines = table.splitlines()
    assert lines[0].split() == ["layer", "check", "backend", "dtype", "max", "rel", "err", "tol",
                                "result"]
    assert "1.00e-16" in lines[2] and lines[2].endswith("PASS")
    assert "3.00e-03" in lines[3] and lines[3].endswith("FAIL")
    assert lines[4].strip() == "^ `W`[1, 2]: ..."
    assert lines[-1] == "2 checks, 1 FAILED"


def test_run_all_rejects_unknown_or_unavailable_backends_and_dtypes():
    with pytest.raises(ValueError, match="`backend` must be one of"):
        run_all(["tpu"])
    with pytest.raises(ValueError, match="`dtype` must be one of"):
        run_all(["numpy"], dtypes=(np.int32,))


# ----------------------------------------------------------------------------- CLI
def test_verify_numpy_passes_and_prints_the_table(capsys):
    assert main(["verify", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["layer", "check", "backend"]
    for name, _ in suite.catalog():
        assert name in out
    assert "dense_net" in out and "conv_net" in out
    assert "FAIL" not in out and out.strip().endswith("all pass")


def test_verify_float32_and_both(capsys):
    assert main(["verify", "--backend", "numpy", "--dtype", "both"]) == 0
    out = capsys.readouterr().out
    assert "float32" in out and "float64" in out


def test_verify_exits_non_zero_when_a_layer_is_broken(capsys, monkeypatch):
    monkeypatch.setattr(suite, "verification_catalog",
                        lambda: [("broken_step", DropsIdentity(4, "tanh"))])
    assert main(["verify", "--backend", "numpy"]) == 1
    out = capsys.readouterr().out
    assert "broken_step" in out and "FAIL" in out and "^ `y`[" in out
    assert "FAILED" in out.splitlines()[-1]


def test_verify_reports_an_unavailable_backend(capsys):
    from refbraid.backends import available_backends

    if "cupy" in available_backends():
        pytest.skip("cupy is available here")
    assert main(["verify", "--backend", "cupy"]) == 2
    assert "`backend` 'cupy' is not available here" in capsys.readouterr().err


def test_verify_layer_parallel_prints_the_gradient_error_table(capsys, monkeypatch):
    import refbraid.verify.command as command
    from refbraid.gradient_error import gradient_error_study

    def study(net, params, x, y, iterations, bk, default=None):  # fewer cycles, same code
        return gradient_error_study(net, params, x[:8], y[:8], range(0, 16, 5), bk, default)

    monkeypatch.setattr("refbraid.gradient_error.gradient_error_study", study)
    assert main(["verify", "--layer-parallel"]) == 0
    out = capsys.readouterr().out
    assert "grad rel err" in out and "1 level" in out and "PASS" in out
    assert command.CONVERGED_TOL <= 1e-10


def test_verify_torch_without_torch_says_so(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["verify", "--backend", "numpy", "--torch"]) == 2
    assert "--torch needs PyTorch" in capsys.readouterr().err


def test_verify_torch(capsys):
    pytest.importorskip("torch")
    assert main(["verify", "--backend", "numpy", "--torch"]) == 0
    out = capsys.readouterr().out
    assert "torch:dW" in out and "torch:out" in out and "FAIL" not in out
