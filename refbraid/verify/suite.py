"""The whole verification suite: every catalogued layer, the loss and two small networks, on
every backend and dtype asked for (what ``refbraid verify`` runs)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..backends import BACKENDS, available_backends
from ..layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from ..layers.catalog import verification_catalog
from ..network import Network
from ..stages.transfer_layers import transfer_catalog
from .checks import check_layer, check_network, check_step
from .ops import SoftmaxCrossEntropyLayer
from .result import CheckResult, tolerance


def catalog() -> list[tuple[str, object]]:
    """refbraid.layers.catalog.verification_catalog(), the loss as a layer, and the spatial
    transfers R, P and stage transitions (refbraid.stages.transfer_layers)."""
    return [*verification_catalog(), ("softmax_xent", SoftmaxCrossEntropyLayer(4)),
            *transfer_catalog()]


def default_networks() -> list[tuple[str, Network]]:
    """A small dense (peaks-like, 2 → 6 wide, tanh) and a small conv (1×5×5 → 3 channels, relu)
    network of 3 layers each: big enough to chain every adjoint, small for the simulator."""
    return [
        ("dense_net", Network(DenseLift(2, 6, "tanh"), DenseStep(6, "tanh"),
                              Classifier((6,), 5), n_layers=3)),
        ("conv_net", Network(ConvLift(1, 3, 5, 5, "relu"), ConvStep(3, 5, 5, "relu"),
                             Classifier((3, 5, 5), 4), n_layers=3)),
    ]


def check_entry(name: str, layer, backend: str = "numpy", dtype=np.float64,
                seed: int = 0) -> list[CheckResult]:
    """check_step for an ODE step (it has ``state_shape``), check_layer for anything else."""
    if hasattr(layer, "state_shape"):
        return check_step(layer, backend, dtype, seed=seed, name=name)
    return check_layer(layer, backend, dtype, seed=seed, name=name)


def resolve_backends(backends: Sequence[str] | None) -> list[str]:
    """The backends to check: all available ones by default; unknown or unavailable raise."""
    here = available_backends()
    if backends is None:
        return here
    if isinstance(backends, str):
        backends = [backends]
    for name in backends:
        if name not in BACKENDS:
            raise ValueError(f"`backend` must be one of {BACKENDS}, got {name!r}.")
        if name not in here:
            raise ValueError(
                f"`backend` {name!r} is not available here (available: {', '.join(here)}); "
                "cuda needs a GPU or NUMBA_ENABLE_CUDASIM=1 set before numba is imported, "
                "cupy needs a GPU.")
    return list(dict.fromkeys(backends))


def run_all(backends: Sequence[str] | None = None, dtypes: Sequence = (np.float64,),
            torch: bool = False, seed: int = 0) -> list[CheckResult]:
    """Every check of every catalogued layer, the loss and the default networks, for each
    backend (default: refbraid.backends.available_backends()) and dtype; with ``torch``, the
    PyTorch cross-check too (float64; needs torch installed)."""
    names = resolve_backends(backends)
    dtypes = [np.dtype(d) for d in dtypes]
    for d in dtypes:
        tolerance(d, "numpy")  # validates the dtype before any work
    if torch:
        from . import torch_reference  # raises ModuleNotFoundError without torch
    results: list[CheckResult] = []
    for backend in names:
        for dtype in dtypes:
            for name, layer in catalog():
                results += check_entry(name, layer, backend, dtype, seed)
            for name, net in default_networks():
                results += check_network(net, backend, dtype, seed=seed, name=name)
        if torch:
            for name, layer in catalog():
                results += torch_reference.torch_checks(name, layer, backend, seed=seed)
    return results
