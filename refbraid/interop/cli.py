"""``refbraid compare``: the exact gradient, the layer-parallel gradient and residual histories
your layer-parallel code should produce, and how far your numbers are from them.

Inputs: a network (a PyTorch file — a pickled ODE-net module, or a ``state_dict`` with
``--spec`` — or a refbraid checkpoint ``.npz``), a batch (``.npz`` with ``x`` and ``labels``)
and MGRIT settings in TorchBraid/XBraid terms (``--settings`` TOML/JSON, flags override).
Outputs in ``--out``: ``compare.json`` (the report), ``gradients.npz`` (``exact/<key>`` and
``layer_parallel/<key>`` under the model's state-dict keys), ``compare.png``.
Exit codes: 0 (PASS, or nothing of theirs to check), 4 (FAIL), 2 (bad input).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from .. import checked_files
from ..atomic import atomic_write, save_figure
from ..conventions import CONVENTIONS_FLAG, add_conventions_flag
from .compare import Tolerances, compare, summary
from .convert import Converted, from_state_dict, from_torch, params_from_keyed, to_state_dict
from .plots import plot_comparison
from .xbraid import TorchBraidSettings

EXIT_MISMATCH = 4  # their gradient or residuals differ from refbraid's beyond the tolerances
_FLAG_SETTINGS = ("max_levels", "cfactor", "fwd_nrelax", "bwd_nrelax", "skip_downcycle",
                  "fwd_finalrelax", "bwd_finalrelax", "abs_tol")
#: flag → (its argparse name, XBraid's setting); the flags count in the chosen convention
_ITER_FLAGS = {"--fwd-iters": ("fwd_iters", "fwd_max_iters"),
               "--bwd-iters": ("bwd_iters", "bwd_max_iters")}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``refbraid compare`` on an argparse sub-parser collection."""
    p = subparsers.add_parser(
        "compare", help="check a layer-parallel code's gradient and residuals against refbraid",
        description=__doc__.split("\n\n")[0].replace("``", "`"),
        epilog="Flags count as `refbraid train` does (--fwd-iters 1 --bwd-iters 0, no final FC "
               "relaxation: its defaults); --torchbraid-conventions counts as TorchBraid "
               "(--fwd-iters 2 --bwd-iters 1) and adds the adjoint's final FC relaxation. A "
               "--settings file names XBraid's setters (fwd_max_iters, bwd_finalrelax, ...), "
               "so its counts are XBraid's either way; what it leaves out takes the chosen "
               "convention's defaults. Mapping table: docs/xbraid_mapping.md.")
    p.add_argument("--model", required=True, help="PyTorch file (.pt/.pth) or refbraid "
                   "checkpoint (.npz)")
    p.add_argument("--spec", help="JSON/TOML spec of a plain state dict (docs/interop.md)")
    p.add_argument("--batch", required=True, help=".npz with `x` (B, ...) and `labels` (B,)")
    p.add_argument("--settings", help="TOML/JSON file of TorchBraid/XBraid settings")
    p.add_argument("--levels", dest="max_levels", type=int, metavar="L",
                   help="max levels (default 3)")
    p.add_argument("--cfactor", type=_ints, metavar="M", help="cfactor, or one per level: 4 or 4,2")
    p.add_argument("--fwd-iters", dest="fwd_iters", type=int, metavar="K",
                   help="forward MGRIT cycles after the skipped first down-cycle, as in "
                   "`refbraid train` (default 1; TorchBraid's count with "
                   "--torchbraid-conventions, default 2)")
    p.add_argument("--bwd-iters", dest="bwd_iters", type=int, metavar="K",
                   help="adjoint MGRIT cycles after the skipped first down-cycle (default 0; "
                   "TorchBraid's count with --torchbraid-conventions, default 1)")
    p.add_argument("--fwd-nrelax", type=_ints, metavar="NU",
                   help="nrelax per level (default 0,1: F fine, FCF coarse)")
    p.add_argument("--bwd-nrelax", type=_ints, metavar="NU", help="the same for the adjoint")
    p.add_argument("--no-skip-downcycle", dest="skip_downcycle", action="store_const",
                   const=False, help="do the first down-cycle (XBraid skip = 0)")
    p.add_argument("--fwd-final-relax", dest="fwd_finalrelax", action="store_const",
                   const=True, help="forward final FC relaxation (setFwdFinalFCRelax; off by "
                   "default in both conventions)")
    p.add_argument("--bwd-final-relax", dest="bwd_finalrelax", action="store_const",
                   const=True, help="final FC relaxation of the adjoint, as TorchBraid's "
                   "BackwardODENetApp always does (the default with --torchbraid-conventions)")
    p.add_argument("--no-bwd-final-relax", dest="bwd_finalrelax", action="store_const",
                   const=False, help="no final FC relaxation of the adjoint (refbraid's "
                   "default, as `refbraid train` trains)")
    add_conventions_flag(p, ", and do the adjoint's final FC relaxation as TorchBraid always "
                         "does: the settings of TorchBraid's examples")
    p.add_argument("--abs-tol", metavar="TOL", help="absolute tolerance, or `none` (default 1e-9)")
    p.add_argument("--their-gradient", metavar="NPZ",
                   help=".npz of their gradient, keyed by state-dict key (or refbraid name)")
    p.add_argument("--their-residuals", metavar="JSON",
                   help="JSON {\"forward\": [norms], \"backward\": [norms] or its last norm}, "
                   "XBraid's convention (as TorchBraid prints them)")
    p.add_argument("--grad-tol", type=float, default=Tolerances.gradient,
                   help=f"relative tolerance per parameter (default {Tolerances.gradient:g})")
    p.add_argument("--res-tol", type=float, default=Tolerances.residual,
                   help=f"relative tolerance per residual norm (default {Tolerances.residual:g})")
    p.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    p.set_defaults(func=run)
    return p


def _ints(text: str):
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got "
                                         f"{text!r}") from None
    return vals[0] if len(vals) == 1 else vals


def read_mapping(path: str, what: str) -> dict:
    """A TOML or JSON file as a dict (by suffix; JSON otherwise), checked
    (:func:`refbraid.checked_files.read_mapping`)."""
    return checked_files.read_mapping(path, f"`--{what}` file")


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (B, ...) as float64 and integer ``labels`` (B,) (or ``y``) of a batch file."""
    what = "`--batch` file"
    arrays = checked_files.read_arrays(path, what)
    labels_key = "labels" if "labels" in arrays else "y" if "y" in arrays else None
    if "x" not in arrays or labels_key is None:
        raise ValueError(f"{what} {path!r} must hold `x` and `labels`, has {list(arrays)}.")
    x, labels = arrays["x"], np.asarray(arrays[labels_key])
    if x.dtype.kind not in "biuf" or x.ndim < 2:
        raise ValueError(f"{what} {path!r}: `x` must be a real array of shape (B, ...), got "
                         f"{x.dtype}{tuple(x.shape)}.")
    if labels.dtype.kind not in "iu" or labels.shape != (x.shape[0],):
        raise ValueError(f"{what} {path!r}: `{labels_key}` must hold {x.shape[0]} integer "
                         f"class labels (one per row of `x`), got {labels.dtype}"
                         f"{tuple(labels.shape)}.")
    if labels.size and labels.min() < 0:
        raise ValueError(f"{what} {path!r}: `{labels_key}` holds the negative label "
                         f"{int(labels.min())}; class labels are 0, 1, ...")
    return np.asarray(x, dtype=np.float64), labels.astype(np.int64)


def load_network(path: str, spec: str | None, sample_shape) -> Converted:
    """A torch file (module or state dict + spec) or a refbraid checkpoint, converted."""
    p = checked_files.input_path(path, "`--model` file")
    if spec is not None:
        checked_files.input_path(spec, "`--spec` file")
    if p.suffix == ".npz":
        if spec is not None:
            raise ValueError("`--spec` is for PyTorch state-dict files; the `--model` file "
                             f"{path!r} is a refbraid checkpoint, which describes itself.")
        return _from_checkpoint(p, sample_shape)
    obj = checked_files.read_torch(p, "`--model` file")
    if isinstance(obj, dict):
        if spec is None:
            raise ValueError(f"{path} holds a state dict: give `--spec` to say which keys are "
                             f"the opening, the steps and the closing (docs/interop.md).")
        return from_state_dict(obj, read_mapping(spec, "spec"))
    if spec is not None:
        raise ValueError("`--spec` is for state-dict files; the model file holds a module.")
    try:
        return from_torch(obj, sample_shape)
    except ValueError as err:
        raise ValueError(f"the `--batch` samples of shape {tuple(sample_shape)} do not fit the "
                         f"`--model` file {path!r}: {err}") from None


def _from_checkpoint(path: Path, sample_shape) -> Converted:
    from ..models import build_network
    from ..training.checkpoint import load_checkpoint

    ckpt = load_checkpoint(path)
    cfg = ckpt.config
    if cfg.get("model") not in ("resnet", "conv"):
        raise ValueError(f"`refbraid compare` takes resnet and conv checkpoints, {path} holds "
                         f"a {cfg.get('model')!r} network.")
    n_classes = int(ckpt.params["closing.W"].shape[0])
    net = build_network(cfg["model"], tuple(sample_shape), n_classes, cfg["layers"],
                        cfg["width"], cfg["T"], cfg.get("activation", "tanh"))
    params = {k: np.asarray(v, dtype=np.float64) for k, v in ckpt.params.items()}
    return Converted(net, params, {k: k for k in params}, {k: None for k in params}, None)


def settings_from(args) -> TorchBraidSettings:
    """The settings of a ``refbraid compare`` run, in XBraid's terms (their file's keys).

    refbraid's conventions by default: ``--fwd-iters``/``--bwd-iters`` count the cycles after
    the skipped first down-cycle and no solve ends with a final FC relaxation, as ``refbraid
    train`` trains; ``--torchbraid-conventions``: XBraid's counts and TorchBraid's final FC
    relaxation of the adjoint (:class:`TorchBraidSettings`' defaults).
    """
    torchbraid = bool(getattr(args, "torchbraid_conventions", False))
    values = {} if torchbraid else {"bwd_finalrelax": False}  # refbraid: no final FC relax
    if args.settings:
        values.update(read_mapping(args.settings, "settings"))
    values.update({k: getattr(args, k) for k in _FLAG_SETTINGS
                   if k != "abs_tol" and getattr(args, k, None) is not None})
    skip = values.get("skip_downcycle", TorchBraidSettings.skip_downcycle)
    for flag, (name, setting) in _ITER_FLAGS.items():
        k = getattr(args, name, None)
        if k is None:
            continue
        if not torchbraid and k < (0 if skip is True else 1):
            raise ValueError(f"`{flag}` counts MGRIT cycles after the skipped first "
                             f"down-cycle (refbraid's convention; TorchBraid's with "
                             f"{CONVENTIONS_FLAG}): it must be >= "
                             f"{0 if skip is True else 1}, got {k}.")
        values[setting] = k if torchbraid or skip is not True else k + 1
    if args.abs_tol is not None:
        try:
            values["abs_tol"] = None if args.abs_tol.lower() == "none" else float(args.abs_tol)
        except ValueError:
            raise ValueError(f"`--abs-tol` must be a number or `none`, got "
                             f"{args.abs_tol!r}.") from None
    return TorchBraidSettings.from_mapping(values)


_INPUT_FLAGS = ("model", "spec", "batch", "settings", "their_gradient", "their_residuals")


def run(args: argparse.Namespace) -> int:
    """Check every input file and the output folder before any work, then compare."""
    from ..training.run_folder import output_folder

    for flag in _INPUT_FLAGS:
        if getattr(args, flag, None) is not None:
            checked_files.input_path(getattr(args, flag), f"`--{flag.replace('_', '-')}` file")
    with output_folder(args.out) as out:
        return _run(args, out)


def _run(args: argparse.Namespace, out: Path) -> int:
    x, labels = read_batch(args.batch)
    converted = load_network(args.model, args.spec, x.shape[1:])
    if tuple(converted.net.opening.in_shape) != tuple(x.shape[1:]):
        from ..models import as_network_input
        try:
            x = as_network_input(converted.net, x)
        except ValueError as err:  # the batch is at fault, not the model
            raise ValueError(f"`--batch` file {args.batch!r}: {err}") from None
    tb = settings_from(args)
    settings = tb.to_refbraid()
    theirs_g = None
    if args.their_gradient:
        keyed = checked_files.read_arrays(args.their_gradient, "`--their-gradient` file")
        theirs_g = params_from_keyed(converted, keyed, "their gradient")
    theirs_r = read_mapping(args.their_residuals, "their-residuals") if args.their_residuals \
        else None
    tol = Tolerances(args.grad_tol, args.res_tol)
    report, grads = compare(converted, x, labels, settings, theirs_g, theirs_r, tol)
    report["settings"]["torchbraid"] = {k: getattr(tb, k) for k in tb.__dataclass_fields__
                                        if k != "unsupported"}
    report["settings"]["conventions"] = "torchbraid" if args.torchbraid_conventions else \
        "refbraid"
    text = json.dumps(report, indent=1, default=_plain).encode()
    atomic_write(out / "compare.json", lambda fh: fh.write(text))
    arrays = {}
    for which, g in grads.items():
        keyed = to_state_dict(Converted(converted.net, converted.params, converted.keys,
                                        {k: None for k in converted.dtypes}, converted.spec), g)
        arrays.update({f"{which}/{k}": np.asarray(v) for k, v in keyed.items()})
    atomic_write(out / "gradients.npz", lambda fh: np.savez(fh, **arrays))
    save_figure(plot_comparison(report), out / "compare.png")
    print(summary(report))
    print(f"wrote compare.json, gradients.npz, compare.png to {out}/")
    return EXIT_MISMATCH if report.get("verdict") == "FAIL" else 0


def _plain(value):
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")
