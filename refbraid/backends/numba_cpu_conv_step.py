"""Numba CPU kernels (backend ``"numba"``), part 3b: the 3×3 conv ODE step whole.

The conv network's step and its adjoint, each in one pass over the batch, image by image::

    conv_step           z = W * y + b,   y_next = y + h σ(z)
    conv_step_adjoint   s = h σ'(z) ⊙ dy_next,   dy = dy_next + W *ᵀ s,
                        with grads: dW = s ⋆ ỹ,  db = Σ_{n,i,j} s

They are ``conv2d`` then ``euler_act``, and ``h ·activation_adjoint``, ``conv2d_adjoint`` then
``dy_next + ·`` (the composition :class:`refbraid.layers.conv.ConvStep` makes on every other
backend) with the same roundings, so the results are **bit for bit** those of the composed
Numba kernels. What changes is the memory traffic, not the arithmetic:

* forward: the bias, the activation and the Euler update run while one image's accumulator
  rows (:func:`~refbraid.backends.numba_cpu_conv.accumulate_block`) and its input lines are
  in cache, instead of a second pass that reads y and z back from memory (≈ 20 % of a step at
  28×28, 4 channels);
* adjoint: ``h σ'(z) ⊙ dy_next`` is made image by image just before the image's transposed
  convolution reads it (tanh: one pass after NumPy's tanh; no ``h ·`` temporary),
  ``dy_next + W *ᵀ s`` is formed as the transposed convolution's rows leave the accumulator
  (no ``dx`` array and no third pass), and **without grads** (MGRIT's coarse adjoint steps)
  the weight gradient is not computed at all: the composed path computed it and threw it away.

The drivers and their per-image epilogues (:func:`_euler_image`, :func:`_add_image`) are
compiled *without* fast-math; only the convolution's loops (:func:`_conv3x3_acc`, one image
at a time) have ``FASTMATH``. A fast-math driver would let LLVM contract ``y + h σ(z)`` into
an FMA (one rounding where ``euler_act`` makes two): measured, it did, even with the
epilogue compiled apart, once inlined into it. The other way round, the convolution keeps
its flags per instruction wherever it is inlined (tested bit for bit).

``add`` (both kernels): a state added to the result, ``(y + h σ(z)) + add``, as each line is
written (MGRIT's coarse right-hand side ``Φ(u) + g``: the sum its sweep made in a pass of its
own). The forward step with tanh (NumPy's SIMD tanh, see :mod:`refbraid.backends.numba_cpu`;
the adjoint fuses what follows it), other kernel sizes, mixed dtypes, a NumPy-scalar ``h``,
an addend that is not a C-contiguous array of the state's dtype, and anything that is not a
float32/float64 NumPy array take the composed path, the same functions the layer would call.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .into import add_into, plus
from .numba_cpu import (
    GELU,
    IDENTITY,
    RELU,
    TANH,
    _act,
    _act_adjoint,
    activation_adjoint,
    activation_code,
    euler_act,
    native_floats,
)
from .numba_cpu_conv import (
    FASTMATH,
    O_BLOCK,
    _aligned_rows,
    _blocked,
    _channel_sum,
    _pad_image,
    _round_up,
    _weight_grad3x3_image,
    accumulate_block,
    conv2d,
    conv2d_adjoint,
)

OVERRIDES = ("conv_step", "conv_step_adjoint")


# ----------------------------------------------------------------------------- epilogues
@njit(cache=True)
def _add_in_place(out, g):
    """out[t] = out[t] + g[t] over one image just written (in cache). A loop of its own: the
    same sum inside the epilogue's line loops made the forward step 3× slower (measured)."""
    o, a = out.reshape(-1), g.reshape(-1)
    for t in range(o.size):
        o[t] = o[t] + a[t]


@njit(inline="always")
def _euler_image(acc, b, y, h, code, Wp, z, out):
    """z[o,i,j] = acc[o, i·Wp + j] + b[o], out[o,i,j] = y[o,i,j] + h σ(z[o,i,j]) for one
    image (compiled into a driver without fast-math: the roundings of conv2d, then
    euler_act)."""
    C, H, Wd = z.shape
    for o in range(C):
        bo = b[o]
        for i in range(H):
            a, yi, zi, oi = acc[o, i * Wp:], y[o, i], z[o, i], out[o, i]
            if code == RELU:
                for j in range(Wd):
                    zj = a[j] + bo
                    zi[j] = zj
                    oi[j] = yi[j] + h * _act(zj, RELU)
            elif code == GELU:
                for j in range(Wd):
                    zj = a[j] + bo
                    zi[j] = zj
                    oi[j] = yi[j] + h * _act(zj, GELU)
            else:
                for j in range(Wd):
                    zj = a[j] + bo
                    zi[j] = zj
                    oi[j] = yi[j] + h * _act(zj, IDENTITY)


@njit(inline="always")
def _add_image(acc, zero, Wp, dy_next, out):
    """out[o,i,j] = dy_next[o,i,j] + (acc[o, i·Wp + j] + 0) for one image: conv2d_adjoint's
    dx (the transposed convolution, bias zero) and the adjoint's sum, rounded as those two
    make it."""
    C, H, Wd = out.shape
    for o in range(C):
        for i in range(H):
            a, di, oi = acc[o, i * Wp:], dy_next[o, i], out[o, i]
            for j in range(Wd):
                oi[j] = di[j] + (a[j] + zero)


@njit(cache=True)
def _scaled_act_adjoint(z, dy, h, code, out):
    """out[i] = h · (σ'(z[i]) dy[i]) on raveled arrays, the product rounded to the array dtype
    before the scaling (activation_adjoint, then NumPy's ``h *``)."""
    if code == TANH:
        for i in range(out.size):  # out holds tanh(z)
            t = out[i]
            out[i] = dy[i] - dy[i] * t * t
            out[i] = h * out[i]
    elif code == RELU:
        for i in range(out.size):
            out[i] = _act_adjoint(z[i], dy[i], RELU)
            out[i] = h * out[i]
    elif code == GELU:
        for i in range(out.size):
            out[i] = _act_adjoint(z[i], dy[i], GELU)
            out[i] = h * out[i]
    else:
        for i in range(out.size):
            out[i] = _act_adjoint(z[i], dy[i], IDENTITY)
            out[i] = h * out[i]


# ----------------------------------------------------------------------------- drivers
@njit(cache=True, fastmath=FASTMATH)
def _conv3x3_acc(xp, W, Wp, L, acc):
    """acc[o, t] = Σ_{c,p,q} W[o,c,p,q] xp[c, t + p·Wp + q], t < L, for every output channel
    of one padded image (acc: (O4, ≥ L), O4 = W.shape[0]); the convolution's fast-math loops,
    compiled apart from the drivers below so that their epilogues are not."""
    for o0 in range(0, W.shape[0], O_BLOCK):
        accumulate_block(xp, W, Wp, L, o0, acc[o0:o0 + O_BLOCK])


@njit(cache=True)
def _conv3x3_step(y, W, b, h, code, g, with_g, z, out):
    """z = W * y + b and out = y + h σ(z) (+ g), image by image. y, g, z, out: (B, C, H, W);
    W: (C4, C, 3, 3) blocked as for _conv3x3; b: (C,)."""
    B, C, H, Wd = y.shape
    Wp = Wd + 1
    xp = _aligned_rows(C, (H + 2) * Wp + 2, y)
    acc = _aligned_rows(W.shape[0], H * Wp, y)
    for n in range(B):
        _pad_image(y[n], Wp, xp)
        _conv3x3_acc(xp, W, Wp, H * Wp, acc)
        _euler_image(acc, b, y[n], h, code, Wp, z[n], out[n])
        if with_g:  # the addend, while the image is in cache
            _add_in_place(out[n], g[n])


@njit(cache=True)
def _conv3x3_step_adjoint(y, W_t, z, h, code, s_ready, s, dy_next, zero, g, with_g, grads,
                          dy, dW):
    """s = h σ'(z) ⊙ dy_next (unless ``s_ready``: s holds it) and dy = dy_next + W *ᵀ s (+ g),
    image by image; with ``grads`` also dW += s ⋆ ỹ (as _conv3x3_adjoint, the same order over
    images). W_t: (C4, C, 3, 3) blocked flipped, transposed kernels; dW: (C8, C, 3, 3)."""
    B, C, H, Wd = y.shape
    Wp = Wd + 1
    P = (H + 2) * Wp + 2
    xp = _aligned_rows(C, P, y)
    sp = _aligned_rows(dW.shape[0], P, y)
    acc = _aligned_rows(W_t.shape[0], H * Wp, y)
    dW[:] = 0
    for n in range(B):
        if not s_ready:  # this image's s while z and dy_next's image are in cache
            _scaled_act_adjoint(z[n].reshape(-1), dy_next[n].reshape(-1), h, code,
                                s[n].reshape(-1))
        _pad_image(s[n], Wp, sp)
        _conv3x3_acc(sp, W_t, Wp, H * Wp, acc)
        _add_image(acc, zero, Wp, dy_next[n], dy[n])
        if with_g:
            _add_in_place(dy[n], g[n])
        if grads:
            _pad_image(y[n], Wp, xp)
            _weight_grad3x3_image(xp, sp, Wp, H, dW)


# ----------------------------------------------------------------------------- public kernels
def _fusable(code: int, h, *arrays, tanh: bool = False) -> bool:
    """One dtype, float32/float64 NumPy arrays, a step of 3×3 kernels, an activation the
    kernel knows (tanh only where ``tanh``) and a Python-number h."""
    if code < 0 or (code == TANH and not tanh) or isinstance(h, np.generic) \
            or not native_floats(*arrays):
        return False
    y, W = arrays[0], arrays[1]
    return (all(a.dtype == y.dtype for a in arrays) and y.ndim == 4 and W.ndim == 4
            and W.shape == (y.shape[1], y.shape[1], 3, 3))


def _addend(add, like) -> bool:
    """No addend, or one the kernels take: a C-contiguous NumPy array of like's shape and
    dtype."""
    return add is None or (type(add) is np.ndarray and add.dtype == like.dtype
                           and add.shape == like.shape and add.flags.c_contiguous)


def _overlaps(out, other) -> bool:
    return other is not None and np.may_share_memory(out, other)


def _into(out, like) -> bool:
    return (isinstance(out, np.ndarray) and out.dtype == like.dtype and out.shape == like.shape
            and out.flags.c_contiguous and not np.may_share_memory(out, like))


def conv_step(y, W, b, h: float, act: str, out=None, add=None):
    """The conv ODE step → ``(y_next, z)``: ``z = W * y + b``, ``y_next = y + h σ(z)``
    (module docstring), ``+ add`` when given (MGRIT's right-hand side row, added to the
    rounded step in the same pass). ``out``: a C-contiguous array of y's shape and dtype to
    write y_next into (check ``y_next is out``)."""
    code = activation_code(act)
    if not _fusable(code, h, y, W, b) or b.shape != (y.shape[1],) or not _addend(add, y):
        z = conv2d(y, W, b)
        return plus(euler_act(y, z, h, act, out=out), add, out), z
    y = np.ascontiguousarray(y)
    z = np.empty_like(y)
    y_next = out if _into(out, y) and not _overlaps(out, add) else np.empty_like(y)
    C = y.shape[1]
    _conv3x3_step(y, _blocked(W, _round_up(C, O_BLOCK), C), np.ascontiguousarray(b),
                  y.dtype.type(h), code, y if add is None else add, add is not None, z, y_next)
    return y_next, z


def conv_step_adjoint(y, z, dy_next, W, h: float, act: str, grads: bool = True, out=None,
                      add=None):
    """The conv step's adjoint → ``(dy, dW, db)``, dW and db None unless ``grads`` (module
    docstring), ``+ add`` in dy when given. ``out``: where dy may be written (check
    ``dy is out``)."""
    code = activation_code(act)
    if not _fusable(code, h, y, W, z, dy_next, tanh=True) or z.shape != y.shape \
            or dy_next.shape != y.shape or not _addend(add, y):
        s = h * activation_adjoint(z, dy_next, act)
        dys, dW, db = conv2d_adjoint(y, W, s)
        dy = plus(add_into(dy_next, dys, out), add, out)
        return dy, (dW if grads else None), (db if grads else None)
    y, z, dy_next = (np.ascontiguousarray(a) for a in (y, z, dy_next))
    B, C, H, Wd = y.shape
    dtype, hd = y.dtype, y.dtype.type(h)
    if code == TANH:  # NumPy's SIMD tanh first, then σ' and h in one pass
        s = np.tanh(z)
        _scaled_act_adjoint(z.reshape(-1), dy_next.reshape(-1), hd, code, s.reshape(-1))
    else:
        s = np.empty_like(z)  # the driver fills it image by image
    W_t = W[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)  # C,C,3,3 flipped, transposed
    dy = out if _into(out, y) and not _overlaps(out, dy_next) and not _overlaps(out, add) \
        else np.empty_like(y)
    dW = np.empty((_round_up(C, 8), C, 3, 3), dtype)
    _conv3x3_step_adjoint(y, _blocked(W_t, _round_up(C, O_BLOCK), C), z, hd, code,
                          code == TANH, s, dy_next, dtype.type(0), y if add is None else add,
                          add is not None, grads, dy, dW)
    if not grads:
        return dy, None, None
    db = np.empty(C, dtype)
    _channel_sum(s.reshape(B, C, H * Wd), db)
    return dy, dW[:C], db
