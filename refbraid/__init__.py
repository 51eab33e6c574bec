"""refbraid: layer-parallel training of deep networks with MGRIT, in the open.

A residual network is forward Euler, ``y[n+1] = y[n] + h·F(θ_n, y[n])``, and backprop is its
discrete adjoint. refbraid treats layers as time steps and solves the forward and adjoint
propagation with multigrid reduction in time (MGRIT), with hand-written adjoints and kernels
on interchangeable backends (NumPy reference, Numba CPU, Numba CUDA, CuPy).
"""

from .interrupts import guard_startup

guard_startup()  # the `refbraid` command only: Ctrl-C during the imports below exits 130

from .backends import BACKENDS, available_backends, get_backend  # noqa: E402
from .network import Network, backprop, forward, init_params  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "Network",
    "available_backends",
    "backprop",
    "forward",
    "get_backend",
    "init_params",
]
