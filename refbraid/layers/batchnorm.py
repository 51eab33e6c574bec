"""Batch normalisation of images, as ``torch.nn.BatchNorm2d``/``BatchNorm3d`` (eps 1e-5,
momentum 0.1), and the running statistics a layer-parallel trainer keeps.

Per channel c, over the batch and every spatial position (kernels ``batchnorm_*``)::

    training ("train"):   μ_c = mean x,  σ²_c = mean (x − μ_c)²        (batch statistics, biased)
    evaluation ("eval"):  μ_c = running_mean_c,  σ²_c = running_var_c  (fixed data)
    r_c = 1/√(σ²_c + eps),  x̂ = (x − μ_c) r_c,  y = γ_c x̂ + β_c
    g = dy ⊙ γ
    dx = r (g − mean g − x̂ mean(g ⊙ x̂))   (training: μ, r depend on x)
    dx = r g                               (evaluation)
    dγ = Σ dy ⊙ x̂,  dβ = Σ dy

Running statistics, torch's rule with momentum m and n = B·|S| values per channel::

    running_mean ← (1 − m) running_mean + m μ
    running_var  ← (1 − m) running_var  + m σ² n/(n − 1)          (unbiased, as torch)

**The API for layer-parallel training.** Weights (``gamma``, ``beta``) are params as usual. A
layer in ``"train"`` mode computes batch statistics and never touches running ones; read them
from its forward cache with ``layer.batch_stats(cache)`` (a :class:`BatchStats`) and fold them
in with :func:`update_running_stats` — once per training step, from the caches of the final
fine forward sweep (TorchBraid's rule: never from coarse levels or intermediate MGRIT
iterations). A layer in ``"eval"`` mode (``layer.evaluation()``) takes ``running_mean`` and
``running_var`` from its params: they are listed in ``data_entries`` and ``constant_entries``
(data, held fixed: no gradient is returned for them, no optimiser may step them).

Shape legend: B batch, C channels, S… the 2 (H, W) or 3 (D, H, W) spatial axes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from .init import check_adjoint, check_dtype, check_positive_int
from .layernorm import check_eps
from .spatial import Resizable, check_spatial

EPS = 1e-5  # torch.nn.BatchNorm2d's default
MOMENTUM = 0.1  # torch.nn.BatchNorm2d's default
MODES = ("train", "eval")
RUNNING = ("running_mean", "running_var")  # the eval-mode data entries


class BatchStats(NamedTuple):
    """One forward's batch statistics per channel: mean, biased variance, values per channel."""

    mean: np.ndarray  # C
    var: np.ndarray  # C
    count: int


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    return mode


def init_running_stats(channels: int, dtype=np.float64) -> dict[str, np.ndarray]:
    """running_mean = 0, running_var = 1, as torch initialises them."""
    return {"running_mean": np.zeros(channels, dtype), "running_var": np.ones(channels, dtype)}


def update_running_stats(running: dict, batch: BatchStats,
                         momentum: float = MOMENTUM) -> dict[str, np.ndarray]:
    """New running statistics ``(1 − m)·old + m·batch`` (variance made unbiased by n/(n − 1));
    ``running`` holds ``running_mean`` and ``running_var``; returns fresh arrays."""
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) \
            or not 0.0 <= momentum <= 1.0:
        raise ValueError(f"`momentum` must be a number in [0, 1], got {momentum!r}.")
    missing = [k for k in RUNNING if k not in running]
    if missing:
        raise ValueError(f"`running` must hold {RUNNING}, it lacks {missing}.")
    n = batch.count
    unbiased = batch.var * (n / (n - 1)) if n > 1 else batch.var
    return {"running_mean": (1.0 - momentum) * running["running_mean"] + momentum * batch.mean,
            "running_var": (1.0 - momentum) * running["running_var"] + momentum * unbiased}


def bn_forward(bk, params, x, mode: str, eps: float):
    """y = γ x̂ + β with batch (train) or running (eval) statistics; cache = (x, μ, r)."""
    if mode == "train":
        mean, rstd = bk.batchnorm_stats(x, eps)  # C, C
    else:
        mean = params["running_mean"]
        rstd = 1.0 / bk.xp.sqrt(params["running_var"] + eps)
    return bk.batchnorm_apply(x, mean, rstd, params["gamma"], params["beta"]), (x, mean, rstd)


def bn_adjoint(bk, params, cache, dy, mode: str):
    """(dx, dγ, dβ) of :func:`bn_forward`."""
    x, mean, rstd = cache
    return bk.batchnorm_adjoint(x, mean, rstd, params["gamma"], dy, mode == "train")


def bn_batch_stats(bk, cache) -> BatchStats:
    """The batch statistics of a training-mode forward, on the host: μ, σ² = mean (x − μ)²."""
    x, mean, _ = cache
    xh, mh = bk.to_numpy(x), bk.to_numpy(mean)
    axes = (0, *range(2, xh.ndim))
    xc = xh - mh.reshape((1, -1) + (1,) * (xh.ndim - 2))
    return BatchStats(mh.copy(), np.mean(xc * xc, axis=axes), xh.size // xh.shape[1])


class NormalisedLayer:
    """What the batch-norm layers share: the mode, its data entries and switching modes."""

    mode: str

    @property
    def data_entries(self) -> tuple[str, ...]:
        return RUNNING if self.mode == "eval" else ()

    @property
    def constant_entries(self) -> tuple[str, ...]:
        """Params entries held fixed: no gradient (refbraid.verify checks the others)."""
        return self.data_entries

    def evaluation(self):
        """The same layer in evaluation mode (running statistics from params)."""
        return replace(self, mode="eval")

    def training(self):
        """The same layer in training mode (batch statistics)."""
        return replace(self, mode="train")

    def batch_stats(self, cache, bk) -> BatchStats:
        """The batch statistics a training-mode forward used (see the module docstring)."""
        if self.mode != "train":
            raise ValueError("`batch_stats` needs a layer in mode 'train'; an 'eval' layer "
                             "uses its running statistics.")
        return bn_batch_stats(bk, self._bn_cache(cache))

    def _bn_cache(self, cache):
        return cache


@dataclass(frozen=True)
class BatchNorm(NormalisedLayer, Resizable):
    """Standalone transition ``y = BN(x)`` on (C, S…) images (2 or 3 spatial axes)."""

    channels: int
    spatial: tuple[int, ...]
    mode: str = "train"
    eps: float = EPS

    def __post_init__(self):
        check_positive_int("channels", self.channels)
        object.__setattr__(self, "spatial", check_spatial("spatial", self.spatial))
        check_mode(self.mode)
        check_eps(self.eps)

    @property
    def in_shape(self) -> tuple[int, ...]:
        return (self.channels, *self.spatial)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.in_shape

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        """γ = 1, β = 0 (and running statistics 0, 1 in eval mode), as torch (rng unused)."""
        params = {"gamma": np.ones(self.channels, dtype), "beta": np.zeros(self.channels, dtype)}
        if self.mode == "eval":
            params.update(init_running_stats(self.channels, dtype))
        return params

    def forward(self, params, x, bk):
        if tuple(x.shape[1:]) != self.in_shape:
            raise ValueError(f"`x` must have shape (batch, {', '.join(map(str, self.in_shape))}),"
                             f" got {tuple(x.shape)}.")
        check_dtype("x", x, params)
        return bn_forward(bk, params, x, self.mode, self.eps)

    def adjoint(self, params, cache, dout, bk, grads: bool = True):
        check_adjoint("dout", dout, cache[0].shape)
        dx, dgamma, dbeta = bn_adjoint(bk, params, cache, dout, self.mode)
        return dx, ({"gamma": dgamma, "beta": dbeta} if grads else None)
