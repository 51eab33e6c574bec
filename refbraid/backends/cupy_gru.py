"""The GRU cell's gate algebra on CuPy in one launch each way (``cupy`` backend).

:func:`refbraid.backends.reference.gru_cell` is about eighteen CuPy operations after the two
matrix products (two sigmoids, a tanh, the products and the update, the concatenation of the
gates), its adjoint about twenty. Here one thread per (sample b, hidden unit j) does the
reference's arithmetic, in its order, for its unit of all three gates::

    gru_cell_rows          r = 1/(1 + e^(−gx_r − gh_r)),  z likewise,  n = tanh(gx_n + r gh_n),
                           q = dt (1 − z),  h_new = h + q (n − h)   (implicit: (h + q n)/(1 + q));
                           writes h_new[b, j] and gates[b, (j, H + j, 2H + j)] = (r, z, n)
    gru_cell_adjoint_rows  dh, dn, dz of h_new (as reference.gru_cell_adjoint), then
                           da_n = dn (1 − n²), da_z = dz z (1 − z), da_r = da_n gh_n r (1 − r);
                           writes dgx = [da_r | da_z | da_n], dgh = [da_r | da_z | r da_n], dh

On a GPU the math library's exp and tanh and the compiler's fused multiply-adds change the
last bits (as CuPy's own operations do against NumPy). Off a GPU (the CuPy stand-in) each
kernel runs the reference (its bits) and reports one launch to the launch counter; the CUDA
source compiles with NVRTC for sm_75, sm_80 and sm_90 (tests/test_gpu_fused.py).
"""

from __future__ import annotations

import numpy as np

from .cupy_raw import compiled, on_host, real_cupy

THREADS = 128

_SOURCES = {
    "gru_cell_rows": """
extern "C" __global__ void gru_cell_rows(const T* gx, const T* gh, const T* h, T* h_new,
    T* gates, long long B, long long H, double dt_, int implicit) {
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= B * H) return;
  long long b = t / H, j = t % H, g = b * 3 * H + j;
  T dt = (T)dt_;
  T r = (T)1 / ((T)1 + exp(-(gx[g] + gh[g])));
  T z = (T)1 / ((T)1 + exp(-(gx[g + H] + gh[g + H])));
  T n = tanh(gx[g + 2 * H] + r * gh[g + 2 * H]);
  T q = dt * ((T)1 - z);
  h_new[t] = implicit ? (h[t] + q * n) / ((T)1 + q) : h[t] + q * (n - h[t]);
  gates[g] = r;
  gates[g + H] = z;
  gates[g + 2 * H] = n;
}
""",
    "gru_cell_adjoint_rows": """
extern "C" __global__ void gru_cell_adjoint_rows(const T* gates, const T* gh, const T* h,
    const T* dh_new, T* dgx, T* dgh, T* dh, long long B, long long H, double dt_,
    int implicit) {
  long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (t >= B * H) return;
  long long b = t / H, j = t % H, g = b * 3 * H + j;
  T dt = (T)dt_;
  T r = gates[g], z = gates[g + H], n = gates[g + 2 * H];
  T lam = dh_new[t];
  T q = dt * ((T)1 - z);
  T dh_, dn, dz;
  if (implicit) {
    T D = (T)1 + q;
    dh_ = lam / D;
    dn = lam * q / D;
    dz = -dt * lam * (n - h[t]) / (D * D);
  } else {
    dh_ = lam * ((T)1 - q);
    dn = lam * q;
    dz = -dt * lam * (n - h[t]);
  }
  T da_n = dn * ((T)1 - n * n);
  T da_z = dz * z * ((T)1 - z);
  T da_r = da_n * gh[g + 2 * H] * r * ((T)1 - r);
  dgx[g] = da_r;
  dgx[g + H] = da_z;
  dgx[g + 2 * H] = da_n;
  dgh[g] = da_r;
  dgh[g + H] = da_z;
  dgh[g + 2 * H] = r * da_n;
  dh[t] = dh_;
}
""",
}

#: the kernels (the compile check walks these)
KERNELS = tuple(_SOURCES)


def cuda_source(name: str, T: str = "double") -> str:
    """The complete CUDA C source of kernel ``name`` for element type ``T``."""
    return f"typedef {T} T;\n{_SOURCES[name]}"


def _grid(B: int, H: int) -> tuple[tuple[int], tuple[int]]:
    return ((B * H + THREADS - 1) // THREADS,), (THREADS,)


def gru_cell(gx, gh, h, dt: float, implicit: bool):
    """reference.gru_cell in one launch: ``(h_new (B, H), gates (B, 3H))``."""
    from . import reference

    if not real_cupy(h):
        return on_host("gru_cell_rows", lambda *a: reference.gru_cell(*a, dt, implicit),
                       gx, gh, h)
    import cupy  # pragma: no cover - needs a GPU

    reference.check_gru(h, ("gx", gx, 3), ("gh", gh, 3))
    gx, gh, h = (cupy.ascontiguousarray(a) for a in (gx, gh, h))
    B, H = h.shape
    h_new, gates = cupy.empty_like(h), cupy.empty_like(gx)
    compiled(cuda_source, "gru_cell_rows", h.dtype)(*_grid(B, H), (
        gx, gh, h, h_new, gates, np.int64(B), np.int64(H), np.float64(dt),
        np.int32(bool(implicit))))
    return h_new, gates


def gru_cell_adjoint(gates, gh, h, dh_new, dt: float, implicit: bool):
    """reference.gru_cell_adjoint in one launch: ``(dgx, dgh, dh)``."""
    from . import reference

    if not real_cupy(h):
        return on_host("gru_cell_adjoint_rows",
                       lambda *a: reference.gru_cell_adjoint(*a, dt, implicit),
                       gates, gh, h, dh_new)
    import cupy  # pragma: no cover - needs a GPU

    reference.check_gru(h, ("gates", gates, 3), ("gh", gh, 3), ("dh_new", dh_new, 1))
    gates, gh, h, dh_new = (cupy.ascontiguousarray(a) for a in (gates, gh, h, dh_new))
    B, H = h.shape
    dgx, dgh, dh = cupy.empty_like(gates), cupy.empty_like(gates), cupy.empty_like(h)
    compiled(cuda_source, "gru_cell_adjoint_rows", h.dtype)(*_grid(B, H), (
        gates, gh, h, dh_new, dgx, dgh, dh, np.int64(B), np.int64(H), np.float64(dt),
        np.int32(bool(implicit))))
    return dgx, dgh, dh
