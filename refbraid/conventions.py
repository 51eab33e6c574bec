"""Iteration counts and the final FC relaxation: refbraid's convention, and TorchBraid's.

refbraid (``refbraid train``, ``scale``, ``compare`` and the Python API's
:class:`~refbraid.mgrit.MGRITSettings`) counts the MGRIT cycles *after* the skipped first
down-cycle (``max_iter``; the default training gradient: 1 forward, 0 adjoint cycles) and ends
no solve with a final FC relaxation (``final_fc_relax=False``). TorchBraid and XBraid count the
skipped cycle as iteration 1 (``setFwdMaxIters(2)``, ``setBwdMaxIters(1)``: the same solves)
and TorchBraid's adjoint always ends with a final FC relaxation. ``--torchbraid-conventions``
switches a command's flags to TorchBraid's counting (``compare`` also to its final FC
relaxation); in Python, :class:`refbraid.interop.xbraid.TorchBraidSettings` speaks TorchBraid's
terms and maps them to refbraid's (docs/xbraid_mapping.md)::

    TorchBraid max_iters = k  ↔  refbraid max_iter = k − 1   (with the skipped down-cycle)
                              ↔  refbraid max_iter = k       (without it)
"""

from __future__ import annotations

import argparse

CONVENTIONS_FLAG = "--torchbraid-conventions"


def add_conventions_flag(group, more: str = "") -> None:
    """The one switch from refbraid's counting to TorchBraid's (``train``, ``scale``,
    ``compare``): ``args.torchbraid_conventions``."""
    group.add_argument(
        CONVENTIONS_FLAG, dest="torchbraid_conventions", action="store_true",
        help="count --fwd-iters/--bwd-iters as TorchBraid/XBraid do: the skipped first "
        "down-cycle is iteration 1, so TorchBraid's 2 forward / 1 backward iterations are "
        "refbraid's default 1 / 0 cycles" + more)


def cycles_after_skip(flag: str, k: int | None, skip: bool, torchbraid: bool) -> int | None:
    """refbraid's count of a ``--fwd-iters``/``--bwd-iters`` value: MGRIT cycles after the
    skipped first down-cycle (all cycles without the skip). With ``torchbraid`` the value is
    XBraid's ``max_iters``, which counts the skipped cycle: ``k − 1`` with the skip."""
    if k is None or not torchbraid or not skip:
        return k
    if k < 1:
        raise ValueError(f"`{flag}` must be >= 1 with {CONVENTIONS_FLAG} (the skipped first "
                         f"down-cycle is iteration 1), got {k}.")
    return k - 1


def refbraid_counts(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``fwd_iters``/``bwd_iters`` in refbraid's counting (a copy when
    ``--torchbraid-conventions`` changed them)."""
    if not getattr(args, "torchbraid_conventions", False):
        return args
    skip = getattr(args, "skip_down", True)
    return argparse.Namespace(**{**vars(args), **{
        name: cycles_after_skip(f"--{name.replace('_', '-')}", getattr(args, name), skip, True)
        for name in ("fwd_iters", "bwd_iters")}})
