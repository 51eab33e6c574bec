"""Training configuration: one frozen, validated dataclass, built from CLI flags in one place.

Every field is one ``refbraid train`` flag (``batch_size`` ↔ ``--batch-size``); validation
errors name the flag, the value and what was expected. Types are checked, not coerced from
strings: booleans must be ``bool``, ``out`` / ``data_dir`` / ``resume`` a non-empty path (a
``str`` or ``os.PathLike``) or None, choices strings. NumPy scalars are accepted for numbers
(``np.int64(16)`` for ``layers``) and stored as plain ``int`` / ``float`` / ``bool`` / ``str``,
so a config stays JSON-serialisable. ``relax`` lists F or FCF for the levels that relax
(levels 0..levels-2, finest first, the last entry repeating); a longer list is an error, except
with ``levels = 1`` where it is unused (see ``TrainConfig._check_relax``).

Per-model defaults: ``data``, ``layers``, ``width``, ``T``, ``epochs``, ``lr``, ``cfactor``,
``fwd_iters``, ``bwd_iters`` and ``relax`` default to None, which means "the model's value" from
:data:`refbraid.models.MODEL_DEFAULTS`, filled in on construction (so a config always
holds concrete values, and a checkpoint stores them).

Defaults (resnet): Peaks (5000 points, 80/20 split), ResNet of N = 64 tanh layers of width 16 over
T = 3 (h = 0.047), Adam with lr 5e-3, batch 64, 40 epochs, NumPy backend, float64, trained
layer-parallel with TorchBraid's MGRIT settings (3 levels, cfactor 4, 2 forward / 1 adjoint
iterations, F on the finest level, FCF below, skipped first down-cycle).

Why 64 layers: with 3 levels and cfactor 4 the coarsest grid has N/16 intervals; at N = 16
(one coarsest interval, coarse step 16h = T) the inexact forward solve cost 6 points of
validation accuracy against serial training, at N = 64 it is within 2 points. Measured on
the 2-core development machine (seeds 0/1/2, validation accuracy serial → layer-parallel):
91.4 → 91.8, 95.3 → 93.9, 92.5 → 93.1 %; digits 96.4 → 97.2 %. Serial training takes
about 7 s, layer-parallel (one process) 30–40 s.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import Any

import numpy as np

from ..backends import BACKENDS
from ..backends.reference import ACTIVATIONS
from ..bias_control import BIAS_MODES, BIAS_SIGNALS
from ..data import DATASETS
from ..models import BUFFERED_MODELS, MODEL_DEFAULTS, MODELS
from .config_depth import check_depth_options
from .optim import OPTIMIZERS
from .run_folder import resume_folder

DTYPES = ("float64", "float32")

#: Fields a checkpoint must agree on to be resumed (they fix the data, the network and the
#: optimizer's meaning); the rest (epochs, out, backend, quiet, …) may change on resume.
#: models whose states are feature maps (``--spatial-levels`` applies)
SPATIAL_MODELS = ("conv", "conv-stages")
RESUME_MUST_MATCH = ("data", "samples", "val_fraction", "model", "layers", "width", "T",
                     "activation", "dtype", "optimizer", "seed", "batch_size", "buffer",
                     "batch_norm", "transition")


def flag(field_name: str) -> str:
    """The CLI flag of a config field: ``batch_size`` → ``--batch-size``."""
    return "--" + field_name.replace("_", "-")


# Each check below validates field ``name`` of ``config`` and, where a NumPy scalar or a path
# was given, stores the plain Python value (int, float, bool, str), so that a config is always
# JSON-serialisable (log.json, checkpoints) whatever type the caller passed.
def _store(config, name: str, value) -> None:
    object.__setattr__(config, name, value)


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def _positive_int(config, name: str, allow_zero: bool = False) -> None:
    value = getattr(config, name)
    lo = 0 if allow_zero else 1
    if _is_bool(value) or not isinstance(value, Integral) or value < lo:
        what = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"`{flag(name)}` must be {what} integer, got {value!r}.")
    _store(config, name, int(value))


def _real(config, name: str, ok, expected: str) -> None:
    """A real number (not a bool) for which ``ok(value)`` holds, stored as a float."""
    value = getattr(config, name)
    if _is_bool(value) or not isinstance(value, Real) or not math.isfinite(value) \
            or not ok(value):
        raise ValueError(f"`{flag(name)}` must be {expected}, got {value!r}.")
    _store(config, name, float(value))


def _positive_float(config, name: str) -> None:
    _real(config, name, lambda v: v > 0, "a positive finite number")


def _flag_bool(config, name: str) -> None:
    value = getattr(config, name)
    if not _is_bool(value):
        raise TypeError(f"`{flag(name)}` must be True or False (a bool), got {value!r}.")
    _store(config, name, bool(value))


def _folder(config, name: str, what: str) -> None:
    """None, or a non-empty path (a str or an os.PathLike, stored as a str)."""
    value = getattr(config, name)
    if value is None:
        return
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"`{flag(name)}` must be {what} (a string) or None, got {value!r}.")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"`{flag(name)}` must be {what}, got {value!r}.")
    _store(config, name, path)


def _check_cuda_graphs(config) -> None:
    """``--cuda-graphs`` replays one recorded gradient: ValueError naming each flag that would
    change the gradient from step to step or run it on several processes."""
    if not config.cuda_graphs:
        return
    clash = [flag for flag, on in (
        ("--bias-control", config.bias_control != "off"),
        ("--check-gradient-every", config.check_gradient_every > 0),
        ("--mgopt-levels", config.mgopt_levels > 0), ("--nested-init", config.nested_init > 0),
        ("--data-parallel", config.data_parallel > 1),
        ("--space-parallel", config.space_parallel > 1), ("--trace", config.trace)) if on]
    if clash:
        raise ValueError(f"`--cuda-graphs` replays one recorded gradient on one GPU; it cannot "
                         f"be combined with {', '.join(clash)}.")


def _choice(name: str, value, choices) -> None:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`{flag(name)}` must be one of {tuple(choices)}, got {value!r}.")


def _relax_entries(value) -> tuple[str, ...]:
    """``--relax`` split into upper-case entries; ValueError unless each is F or FCF."""
    if not isinstance(value, str):
        raise ValueError(f"`--relax` must be a comma-separated string of F or FCF per level "
                         f"(e.g. 'F,FCF'), got {value!r}.")
    given = tuple(r.strip().upper() for r in value.split(","))
    if not value.strip() or any(not r for r in given):
        raise ValueError(f"`--relax` must list F or FCF per level, separated by single commas "
                         f"(e.g. 'F,FCF'); got an empty entry in {value!r}.")
    if any(r not in ("F", "FCF") for r in given):
        raise ValueError(f"`--relax` must be a comma-separated list of F or FCF, got "
                         f"{value!r}.")
    return given


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (see ``refbraid train --help``)."""

    data: str | None = None  # None: the model's default (MODEL_DEFAULTS), as below
    data_dir: str | None = None
    samples: int | None = None  # Peaks points (default 5000) or a subset of digits/MNIST
    val_fraction: float = 0.2
    model: str = "resnet"
    layers: int | None = None
    width: int | None = None
    buffer: int = 0  # gpt: serial buffer steps at each end, outside the MGRIT block
    T: float | None = None
    activation: str = "tanh"
    epochs: int | None = None
    batch_size: int = 64
    lr: float | None = None
    optimizer: str = "adam"
    momentum: float = 0.9  # SGD only
    backend: str = "numpy"
    dtype: str = "float64"
    seed: int = 0
    out: str | None = None  # default: runs/<data>-<model>
    checkpoint_every: int = 0  # epochs between checkpoints; 0 = no checkpoints
    resume: str | None = None
    overwrite: bool = False  # a new run may replace the run already in `out`
    trace: bool = False  # record one training step's execution trace (trace.json, timeline.png)
    quiet: bool = False
    serial: bool = False  # sequential backprop instead of layer-parallel MGRIT
    cuda_graphs: bool = False  # cupy: each gradient replayed from a CUDA graph (one launch)
    # layer-parallel MGRIT (TorchBraid's example defaults, docs/references.md §6)
    levels: int = 3
    cfactor: int | None = None
    fwd_iters: int | None = None  # MGRIT cycles after the skipped first down-cycle (resnet: 1,
    bwd_iters: int | None = None  # TorchBraid's "2"); adjoint cycles likewise (resnet: 0, "1")
    fwd_tol: float = 1e-9
    bwd_tol: float = 1e-9
    relax: str | None = None  # finest level first, the last entry repeats (resnet: "F,FCF")
    cycle: str = "V"
    skip_down: bool = True
    check_gradient_every: int = 0  # steps between comparisons with sequential backprop
    data_parallel: int = 1  # under mpiexec -n P: D groups of P/D layer-parallel ranks
    spatial_levels: str | None = None  # e.g. "1,2": coarse levels on half-size feature maps
    dp_groups: int = 1  # DASO: the D data-parallel ranks form G nodes (distributed/daso.py)
    global_sync_every: int = 1  # DASO: nodes average parameters every k batches (1: plain DP)
    space_parallel: int = 1  # S ranks split every feature map by rows (conv; refbraid/space)
    # gradient-bias control (refbraid.bias_control)
    bias_control: str = "off"  # off | measure | iterations | serial
    bias_every: int = 10  # steps between bias/noise measurements
    bias_threshold: float = 1.0  # act when bias / noise exceeds it
    bias_micro: int = 4  # micro-batches of the noise estimate
    bias_max_iters: int = 8  # cap on MGRIT cycles in mode 'iterations'
    bias_signal: str = "measured"  # measured | residual (the proxy, no serial pass)
    bias_residual: float = 10.0  # proxy threshold on the final forward residual
    batch_norm: bool = False  # conv-stages: BN conv steps and a BN transition
    transition: str = "pool"  # conv-stages: "pool" (avg pool + zero channels) | "strided"
    nested_init: int = 0  # train N/2^K, …, N/2 layers first, interpolating weights in t
    nested_epochs: int = 1  # epochs at each shallower depth
    nested_interp: str = "constant"  # weights in t: "constant" | "linear" (also MG/Opt's)
    mgopt_levels: int = 0  # one MG/Opt cycle over this many depth levels per step (0: off)

    def __post_init__(self):
        _choice("model", self.model, tuple(MODELS))
        relax_given = self.relax is not None
        for name, value in MODEL_DEFAULTS.get(self.model, {}).items():
            if getattr(self, name) is None:  # a flag left unset takes the model's value
                _store(self, name, value)
        _choice("data", self.data, DATASETS)
        _choice("activation", self.activation, ACTIVATIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("backend", self.backend, BACKENDS)
        _choice("dtype", self.dtype, DTYPES)
        _choice("cycle", self.cycle, ("V", "F"))
        _choice("bias_control", self.bias_control, BIAS_MODES)
        _choice("bias_signal", self.bias_signal, BIAS_SIGNALS)
        if self.serial and self.bias_control != "off":
            raise ValueError(f"`--bias-control {self.bias_control}` controls the bias of the "
                             f"layer-parallel gradient; with `--serial` the gradient is exact "
                             f"backprop, so it would do nothing: drop one of the two.")
        _check_cuda_graphs(self)
        if self.bias_signal == "residual" and self.bias_control not in ("iterations", "serial"):
            raise ValueError("`--bias-signal residual` needs `--bias-control iterations` or "
                             f"`serial`, got `--bias-control {self.bias_control}`.")
        for name in ("layers", "width", "epochs", "batch_size", "levels", "cfactor",
                     "data_parallel", "dp_groups", "global_sync_every", "space_parallel",
                     "bias_every", "bias_max_iters"):
            _positive_int(self, name)
        for name in ("checkpoint_every", "seed", "fwd_iters", "bwd_iters",
                     "check_gradient_every", "bias_micro", "buffer"):
            _positive_int(self, name, allow_zero=True)
        if self.buffer and self.model not in BUFFERED_MODELS:
            raise ValueError(f"`--buffer` applies to the models {BUFFERED_MODELS}, not "
                             f"{self.model!r}.")
        if self.buffer and self.layers - 2 * self.buffer < 1:
            raise ValueError(f"`--buffer` must be at most {(self.layers - 1) // 2} with "
                             f"`--layers {self.layers}` (buffer steps at each end must leave "
                             f"at least one layer for MGRIT), got {self.buffer}.")
        if self.samples is not None:
            _positive_int(self, "samples")
            if self.samples < 2:
                raise ValueError(f"`--samples` must be at least 2, got {self.samples!r}.")
        if self.cfactor < 2:
            raise ValueError(f"`--cfactor` must be an integer >= 2, got {self.cfactor!r}.")
        if self.bias_micro < 2 or self.bias_micro > self.batch_size:
            raise ValueError(f"`--bias-micro` must be an integer in [2, --batch-size "
                             f"{self.batch_size}], got {self.bias_micro!r}.")
        for name in ("T", "lr", "fwd_tol", "bwd_tol", "bias_threshold", "bias_residual"):
            _positive_float(self, name)
        _real(self, "momentum", lambda v: 0.0 <= v < 1.0, "a number in [0, 1)")
        _real(self, "val_fraction", lambda v: 0.0 < v < 1.0, "a number in (0, 1)")
        for name in ("quiet", "serial", "skip_down", "overwrite", "trace", "batch_norm"):
            _flag_bool(self, name)
        _folder(self, "out", "a folder name")
        _folder(self, "data_dir", "a folder name")
        _folder(self, "resume", "a checkpoint file or a run folder")
        self._check_relax(relax_given)
        self._check_spatial()
        check_depth_options(self, _choice, _positive_int)  # conv-stages, nested init, MG/Opt
        if self.data == "mnist" and not self.data_dir:
            raise ValueError("`--data-dir` is required with `--data mnist` (a folder holding "
                             "train-images-idx3-ubyte and train-labels-idx1-ubyte, or .gz).")

    def _check_relax(self, given: bool) -> None:
        """``--relax``: F or FCF per level that relaxes (levels 0..levels-2; the coarsest is
        solved exactly), finest first, the last entry repeating below. A list longer than that
        is an error when given; a model default written for more levels is cut to fit (so
        the stored config re-validates). With ``--levels 1`` nothing relaxes and any
        well-formed list is accepted (it is unused)."""
        entries = _relax_entries(self.relax)
        relaxing = self.levels - 1
        if relaxing < 1 or len(entries) <= relaxing:
            return
        if given:
            levels = "1 level that relaxes" if relaxing == 1 else f"{relaxing} levels that relax"
            raise ValueError(
                f"`--relax` lists {len(entries)} levels ({self.relax!r}) but `--levels "
                f"{self.levels}` has only {levels} (the coarsest is solved exactly): give at "
                f"most {relaxing} entr{'ies' if relaxing > 1 else 'y'}, finest first (the last "
                f"one repeats on the levels below).")
        _store(self, "relax", ",".join(entries[:relaxing]))

    def model_options(self) -> dict:
        """Keyword arguments of the model builder beyond the common ones (conv-stages)."""
        if self.model != "conv-stages":
            return {}
        return {"batch_norm": self.batch_norm, "transition": self.transition}

    def _check_spatial(self) -> None:
        """``--spatial-levels``: coarse levels 1..levels-1, conv models only, and FCF on every
        level whose coarse level is coarsened (F-relaxation would stagnate)."""
        if not self.spatial_levels:
            return
        levels = self.spatial_level_tuple
        if self.model not in SPATIAL_MODELS:
            raise ValueError(f"`--spatial-levels` needs a model with feature maps "
                             f"({' | '.join(SPATIAL_MODELS)}), got `--model {self.model}`.")
        if any(not 1 <= ell < self.levels for ell in levels):
            raise ValueError(f"`--spatial-levels` must list coarse levels 1..{self.levels - 1} "
                             f"(`--levels {self.levels}`), got {self.spatial_levels!r}.")
        relax = self.relax_per_level
        bad = [ell - 1 for ell in levels if relax[ell - 1] != "FCF"]
        if bad:
            raise ValueError(f"`--relax` must be FCF on level(s) {bad} above the spatially "
                             f"coarsened level(s) {list(levels)} (with F-relaxation MGRIT "
                             f"stagnates there), e.g. `--relax FCF`.")

    @property
    def spatial_level_tuple(self) -> tuple[int, ...]:
        """``--spatial-levels`` as a tuple of ints (ValueError naming the flag otherwise)."""
        try:
            out = tuple(int(v) for v in str(self.spatial_levels).split(",") if v.strip())
        except ValueError:
            out = ()
        if not out:
            raise ValueError(f"`--spatial-levels` must be comma-separated level numbers, e.g. "
                             f"1,2; got {self.spatial_levels!r}.")
        return out

    @property
    def relax_per_level(self) -> tuple[str, ...]:
        """``--relax`` for each coarsening level 0..levels-2 (last entry repeated)."""
        given = _relax_entries(self.relax)
        n = max(self.levels - 1, 0)
        return tuple(given[min(i, len(given) - 1)] for i in range(n))

    @property
    def out_dir(self) -> str:
        """Output folder: ``out``, else the folder of the ``resume`` run (a run continues where
        it was), else ``runs/<data>-<model>``."""
        if self.out:
            return self.out
        if self.resume:
            return str(resume_folder(self.resume))
        return f"runs/{self.data}-{self.model}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Rebuild (and re-validate) a config; unknown keys are an error."""
        if not isinstance(d, dict):
            raise TypeError(f"`d` must be a dict of config fields (as TrainConfig.to_dict() "
                            f"writes it), got {type(d).__name__}.")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; expected some of "
                             f"{sorted(names)}.")
        return cls(**d)

    def resume_mismatches(self, other: TrainConfig) -> list[str]:
        """Descriptions of the :data:`RESUME_MUST_MATCH` fields where the configs differ."""
        return [f"`{flag(k)}`: checkpoint {getattr(other, k)!r}, now {getattr(self, k)!r}"
                for k in RESUME_MUST_MATCH if getattr(self, k) != getattr(other, k)]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The one place that turns parsed ``refbraid train`` flags into a :class:`TrainConfig`."""
    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
