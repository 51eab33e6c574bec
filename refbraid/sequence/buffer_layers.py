"""Buffer layers: a few ordinary (serial) steps between the embedding and the layer-parallel
block, and between that block and the head (the device arXiv 2601.09026 uses for
decoder-only models; here in the form described below).

With ``b`` buffer steps at each end of a model of N steps (all of size h = T/N)::

    X[0] = embedding(tok)
    X[n+1] = X[n] + h F(θ_n, X[n])      n = 0..b−1           serial, exact  (opening)
    X[n+1] = X[n] + h F(θ_n, X[n])      n = b..N−b−1         MGRIT block    (steps)
    X[n+1] = X[n] + h F(θ_n, X[n])      n = N−b..N−1         serial, exact  (closing)
    logits = head(X[N])

It is the same network as without buffers: sequential backprop gives the same loss and
gradient; only the layer-parallel solve changes, which now covers the N − 2b middle steps,
starts from the exact X[b] and hands its adjoint to exact buffer adjoints. The adjoint of a
buffer side is the step adjoint run backwards over its b steps::

    λ[n] = Φ_n'(X[n])ᵀ λ[n+1],   ∂L/∂θ_n = (∂Φ_n/∂θ_n)ᵀ λ[n+1]

:class:`BufferedOpening` (opening, then b steps) and :class:`BufferedClosing` (b steps, then
the head) are ordinary opening and closing layers, so every Network solver applies unchanged.
Their parameters are the inner layer's (unprefixed, so a tied embedding keeps its name) and
the stacked ``buffer.*`` (b, ...) of the steps.

Shape legend: B batch, L tokens, E width, b buffer steps per side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..network import layer_params

PREFIX = "buffer."


def _split(params: dict) -> tuple[dict, dict]:
    """(the inner layer's params, the stacked buffer steps' params without the prefix)."""
    inner = {k: v for k, v in params.items() if not k.startswith(PREFIX)}
    steps = {k[len(PREFIX):]: v for k, v in params.items() if k.startswith(PREFIX)}
    return inner, steps


def _init_steps(step, count: int, rng, dtype) -> dict[str, np.ndarray]:
    per_layer = [step.init(rng, dtype) for _ in range(count)]
    return {PREFIX + k: np.stack([p[k] for p in per_layer]) for k in per_layer[0]}


def _run_steps(step, steps: dict, X, h: float, bk):
    caches = []
    for i in range(next(iter(steps.values())).shape[0]):
        X, cache = step.forward(layer_params(steps, i), X, h, bk)
        caches.append(cache)
    return X, caches


def _adjoint_steps(step, steps: dict, caches, lam, h: float, bk):
    dsteps = {k: bk.xp.zeros_like(v) for k, v in steps.items()}
    for i in reversed(range(len(caches))):
        lam, dtheta = step.adjoint(layer_params(steps, i), caches[i], lam, h, bk)
        for k, v in dtheta.items():
            dsteps[k][i] = v
    return lam, {PREFIX + k: v for k, v in dsteps.items()}


@dataclass(frozen=True)
class BufferedOpening:
    """The opening ``inner`` followed by ``count`` serial steps of size ``h``."""

    inner: Any
    step: Any
    count: int
    h: float

    discrete_input: ClassVar[bool] = True  # a token opening: no input adjoint

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.inner.in_shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.step.state_shape

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return {**self.inner.init(rng, dtype), **_init_steps(self.step, self.count, rng, dtype)}

    def forward(self, params, x, bk):
        """X[b] from the tokens: the inner opening, then b steps; cache both."""
        inner, steps = _split(params)
        X, c_inner = self.inner.forward(inner, x, bk)
        X, caches = _run_steps(self.step, steps, X, self.h, bk)
        return X, (c_inner, caches)

    def adjoint(self, params, cache, dout, bk):
        """λ[0] by the b step adjoints, then the inner opening's adjoint."""
        inner, steps = _split(params)
        c_inner, caches = cache
        lam, dsteps = _adjoint_steps(self.step, steps, caches, dout, self.h, bk)
        dx, dinner = self.inner.adjoint(inner, c_inner, lam, bk)
        return dx, {**dinner, **dsteps}


@dataclass(frozen=True)
class BufferedClosing:
    """``count`` serial steps of size ``h`` followed by the closing ``inner`` (the head)."""

    inner: Any
    step: Any
    count: int
    h: float

    @property
    def in_shape(self) -> tuple[int, ...]:
        return self.step.state_shape

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.inner.out_shape

    def init(self, rng: np.random.Generator, dtype=np.float64) -> dict[str, np.ndarray]:
        return {**_init_steps(self.step, self.count, rng, dtype), **self.inner.init(rng, dtype)}

    def forward(self, params, x, bk):
        """The head of X[N] after b more steps from X[N − b]."""
        inner, steps = _split(params)
        X, caches = _run_steps(self.step, steps, x, self.h, bk)
        out, c_inner = self.inner.forward(inner, X, bk)
        return out, (caches, c_inner)

    def adjoint(self, params, cache, dout, bk):
        inner, steps = _split(params)
        caches, c_inner = cache
        lam, dinner = self.inner.adjoint(inner, c_inner, dout, bk)
        lam, dsteps = _adjoint_steps(self.step, steps, caches, lam, self.h, bk)
        return lam, {**dinner, **dsteps}
