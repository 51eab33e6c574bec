"""Sequence models trained layer-parallel: a GRU with MGRIT over the sequence positions, and
transformers whose layers are the MGRIT time steps (encoder-only, encoder–decoder and
decoder-only causal language models).

====================  ================================================================
module                job
====================  ================================================================
losses.py             cross-entropy per sequence (B, K) or per token (B, T, K)
gru_model.py          GRUModel: BPTT and the MGRIT-over-the-sequence gradient
token_layers.py       token openings (embedding, learned queries) and the memory closing
block_gradient.py     one block's gradient under any loss: backprop, or MGRIT solves
transformer_model.py  TransformerModel (classifier / token tagger); the model factory
seq2seq_model.py      Seq2SeqModel: encoder → memory → decoder, block by block
gpt_model.py          GPTModel: decoder-only causal language model (tied or untied head)
generate.py           greedy / temperature generation, exact match, perplexity
model_base.py         LayeredModel: the Network-like description all transformers share
study.py              gradient error vs MGRIT cycles against the sequential gradient
====================  ================================================================

Every model offers the same duck type the trainer uses: ``init_params(rng, dtype)``,
``logits(params, x, bk)`` (sequential forward), ``backprop(params, x, labels, bk)``,
``mgrit_logits(params, x, settings, bk)``, ``layer_parallel_gradient(params, x, labels,
settings, bk)``, and ``opening.in_shape``, ``step``, ``n_layers``, ``T``, ``h``.
"""

from .generate import exact_match, generate, perplexity
from .gpt_model import GPTModel
from .gru_model import GRUModel, gru_model
from .losses import cross_entropy
from .seq2seq_model import Seq2SeqModel
from .study import sequence_gradient_error_study
from .transformer_model import TransformerModel, transformer_model

__all__ = [
    "GPTModel",
    "GRUModel",
    "Seq2SeqModel",
    "TransformerModel",
    "cross_entropy",
    "exact_match",
    "generate",
    "perplexity",
    "gru_model",
    "sequence_gradient_error_study",
    "transformer_model",
]
