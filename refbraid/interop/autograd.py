"""The independent answer: loss and gradient of a PyTorch ODE-net by torch autograd (float64).

::

    y = σ(opening(x));   y ← y + h·step_n(y), n = 0..N−1;   L = mean cross-entropy(closing(y))

run on a float64 copy of the user's own modules, so nothing of refbraid is involved; the
gradient comes back keyed by state-dict key. PyTorch is imported here, lazily, by the caller.
"""

from __future__ import annotations

import copy

import numpy as np

from .convert import as_array


def torch_loss_and_gradient(model, x, labels, T: float | None = None, opening=None,
                            steps=None, closing=None) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, {state-dict key: ∂L/∂weight}) by autograd in float64 on a copy of ``model``."""
    import torch

    model = copy.deepcopy(model).double()
    opening = model.opening if opening is None else opening
    steps = list(model.steps if steps is None else steps)
    closing = model.closing if closing is None else closing
    T = float(model.T if T is None else T)
    h = T / len(steps)
    model.zero_grad(set_to_none=True)
    xt = torch.from_numpy(np.asarray(x, dtype=np.float64))
    y = opening(xt)
    for step in steps:
        y = y + h * step(y)
    loss = torch.nn.functional.cross_entropy(closing(y), torch.from_numpy(
        np.asarray(labels, dtype=np.int64)))
    loss.backward()
    grads = {name: as_array(p.grad) if p.grad is not None else np.zeros(tuple(p.shape))
             for name, p in model.named_parameters()}
    return float(loss.detach()), grads
