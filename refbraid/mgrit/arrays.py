"""The array namespace of a state: the one array helper every MGRIT module shares
(:func:`refbraid.backends.portable.namespace`, named here for the MGRIT modules).

It lives in its own module so that the imports point one way::

    problem.py → coarse.py → relax.py → arrays.py,     problem.py → arrays.py
"""

from __future__ import annotations

from ..backends.portable import namespace

__all__ = ["namespace"]
