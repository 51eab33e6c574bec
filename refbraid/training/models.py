"""Network builders: a model name and a data set's shape → a :class:`refbraid.network.Network`.

=======  =====================================================================  ==============
model    layers                                                                  data
=======  =====================================================================  ==============
resnet   DenseLift(K→C) → N × DenseStep(C): y += h σ(W y + b) → Classifier        any (flattened)
conv     ConvLift(C_in→C) → N × ConvStep(C, 3×3) → Classifier                     images (C,H,W)
=======  =====================================================================  ==============

``h = T/N`` for N = ``layers`` steps. A model is a builder function registered in
:data:`MODELS`; later models (transformer, GRU) add an entry there.

Shape legend: K = prod(data_shape) input features, C = ``width`` (channels), H, W image size.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import numpy as np

from ..layers import Classifier, ConvLift, ConvStep, DenseLift, DenseStep
from ..network import Network


def _resnet(data_shape, n_classes, layers, width, T, activation) -> Network:
    K = prod(data_shape)
    return Network(
        opening=DenseLift(K, width, activation),
        step=DenseStep(width, activation),
        closing=Classifier((width,), n_classes),
        n_layers=layers,
        T=T,
    )


def _conv(data_shape, n_classes, layers, width, T, activation) -> Network:
    if len(data_shape) == 2:  # (H, W) grey-scale images
        data_shape = (1, *data_shape)
    if len(data_shape) != 3:
        raise ValueError(
            f"model 'conv' needs image data of shape (channels, height, width); the data has "
            f"samples of shape {tuple(data_shape)}. Use model 'resnet' for vector data."
        )
    c_in, H, W = data_shape
    return Network(
        opening=ConvLift(c_in, width, H, W, activation),
        step=ConvStep(width, H, W, activation),
        closing=Classifier((width, H, W), n_classes),
        n_layers=layers,
        T=T,
    )


#: Model name → builder(data_shape, n_classes, layers, width, T, activation) -> Network.
MODELS: dict[str, Callable[..., Network]] = {"resnet": _resnet, "conv": _conv}


def build_network(model: str, data_shape: tuple[int, ...], n_classes: int, layers: int,
                  width: int, T: float, activation: str = "tanh") -> Network:
    """The network ``model`` for samples of shape ``data_shape`` and ``n_classes`` classes."""
    if model not in MODELS:
        raise ValueError(f"`model` must be one of {tuple(MODELS)}, got {model!r}.")
    data_shape = tuple(data_shape)
    if not data_shape or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1
                             for s in data_shape):
        raise ValueError(f"`data_shape` must be a tuple of positive sizes, got {data_shape!r}.")
    return MODELS[model](tuple(int(s) for s in data_shape), n_classes, layers, width, T,
                         activation)


def as_network_input(net: Network, x: np.ndarray) -> np.ndarray:
    """Reshape samples (n, *data_shape) to the network's input (n, *opening.in_shape).

    A view (no copy) for contiguous data; e.g. (n, 1, 8, 8) images → (n, 64) for 'resnet'.
    """
    shape = tuple(net.opening.in_shape)
    if prod(x.shape[1:]) != prod(shape):
        raise ValueError(f"`x` samples of shape {tuple(x.shape[1:])} do not fit the network "
                         f"input {shape}.")
    return x.reshape((x.shape[0], *shape))
