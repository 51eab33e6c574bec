"""What every transformer model shares: the Network-like description the trainer reads.

A transformer model is one or more blocks, each a :class:`~refbraid.network.Network` of
``layers`` steps over ``[0, T]`` (``h = T / layers``). The trainer reads ``opening`` (the
input layer of the first block: its ``in_shape`` shapes the batches), ``step`` (the step of the
last block: its ``state_shape`` goes into the log), ``n_layers``, ``T`` and ``h``.
"""

from __future__ import annotations

from ..layers.init import check_positive_int
from ..network import Network

#: the size fields every transformer model checks on construction
SIZE_FIELDS = ("vocab_size", "seq_len", "layers", "dim", "heads", "hidden")


class LayeredModel:
    """Mixin for frozen model dataclasses with ``layers``, ``T`` and first/last blocks."""

    layers: int
    T: float

    @property
    def first_block(self) -> Network:  # pragma: no cover - every model overrides it
        raise NotImplementedError

    @property
    def last_block(self) -> Network:  # pragma: no cover - every model overrides it
        raise NotImplementedError

    def check_sizes(self, names=SIZE_FIELDS) -> None:
        """Raise unless each field in ``names`` is a positive integer."""
        for name in names:
            check_positive_int(name, getattr(self, name))

    @property
    def opening(self):
        return self.first_block.opening

    @property
    def step(self):
        return self.last_block.step

    @property
    def n_layers(self) -> int:
        """Layers per block (each block is one MGRIT problem of this many steps)."""
        return self.layers

    @property
    def h(self) -> float:
        return self.T / self.layers
