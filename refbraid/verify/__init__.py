"""Verification harness: every adjoint proved, every backend checked against the reference.

For an ODE step, a plain layer, the loss or a whole network ``out = f(θ, x)`` with adjoint
``(dx, dθ) = Jᵀ w``, and each argument ``a`` (the input, each parameter array):

* dot-product test ``<J_a u, w> = <u, J_aᵀ w>``: ``J_a u`` by the complex step
  ``Im f(a + iεu)/ε`` (ε = 1e-30) on the NumPy reference, ``J_aᵀ w`` from the backend under
  test; ≤1e-12 relative in float64;
* central differences of ``<f, w>`` at sampled entries (float64), ≤1e-7 relative;
* backend against the NumPy reference (out and every adjoint output), ≤1e-12 float64,
  ≤1e-5 float32; optionally refbraid against PyTorch autograd (≤1e-12).

Modules: ``result`` (CheckResult, tolerances, table), ``probes`` (complex step, central
differences), ``ops`` (one shape for steps, layers, the loss, networks), ``checks``
(check_step, check_layer, check_network), ``suite`` (run_all), ``torch_reference``
(optional PyTorch cross-check), ``command`` (``refbraid verify``).
"""

from .checks import check_layer, check_network, check_step
from .command import add_parser
from .ops import SoftmaxCrossEntropyLayer
from .result import TOLERANCES, CheckResult, format_table
from .suite import catalog, default_networks, run_all

__all__ = [
    "TOLERANCES",
    "CheckResult",
    "SoftmaxCrossEntropyLayer",
    "add_parser",
    "catalog",
    "check_layer",
    "check_network",
    "check_step",
    "default_networks",
    "format_table",
    "run_all",
]
