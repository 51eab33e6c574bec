"""The one distance between two gradients every comparison in refbraid reports.

    e = ‖g − g_ref‖₂ / ‖g_ref‖₂      over all parameter arrays together (one flat vector)

(``‖g − g_ref‖₂`` when ``g_ref`` is zero). :mod:`refbraid.layer_parallel` re-exports it, where
the lessons and tests import it from.
"""

from __future__ import annotations

import numpy as np

from .backends import Backend, get_backend
from .network import Params


def relative_gradient_error(grads: Params, reference: Params, bk: Backend | str = "numpy") -> float:
    """‖g − g_ref‖ / ‖g_ref‖ over all parameter arrays together (2-norm of the flat vector)."""
    bk = get_backend(bk)
    num = den = 0.0
    for k, ref in reference.items():
        r, g = bk.to_numpy(ref), bk.to_numpy(grads[k])
        num += float(np.sum((g - r) ** 2))
        den += float(np.sum(r**2))
    return float(np.sqrt(num / den)) if den > 0 else float(np.sqrt(num))
