"""Verification baseline for other people's code (PyTorch optional, imported lazily).

* :mod:`.modules`  — which torch module becomes which refbraid layer (one entry per type)
* :mod:`.spec`     — a short description of a plain state dict (key → role)
* :mod:`.convert`  — torch ODE-net / state dict ⇄ refbraid network and params, bit-exact
* :mod:`.autograd` — loss and gradient of the torch model by autograd (the independent answer)
* :mod:`.xbraid`   — XBraid / TorchBraid settings and residual conventions in refbraid's terms
* :mod:`.compare`  — exact vs layer-parallel gradient, residual histories, the user's numbers
  against them with PASS/FAIL (``refbraid compare``)
"""

from .convert import (
    Converted,
    convert_module,
    from_state_dict,
    from_torch,
    module_state_dict,
    params_from_keyed,
    spec_of,
    to_state_dict,
)
from .modules import RULES, ModuleRule, register, supported
from .spec import NetSpec, RoleSpec
from .xbraid import TorchBraidSettings, XBraidStats, refbraid_history, xbraid_stats

__all__ = [
    "RULES",
    "Converted",
    "ModuleRule",
    "NetSpec",
    "RoleSpec",
    "TorchBraidSettings",
    "XBraidStats",
    "convert_module",
    "from_state_dict",
    "from_torch",
    "module_state_dict",
    "params_from_keyed",
    "refbraid_history",
    "register",
    "spec_of",
    "supported",
    "to_state_dict",
    "xbraid_stats",
]
