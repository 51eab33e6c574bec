"""Checks of the ``refbraid train`` flags that shape training in depth and the staged conv
model: ``--batch-norm``, ``--transition`` (conv-stages), ``--nested-init``, ``--mgopt-levels``
(each error names its flag)."""

from __future__ import annotations


def check_depth_options(config, choice, positive_int) -> None:
    """All checks of this module, in flag order (called by ``TrainConfig.__post_init__``),
    with config.py's field checks ``choice(name, value, choices)`` and ``positive_int(config,
    name, allow_zero)`` (passed in: config.py imports this module, not the reverse)."""
    check_stage_options(config, choice)
    check_nested(config, choice, positive_int)
    check_mgopt(config, positive_int)


def check_stage_options(config, choice) -> None:
    """``--batch-norm`` and ``--transition`` shape the conv-stages model only."""
    choice("transition", config.transition, ("pool", "strided"))
    if config.model != "conv-stages" and (config.batch_norm or config.transition != "pool"):
        flag = "--batch-norm" if config.batch_norm else "--transition"
        raise ValueError(f"`{flag}` applies to `--model conv-stages` only, got "
                         f"`--model {config.model}`.")


DEPTH_MODELS = ("resnet", "conv", "conv-stages")  # nested init and MG/Opt


def _check_depth_divides(config, flag: str, halvings: int) -> None:
    """N divisible by 2^halvings (conv-stages: each of its two stages, so 2^(halvings+1))."""
    stages = 2 if config.model == "conv-stages" else 1
    need = stages * 2**halvings
    if config.layers % need:
        per = " (two stages, each halved)" if stages == 2 else ""
        raise ValueError(f"`{flag}` halves `--layers {config.layers}` {halvings} times{per}: "
                         f"the layers must be divisible by {need}.")


def check_nested(config, choice, positive_int) -> None:
    """``--nested-init K``: resnet/conv/conv-stages, N divisible by 2^K, no resume."""
    positive_int(config, "nested_init", allow_zero=True)
    positive_int(config, "nested_epochs")
    choice("nested_interp", config.nested_interp, ("constant", "linear"))
    if not config.nested_init:
        return
    if config.model not in DEPTH_MODELS:
        raise ValueError(f"`--nested-init` needs `--model resnet`, `conv` or `conv-stages`, "
                         f"got `--model {config.model}`.")
    _check_depth_divides(config, f"--nested-init {config.nested_init}", config.nested_init)
    if config.resume:
        raise ValueError("`--nested-init` starts a run from nested training; it cannot "
                         "be combined with `--resume`.")


def check_mgopt(config, positive_int) -> None:
    """``--mgopt-levels L``: resnet/conv/conv-stages, N divisible by 2^(L-1), SGD without
    momentum."""
    positive_int(config, "mgopt_levels", allow_zero=True)
    if not config.mgopt_levels:
        return
    if config.mgopt_levels < 2:
        raise ValueError(f"`--mgopt-levels` must be 0 (off) or at least 2, got "
                         f"{config.mgopt_levels}.")
    if config.model not in DEPTH_MODELS:
        raise ValueError(f"`--mgopt-levels` needs `--model resnet`, `conv` or `conv-stages`, "
                         f"got `--model {config.model}`.")
    _check_depth_divides(config, f"--mgopt-levels {config.mgopt_levels}",
                         config.mgopt_levels - 1)
    if config.optimizer != "sgd" or config.momentum != 0:
        raise ValueError("`--mgopt-levels` steps the weights with MG/Opt's own gradient "
                         "descent (step --lr): use `--optimizer sgd --momentum 0`.")
