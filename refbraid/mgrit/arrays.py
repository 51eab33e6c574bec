"""The array namespace of a state: the one array helper every MGRIT module shares.

It lives in its own module so that the imports point one way::

    problem.py → coarse.py → relax.py → arrays.py,     problem.py → arrays.py
"""

from __future__ import annotations

import numpy as np


def namespace(x):
    """The array namespace of ``x`` (``x.__array_namespace__()``), NumPy for plain values."""
    get = getattr(x, "__array_namespace__", None)
    return get() if get is not None else np
