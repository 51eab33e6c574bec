"""Grid transfers between MGRIT levels in *space*, handed to MGRIT by the problem.

MGRIT coarsens in time by injection (:mod:`refbraid.mgrit.coarse`). A problem may also give
coarse levels smaller states (TorchBraid's spatial coarsening, ``levels_to_coarsen``): a
*transfer* object with two per-point methods, level ℓ (fine) ↔ level ℓ+1 (coarse)::

    restrict(u, level, index)      -> the state at fine index ``index`` on level ℓ+1 (R_ℓ u)
    interpolate(v, level, index)   -> a level-ℓ correction from a level-ℓ+1 one   (P_ℓ v)

``index`` is the point's fine (layer) index, so a problem whose state shape changes along
the grid (stages of a network) can pick the operator for that point. ``Problem.transfer =
None`` is the identity (time-only coarsening). With a transfer the FAS steps of
:mod:`refbraid.mgrit.coarse` become, for level ℓ with C-point values ``u_C``, C-point residual
``r`` and coarse operator ``A_{ℓ+1}(w)[j] = w[j] − Φ_{ℓ+1}(w[j−1])``::

    v      = R u_C                         (inject in time, restrict in space)
    g_c    = R r + A_{ℓ+1}(v)              (FAS right-hand side)
    solve  A_{ℓ+1}(w) = g_c                (recursively)
    u_C   ← u_C + P (w − v)                (correction), then F-relaxation on level ℓ

At s = 0 the residual is zero and ``w[0] = v[0]``, so the initial value is never changed. For
R = P = I this is exactly the time-only scheme. Nested iteration restricts ``g`` and ``u`` the
same way and goes up with the same correction form ``u_C ← u_C + P(w − R u_C)``.

:class:`SpatialCoarsening` is the transfer for feature maps (last ``dims`` axes are space)
built from :mod:`refbraid.mgrit.spatial`; its :meth:`~SpatialCoarsening.transposed` is the
pair to use for the adjoint (backward) solve, docs/coarsening.md derives why.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import spatial


@dataclass(frozen=True)
class SpatialCoarsening:
    """Halve every spatial extent between level ℓ and ℓ+1 for each ℓ+1 in ``levels``.

    levels         coarse levels (≥ 1) whose states are half the resolution of the level
                   above (TorchBraid's ``levels_to_coarsen``); e.g. (1,) or (1, 2)
    restriction    'average' (2^d average pooling) or 'full_weighting'
    interpolation  'linear' (bi-/trilinear) or 'constant'
    dims           number of trailing spatial axes (2: NCHW, 3: NCDHW)
    scale          the adjoint pair's scalar (see :meth:`transposed`); 1 for the forward pair
    adjoint        False: (R, P) as named; True: (c·Pᵀ, Rᵀ/c) with c = ``scale``
    """

    levels: tuple[int, ...] = (1,)
    restriction: str = "average"
    interpolation: str = "linear"
    dims: int = 2
    scale: float = 1.0
    adjoint: bool = False

    def __post_init__(self):
        levels = tuple(self.levels)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in levels):
            raise ValueError(f"`levels` must be coarse level indices >= 1, got {self.levels!r}.")
        object.__setattr__(self, "levels", tuple(sorted(set(levels))))
        if self.restriction not in spatial.RESTRICTIONS:
            raise ValueError(f"`restriction` must be one of {spatial.RESTRICTIONS}, "
                             f"got {self.restriction!r}.")
        if self.interpolation not in spatial.INTERPOLATIONS:
            raise ValueError(f"`interpolation` must be one of {spatial.INTERPOLATIONS}, "
                             f"got {self.interpolation!r}.")
        if self.dims not in (1, 2, 3):
            raise ValueError(f"`dims` must be 1, 2 or 3, got {self.dims!r}.")

    def coarsens(self, level: int) -> bool:
        """True when the transfer level ℓ → ℓ+1 halves the resolution."""
        return level + 1 in self.levels

    def restrict(self, u, level: int, index: int):
        """R_ℓ u: forward pair ``R``; adjoint pair ``c·Pᵀ``."""
        if not self.coarsens(level):
            return u
        if self.adjoint:
            return self.scale * spatial.interpolate_adjoint(u, self.interpolation, self.dims)
        return spatial.restrict(u, self.restriction, self.dims)

    def interpolate(self, v, level: int, index: int):
        """P_ℓ v: forward pair ``P``; adjoint pair ``Rᵀ/c``."""
        if not self.coarsens(level):
            return v
        if self.adjoint:
            return spatial.restrict_adjoint(v, self.restriction, self.dims) / self.scale
        return spatial.interpolate(v, self.interpolation, self.dims)

    def transposed(self) -> SpatialCoarsening:
        """The pair for the adjoint solve: restriction ``Pᵀ/2^d``, interpolation ``2^d·Rᵀ``.

        The two-level error propagator of the forward solve is ``I − P A_c⁻¹ R A``; its
        transpose ``I − Aᵀ Rᵀ A_c⁻ᵀ Pᵀ`` is the adjoint solve's two-level propagator when the
        adjoint restricts with ``Pᵀ`` and interpolates with ``Rᵀ``. The scalar 2^d keeps the
        coarse adjoint state at the scale of a restricted state (it cancels in the linear
        correction ``Rᵀ A_c⁻ᵀ Pᵀ``): average R with constant P gives back the same pair,
        average R with linear P gives full-weighting restriction with constant interpolation.
        """
        if self.adjoint:
            return SpatialCoarsening(self.levels, self.restriction, self.interpolation,
                                     self.dims)
        return SpatialCoarsening(self.levels, self.restriction, self.interpolation, self.dims,
                                 scale=1.0 / 2**self.dims, adjoint=True)


def restrict_to_shape(y, shape: tuple[int, ...], restriction: str = "average"):
    """``y`` restricted (repeatedly, with ``restriction`` on the trailing axes that differ)
    until it has ``shape``: the linearisation point of a spatially coarse adjoint step."""
    target = tuple(shape)
    dims = sum(1 for a, b in zip(y.shape, target, strict=False) if a != b)
    while tuple(y.shape) != target:
        if y.ndim != len(target) or dims == 0 or any(
                a < b for a, b in zip(y.shape, target, strict=True)):
            raise ValueError(f"cannot restrict a state of shape {tuple(y.shape)} to {target}.")
        y = spatial.restrict(y, restriction, dims)
    return y
