"""A short description of a PyTorch ODE-net's state dict: which keys play which role.

For users whose code does not have refbraid's module structure (a plain ``state_dict`` saved
by TorchBraid, their own XBraid or PyMGRIT code)::

    {"T": 1.0, "input_shape": [1, 8, 8], "loss": "cross_entropy",
     "opening": {"module": "Conv2d", "key": "open_nn.conv", "activation": "relu"},
     "steps":   {"module": "Conv2d", "key": "layers.{n}.conv", "activation": "relu"},
     "closing": {"module": "Linear", "key": "close_nn.fc"}}

``key`` is the module's name in the state dict (its weights are ``key + ".weight"``, ...);
the steps' key holds ``{n}``, the layer index 0..N−1 (N is counted from the state dict unless
``n_layers`` is given). ``module`` is a torch class name with a rule in
:mod:`refbraid.interop.modules`; ``activation`` one of its activation names (default
``identity``); ``options`` hyper-parameters a module's weights do not show (e.g. ``heads``).
The network is ``y[0] = σ(opening(x))``, ``y[n+1] = y[n] + h·σ(step_n(y[n]))`` with
``h = T/N``, ``logits = closing(flatten(y[N]))``, mean cross-entropy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .modules import ACTIVATIONS, rule_for

LOSSES = ("cross_entropy",)
_ROLE_FIELDS = {"module", "key", "activation", "options"}
_NET_FIELDS = {"T", "input_shape", "opening", "steps", "closing", "n_layers", "loss"}


@dataclass(frozen=True)
class RoleSpec:
    """One role: the torch module class, its state-dict key, its activation, its options."""

    module: str
    key: str
    activation: str = "identity"
    options: dict = field(default_factory=dict)

    def check(self, role: str, where: str) -> None:
        rule_for(self.module, role, where, network=True)
        if self.activation not in ACTIVATIONS.values():
            raise ValueError(f"{where}: `activation` must be one of "
                             f"{sorted(ACTIVATIONS.values())}, got {self.activation!r}.")
        if not isinstance(self.key, str):
            raise TypeError(f"{where}: `key` must be a string, got {self.key!r}.")

    def as_dict(self) -> dict:
        return {"module": self.module, "key": self.key, "activation": self.activation,
                **({"options": dict(self.options)} if self.options else {})}


@dataclass(frozen=True)
class NetSpec:
    """Roles of an ODE-net's state dict (module docstring)."""

    T: float
    input_shape: tuple[int, ...]
    opening: RoleSpec
    steps: RoleSpec
    closing: RoleSpec
    n_layers: int | None = None
    loss: str = "cross_entropy"

    def __post_init__(self):
        if isinstance(self.T, bool) or not isinstance(self.T, (int, float)) \
                or not math.isfinite(self.T) or self.T <= 0:
            raise ValueError(f"spec `T` must be a positive number, got {self.T!r}.")
        shape = tuple(self.input_shape)
        if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                            for s in shape):
            raise ValueError(f"spec `input_shape` must be a list of positive sizes (one "
                             f"sample, no batch axis), got {self.input_shape!r}.")
        object.__setattr__(self, "input_shape", shape)
        self.opening.check("opening", "spec `opening`")
        self.steps.check("step", "spec `steps`")
        self.closing.check("closing", "spec `closing`")
        if "{n}" not in self.steps.key:
            raise ValueError(f"spec `steps.key` must contain `{{n}}` (the layer index), got "
                             f"{self.steps.key!r}.")
        if self.n_layers is not None and (isinstance(self.n_layers, bool)
                                          or not isinstance(self.n_layers, int)
                                          or self.n_layers < 1):
            raise ValueError(f"spec `n_layers` must be a positive integer, got "
                             f"{self.n_layers!r}.")
        if self.loss not in LOSSES:
            raise ValueError(f"spec `loss` must be one of {LOSSES}, got {self.loss!r}.")

    @classmethod
    def from_mapping(cls, values: dict) -> NetSpec:
        """From a dict (JSON/TOML); unknown fields are refused by name."""
        if not isinstance(values, dict):
            raise TypeError(f"a network spec must be a mapping, got {type(values).__name__}.")
        bad = sorted(set(values) - _NET_FIELDS)
        missing = sorted({"T", "input_shape", "opening", "steps", "closing"} - set(values))
        if bad or missing:
            raise ValueError(f"network spec: unknown field(s) {bad}, missing {missing}; fields: "
                             f"{sorted(_NET_FIELDS)}.")
        roles = {}
        for role in ("opening", "steps", "closing"):
            entry = values[role]
            if not isinstance(entry, dict) or not {"module", "key"} <= set(entry) \
                    or set(entry) - _ROLE_FIELDS:
                raise ValueError(f"spec `{role}` must be a mapping with `module` and `key` "
                                 f"(optional `activation`, `options`), got {entry!r}.")
            roles[role] = RoleSpec(**entry)
        return cls(T=values["T"], input_shape=tuple(values["input_shape"]),
                   n_layers=values.get("n_layers"), loss=values.get("loss", "cross_entropy"),
                   **roles)

    def as_dict(self) -> dict:
        out = {"T": self.T, "input_shape": list(self.input_shape), "loss": self.loss,
               "opening": self.opening.as_dict(), "steps": self.steps.as_dict(),
               "closing": self.closing.as_dict()}
        if self.n_layers is not None:
            out["n_layers"] = self.n_layers
        return out
