"""The sequence models whose parameters are not one block's, over MPI: the tied GPT and the
two encoder–decoders. Same mathematics as in one process
(:mod:`refbraid.sequence.gpt_model`, :mod:`refbraid.sequence.seq2seq_model`); the blocks
are distributed by :class:`~refbraid.distributed.network.DistributedGradient` (layer rank q
owns the layers of its block; data-parallel groups take batch shards), and what ties the
blocks together travels through the adjoint-tested operators of :mod:`refbraid.parallel.ops`.

Tied GPT (:class:`TiedGPTGradient`). One matrix W_emb is the embedding (opening, layer rank 0)
and the LM head's weight (closing, last layer rank). Layer rank 0 owns it (its shard and its
optimizer state); the last rank fetches a ghost copy every step, as ghost weights travel
(:class:`~refbraid.parallel.ops.RowExchange`, one row: the matrix)::

    forward   W_head = G W_emb                   (G: fetch row "W_emb" from rank 0 to the last)
    adjoint   ∂L/∂W_emb = ∂L/∂W_emb|opening + Gᵀ ∂L/∂W_head        (the head's part sent home)

Only the last rank holds a head part, so the sum is ``dW_opening + dW_head``, the
single-process fold, bit for bit.

Encoder–decoder (:class:`Seq2SeqGradient`), both blocks of N layers split the same way::

    encoder forward solve → M = X[N] on the last rank
    M broadcast to every layer rank (each decoder step reads it: ``steps.memory`` rows)
    decoder forward solve → logits, loss → decoder adjoint solve
    ∂L/∂M = Σ_n (∂Φ'_n/∂M)ᵀ λ_Z[n+1]: the N rows gathered to the last rank and summed as
            one process sums them (``sum(axis=0)``)  — the adjoint of the broadcast
    encoder adjoint solve from λ_X[N] = ∂L/∂M

The decoder runs inside the encoder's loss hook (``dloss``, collective over the layer ranks),
so the encoder's forward solve is done once (one process repeats it: same numbers). Evaluation
and autoregressive decoding run on world rank 0 with the gathered parameters
(``logits``: the model's own MGRIT forward, token by token), as the trainer evaluates every
model under MPI.

Results equal one process: bit-identical with pure layer parallelism, to round-off with data
parallelism (tests/mpi/test_sequence_chained_mpi.py).

Shape legend: N layers per block, Q layer ranks, B_g the group's batch shard, S memory tokens,
E width, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..backends import Backend
from ..layer_parallel import LayerParallelSettings
from ..network import Params
from ..parallel.ops import Broadcast, RowExchange
from .engine import WorldHooks, gather_shards, replicated_rows, steps_key
from .network import DistributedGradient
from .ownership import Rows

TIE_KEY, HEAD_KEY = "opening.W", "closing.W"
BLOCKS = ("encoder", "decoder")


# ----------------------------------------------------------------------------- tied GPT
class TiedGPTGradient(DistributedGradient):
    """The GPT's block over MPI with the head tied to the embedding (module docstring)."""

    def __init__(self, model, topology, settings: LayerParallelSettings | None = None,
                 bk: Backend | str = "numpy"):
        super().__init__(model.net, topology, settings, bk)
        self.model = model
        q, last = topology.layer.rank, topology.layer.size - 1  # one row, index 0: W_emb
        self.tie = RowExchange(topology.layer, [0] if q == 0 else [], [0] if q == last else [])

    def logits(self, params: Params, x):
        """The model's MGRIT forward on full params (the trainer evaluates on rank 0)."""
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk)

    def __call__(self, params: Params, x, labels):
        """Replicated mode: the head reads ``opening.W``; its gradient is folded in."""
        loss, grads, stats = super().__call__({**params, HEAD_KEY: params[TIE_KEY]}, x, labels)
        grads[TIE_KEY] = grads[TIE_KEY] + grads.pop(HEAD_KEY)
        return loss, grads, stats

    def sharded(self, shard: Params, x, labels):
        """Sharded mode: W_emb fetched from layer rank 0, the head's gradient sent home."""
        ghost = self.tie.forward({0: shard[TIE_KEY]} if self.q == 0 else {})
        with_head = {**shard, HEAD_KEY: ghost[0]} if self.q == self.last else shard
        loss, grads, stats = super().sharded(with_head, x, labels)
        home = self.tie.adjoint({0: grads.pop(HEAD_KEY)} if self.q == self.last else {})
        if self.q == 0:
            grads[TIE_KEY] = grads[TIE_KEY] + home[0]
        return loss, grads, stats


# ----------------------------------------------------------------------------- keys
def _split_key(key: str) -> tuple[str, str]:
    """``[buf/]block.rest`` → (block, ``[buf/]rest``); optimizer state keys keep ``buf/``."""
    buf, slash, name = key.rpartition("/")
    block, _, rest = name.partition(".")
    return block, buf + slash + rest


def _block(d: dict, block: str) -> dict:
    """The entries of one block, without its prefix."""
    out = {}
    for k, v in d.items():
        b, rest = _split_key(k)
        if b == block:
            out[rest] = v
    return out


def _prefixed(d: dict, block: str) -> dict:
    """The inverse of :func:`_block`."""
    out = {}
    for k, v in d.items():
        buf, slash, name = k.rpartition("/")
        out[f"{buf}{slash}{block}.{name}"] = v
    return out


def _is_rows(key: str) -> bool:
    return steps_key(_split_key(key)[1])


def _combined_stats(enc: dict[str, float], dec: dict[str, float]) -> dict[str, float]:
    """Both blocks' stats as Seq2SeqInfo.stats: worst residuals, summed counts."""
    return {k: max(enc[k], dec[k]) if k.endswith("_res") else enc[k] + dec[k] for k in enc}


# ----------------------------------------------------------------------------- encoder–decoder
class Seq2SeqGradient(WorldHooks):
    """An encoder–decoder's gradient over MPI (module docstring); the interface of
    :class:`DistributedGradient` (``__call__``, ``sharded``, ``shard``, ``gather``,
    ``logits``, ``world``, ``is_root``), so :class:`~refbraid.distributed.sharded.ShardedGradient`
    drives it. Construction is collective."""

    __name__ = "layer-parallel-mpi"

    def __init__(self, model, topology, settings: LayerParallelSettings | None = None,
                 bk: Backend | str = "numpy"):
        self.model = model
        self.enc = DistributedGradient(model.encoder, topology, settings, bk)
        self.dec = DistributedGradient(model.decoder, topology, settings, bk)
        self.topo, self.world = topology, topology.world
        self.settings, self.bk = self.enc.settings, self.enc.bk
        self.last = topology.layer.size - 1
        self.memory_bcast = Broadcast(topology.layer, root=self.last)
        self.last_solves: dict[str, Any] = {}

    def logits(self, params: Params, x):
        """The model's MGRIT forward on full params, decoding token by token when
        autoregressive: evaluation runs on world rank 0 with the gathered parameters."""
        return self.model.mgrit_logits(params, x, self.settings.forward, self.bk)

    # -- parameters ---------------------------------------------------------------------
    def shard(self, params: Params) -> Params:
        """This rank's part of both blocks (keys ``[buffer/]encoder.*``, ``…decoder.*``)."""
        out = {}
        for name, g in zip(BLOCKS, (self.enc, self.dec), strict=True):
            out.update(_prefixed(g.shard(_block(params, name)), name))
        return out

    def gather(self, shard: dict[str, Any], root: int = 0) -> dict[str, Any] | None:
        """Full arrays on world rank ``root`` from group 0's shards; ``steps.*`` rows stacked
        in layer order. Collective over the world."""
        return gather_shards(self.topo, shard, root, _is_rows)

    # -- the gradient -------------------------------------------------------------------
    def __call__(self, params: Params, x, labels):
        """Replicated mode: full params in, the full gradient on every rank out."""
        blocks = [_block(params, name) for name in BLOCKS]
        rows = [replicated_rows(g.plan, g.q, p)
                for g, p in zip((self.enc, self.dec), blocks, strict=True)]
        loss, (enc_part, dec_part), stats = self._gradient(rows, blocks, x, labels)
        part = {**_prefixed(enc_part, "encoder"), **_prefixed(dec_part, "decoder")}
        return loss, self.enc.assemble(part, params), stats

    def sharded(self, shard: Params, x, labels):
        """Sharded mode: ghosts fetched per block, rows sent home, groups summed."""
        blocks = [_block(shard, name) for name in BLOCKS]
        gs = (self.enc, self.dec)
        rows = [g.shard_rows(s) for g, s in zip(gs, blocks, strict=True)]
        loss, parts, stats = self._gradient(rows, blocks, x, labels)
        grads = {}
        for name, g, part, s in zip(BLOCKS, gs, parts, blocks, strict=True):
            grads.update(_prefixed(g.rows_home(part, s), name))
        return loss, self.enc.sum_groups(grads), stats

    def _gradient(self, rows, blocks, x, labels):
        """Encoder solve; inside its loss hook the decoder (forward, loss, adjoint) and the
        memory's adjoint; then the encoder's adjoint solve. Returns (loss, parts, stats)."""
        (enc_rows, dec_rows), (enc_p, dec_p) = rows, blocks
        dec_in = self.model.decoder_input(x, labels, self.bk)
        N, decoded = self.model.layers, {}

        def seed(memory, ys, weight):  # collective over the layer ranks
            memory = self.memory_bcast.forward(memory)  # M on every layer rank   # B_g,S,E
            held = next(iter(dec_rows.values())) if dec_rows else ()
            mem_rows = {**dec_rows, "memory": Rows("steps.memory", self.enc.q,
                                                   {int(n): memory for n in held})}
            params = {**dec_p, "steps.memory": np.broadcast_to(memory, (N, *memory.shape))}
            loss, part, stats = self.dec._gradient(mem_rows, params, dec_in, labels)
            dmemory = self._memory_adjoint(part.pop("steps.memory"))
            decoded.update(loss=loss, part=part, stats=stats)
            return 0.0, dmemory

        _, enc_part, enc_stats = self.enc._gradient(enc_rows, enc_p, x, labels, dloss=seed)
        self.last_solves = {"encoder": self.enc.last_solves, "decoder": self.dec.last_solves}
        stats = _combined_stats(enc_stats, decoded["stats"])
        return decoded["loss"], (enc_part, decoded["part"]), stats

    def _memory_adjoint(self, dmemory):
        """∂L/∂M = Σ_n ∂L/∂M_n on the last layer rank (None elsewhere): the rows of every
        rank gathered there and summed as one process sums them."""
        xp = self.bk.xp
        if not isinstance(dmemory, dict):  # one layer rank, sequential: all N rows here
            return xp.sum(dmemory, axis=0)
        parts = self.topo.layer.gather(dict(dmemory), root=self.last)
        if parts is None:
            return None
        rows = {a: r for p in parts for a, r in p.items()}
        if sorted(rows) != list(range(self.model.layers)):
            raise RuntimeError(f"memory adjoint rows {sorted(rows)} are not the "
                               f"{self.model.layers} layers (the BlockPlan missed some).")
        # stacked as one process stacks them: zeros_like of the broadcast memory (numpy puts
        # the stride-0 layer axis innermost), so that the sum runs in the same order
        stacked = xp.zeros_like(xp.broadcast_to(rows[0], (len(rows), *rows[0].shape)))
        for a, row in rows.items():
            stacked[a] = row
        return xp.sum(stacked, axis=0)
