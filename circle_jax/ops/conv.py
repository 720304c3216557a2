"""Convolutions and matrix products: FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
CONV_3D, BATCH_MATMUL, and the custom ops ``Convolution2DTransposeBias`` (MediaPipe) and
``BatchMatMulV2`` (TensorFlow).

These operators dominate training-step time, so HOW a convolution is lowered to XLA is a
performance decision made per shape by :func:`choose_conv_lowering` and
:func:`choose_transpose_conv_lowering` (numbers in their docstrings come from
``benchmarks/bench_conv_lowering.py``). The lowerings, all computing the same values:

- ``"xla"``: ``lax.conv_general_dilated`` (with ``feature_group_count`` for groups).
- ``"im2col"``: the kernel's shifted (strided, dilated) slices of the padded input are
  concatenated on the channel axis and multiplied by the flattened filter in one matmul.
- ``"kn2row"``: one matmul gives every tap's product at every input pixel, then each tap's
  shifted slice of it is summed (regular convolutions; chosen for tiny ones).
- ``"shift"``: depthwise only: the shifted slices are multiplied by per-channel weights and
  summed (an elementwise fusion; no grouped convolution anywhere, forward or backward).
- ``"col2im"`` (transpose convolution): one matmul gives every tap's contribution, each tap is
  placed at its strided output positions with ``lax.pad`` (interior padding) and summed.

Tests force each lowering with :func:`force_lowering`.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_derivatives import SymbolicZero

from .. import ir
from .common import fused_activation, in_loop, padding_pairs, static
from .registry import OpContext, register

Pads = Sequence[tuple[int, int]]

CONV_LOWERINGS = ("xla", "im2col", "kn2row", "shift")
TRANSPOSE_CONV_LOWERINGS = ("xla", "col2im")

#: Largest im2col depth (taps x input channels) and im2col matrix size lowered as im2col.
IM2COL_MAX_DEPTH = 144
IM2COL_MAX_BYTES = 640 << 10

#: Largest im2col matrix of a stride-1 convolution lowered as kn2row (when C_out <= C_in).
KN2ROW_MAX_BYTES = 72 << 10

#: Inside compiled loops (training epochs) XLA's convolution is 10-70x slower, so im2col is
#: used up to this matrix size (memory, not time, bounds it there).
IM2COL_LOOP_MAX_BYTES = 256 << 20

#: Largest per-tap product (input pixels x taps x output channels) lowered as col2im; beyond
#: it only memory decides (col2im is 3-25x faster at every measured size).
COL2IM_MAX_BYTES = 512 << 20

_forced: str | None = None


@contextmanager
def force_lowering(method: str | None) -> Iterator[None]:
    """Within the block, lower every convolution with ``method`` (tests and benchmarks).

    ``method`` is one of ``CONV_LOWERINGS`` or ``TRANSPOSE_CONV_LOWERINGS``; a convolution the
    method cannot compute raises ``ValueError`` instead of silently falling back. The choice is
    made while tracing, so functions must be (re)traced inside the block.
    """
    global _forced
    if method is not None and method not in CONV_LOWERINGS + TRANSPOSE_CONV_LOWERINGS:
        raise ValueError(f"unknown lowering {method!r}")
    previous, _forced = _forced, method
    try:
        yield
    finally:
        _forced = previous


def choose_conv_lowering(kernel: Sequence[int], c_in: int, c_out: int, groups: int,
                         out_pixels: int, strides: Sequence[int] = (), itemsize: int = 4) -> str:
    """The lowering of a convolution; ``out_pixels`` = batch x output spatial size.

    Measured with ``benchmarks/bench_conv_lowering.py`` (XLA CPU, 2 cores, JAX 0.10, jitted
    forward + backward w.r.t. input and filter):

    - depthwise (one input channel per group) is always ``"shift"``: XLA's grouped
      convolution and its gradient are 4x (3x3 stride 1, batch 1) to 90x (stride 2, batch 16)
      slower at 64x64x32;
    - other grouped convolutions are always ``"im2col"`` (one batched matmul per group):
      ``feature_group_count`` is 25-50x slower;
    - 1x1 convolutions are plain matmuls (``"im2col"`` without copies): 1.2-5x faster;
    - tiny stride-1 convolutions with C_out <= C_in (an im2col matrix of at most
      ``KN2ROW_MAX_BYTES``) are ``"kn2row"``. Training steps of such models are dispatch-bound
      (about 60 XLA operations of about 1 us each), and kn2row's forward is 2 operations
      instead of im2col's 11. Paired epochs of the bundled 8x8 CNN (its 3x3 conv 8 -> 8):
      the steps are 3-36% faster at batch 1 (the gain follows the machine's state; 20-36%
      with 4, 8 and 32 channels alike in one state), 14% at batch 4, even at 8, and 19%
      slower at 16. ResNet-8's 8x8x64 stage (144 KiB) is 7% slower. In a profiled batch-1
      step the im2col variant also waited 19 us for a worker thread;
    - small regular convolutions are dispatch/layout bound in XLA's convolution: im2col + one
      matmul is 1.5-7x faster while the im2col depth (taps x C_in) is at most
      ``IM2COL_MAX_DEPTH`` and its matrix at most ``IM2COL_MAX_BYTES`` (the branching 8x8x8
      CNN: 2-3x); beyond either, its copies cost more than they save (0.4-0.9x): ``"xla"``.
    """
    cg = c_in // groups
    if groups > 1:
        return "shift" if cg == 1 else "im2col"
    taps = math.prod(kernel)
    if taps == 1:
        return "im2col"
    depth = taps * cg
    size = out_pixels * depth * itemsize
    if all(s == 1 for s in strides) and c_out <= c_in and size <= KN2ROW_MAX_BYTES:
        return "kn2row"
    if depth <= IM2COL_MAX_DEPTH and size <= IM2COL_MAX_BYTES:
        return "im2col"
    if in_loop() and size <= IM2COL_LOOP_MAX_BYTES:  # see common.inside_loop: 10-70x
        return "im2col"
    return "xla"


def choose_transpose_conv_lowering(kernel: Sequence[int], c_out: int, in_pixels: int,
                                   itemsize: int = 4) -> str:
    """The lowering of a transpose convolution; ``in_pixels`` = batch x input spatial size.

    XLA CPU runs the ``lhs_dilation`` convolution (and its gradients) over the zeros of the
    stride-dilated input; col2im does only the useful work and was 3-25x faster at every
    measured shape (``benchmarks/bench_conv_lowering.py``). Its per-tap product is
    taps x the output's size / stride^2, so ``"xla"`` is kept for products above
    ``COL2IM_MAX_BYTES``, where memory matters more than time.
    """
    if in_pixels * math.prod(kernel) * c_out * itemsize <= COL2IM_MAX_BYTES:
        return "col2im"
    return "xla"


def _pick(chosen: str, allowed: Sequence[str], what: str) -> str:
    if _forced is None:
        return chosen
    if _forced not in allowed:
        raise ValueError(f"lowering {_forced!r} cannot compute {what} (use one of {allowed})")
    return _forced


# ----------------------------------------------------------------------------- conv core


def _out_sizes(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int], pads: Pads) -> tuple[int, ...]:
    out = []
    for n, k, s, d, (lo, hi) in zip(sizes, kernel, strides, dilations, pads, strict=True):
        m = (n + lo + hi - (k - 1) * d - 1) // s + 1
        if m <= 0:
            raise ValueError(
                f"the kernel ({k}, dilation {d}) is larger than the padded input ({n + lo + hi})"
            )
        out.append(m)
    return tuple(out)


def _tap(xp: jax.Array, offset: Sequence[int], strides: Sequence[int],
         dilations: Sequence[int], out: Sequence[int]) -> jax.Array:
    """The strided slice of the padded input ``xp`` [N, *S, C] seen by the kernel tap at
    ``offset``."""
    start = [o * d for o, d in zip(offset, dilations, strict=True)]
    limit = [b + (m - 1) * s + 1 for b, m, s in zip(start, out, strides, strict=True)]
    return lax.slice(xp, (0, *start, 0), (xp.shape[0], *limit, xp.shape[-1]), (1, *strides, 1))


def _offsets(kernel: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(k) for k in kernel))


def _taps(xp: jax.Array, kernel: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int], out: Sequence[int]) -> Iterator[jax.Array]:
    """The strided slice of the padded input ``xp`` [N, *S, C] seen by each kernel tap."""
    for offset in _offsets(kernel):
        yield _tap(xp, offset, strides, dilations, out)


def _pad_spatial(x: jax.Array, pads: Pads) -> jax.Array:
    if not any(lo or hi for lo, hi in pads):
        return x
    return jnp.pad(x, [(0, 0), *pads, (0, 0)])


def _dimension_numbers(nd: int) -> tuple[str, str, str]:
    sp = "DHW"[-nd:] if nd <= 3 else None
    if sp is None:
        raise ValueError(f"{nd}-d convolutions are not supported")
    return f"N{sp}C", f"{sp}IO", f"N{sp}C"


def conv_nd(x: jax.Array, w: jax.Array, strides: Sequence[int], dilations: Sequence[int],
            pads: Pads, method: str | None = None) -> jax.Array:
    """Channels-last convolution: x [N, *S, C_in], w [*K, C_in/groups, C_out] -> [N, *S', C_out].

    ``pads`` are explicit (before, after) pairs per spatial dim; groups = C_in / w.shape[-2].
    ``method`` overrides the dispatch rule (one of ``CONV_LOWERINGS``).
    """
    nd = x.ndim - 2
    kernel, cg, c_out = tuple(w.shape[:nd]), w.shape[-2], w.shape[-1]
    c_in = x.shape[-1]
    if w.ndim != nd + 2:
        raise ValueError(f"filter rank {w.ndim} does not match a {nd}-d convolution")
    if c_in % cg or c_out % (c_in // cg):
        raise ValueError(
            f"input channels {c_in} and output channels {c_out} are not a multiple of "
            f"the filter's {cg} input channels per group"
        )
    groups = c_in // cg
    out = _out_sizes(x.shape[1:-1], kernel, strides, dilations, pads)
    if method is None:
        allowed = ("xla", "im2col") + (("kn2row",) if groups == 1 else ()) + (
            ("shift",) if cg == 1 else ())
        chosen = choose_conv_lowering(kernel, c_in, c_out, groups, x.shape[0] * math.prod(out),
                                      strides, x.dtype.itemsize)
        method = _pick(chosen, allowed,
                       f"a convolution with {cg} input channels per group")
    if method not in CONV_LOWERINGS:
        raise ValueError(f"unknown convolution lowering {method!r}")
    return _conv_impl(x, w, tuple(strides), tuple(dilations), tuple(tuple(p) for p in pads),
                      method)


# The lowerings are jitted so that eager (op-by-op) execution compiles one program per
# convolution instead of one per primitive (inside an outer jit they are simply inlined).
@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _conv_impl(x: jax.Array, w: jax.Array, strides: tuple[int, ...],
               dilations: tuple[int, ...], pads: tuple[tuple[int, int], ...],
               method: str) -> jax.Array:
    nd = x.ndim - 2
    kernel, cg, c_out = tuple(w.shape[:nd]), w.shape[-2], w.shape[-1]
    c_in = x.shape[-1]
    groups = c_in // cg
    if method == "xla":
        return lax.conv_general_dilated(
            x, w, tuple(strides), [tuple(p) for p in pads], rhs_dilation=tuple(dilations),
            dimension_numbers=_dimension_numbers(nd), feature_group_count=groups,
        )
    if method == "kn2row":
        if groups > 1:
            raise ValueError("the kn2row lowering computes ungrouped convolutions only")
        return _kn2row(x, w, strides, dilations, pads)
    if method == "shift":
        m = c_out // c_in
        if m > 1:  # output channel c*M + k reads input channel c
            x = jnp.repeat(x, m, axis=-1)
        return _channelwise(x, w.reshape(-1, c_out), (kernel, strides, dilations, pads))
    out = _out_sizes(x.shape[1:-1], kernel, strides, dilations, pads)
    taps = list(_taps(_pad_spatial(x, pads), kernel, strides, dilations, out))
    if groups == 1:
        cols = taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=-1)
        return _matmul_2d(cols, w.reshape(-1, c_out))
    cols = jnp.stack(taps, axis=-2)  # [N, *S', K, C_in]
    cols = cols.reshape(*cols.shape[:-1], groups, cg)
    wg = w.reshape(len(taps), cg, groups, c_out // groups)
    y = jnp.einsum("...kgc,kcgo->...go", cols, wg)
    return y.reshape(*y.shape[:-2], c_out)


def _kn2row(x: jax.Array, w: jax.Array, strides: tuple[int, ...], dilations: tuple[int, ...],
            pads: tuple[tuple[int, int], ...]) -> jax.Array:
    """Every tap's product at every input pixel (one matmul), then the sum of each tap's
    shifted slice of its own product (one fusion).

    The products are cut apart with ``lax.split`` (as in col2im), whose transpose is one
    concatenate: the backward pass is the im2col of the output gradient and two matmuls.
    """
    nd = x.ndim - 2
    kernel, c_in, c_out = w.shape[:nd], w.shape[-2], w.shape[-1]
    taps = math.prod(kernel)
    w_all = jnp.moveaxis(w.reshape(taps, c_in, c_out), 0, 1).reshape(c_in, taps * c_out)
    parts = lax.split(_matmul_2d(x, w_all), [c_out] * taps, axis=x.ndim - 1)
    out = _out_sizes(x.shape[1:-1], kernel, strides, dilations, pads)
    return functools.reduce(jnp.add, (
        _tap(_pad_spatial(p, pads), offset, strides, dilations, out)
        for p, offset in zip(parts, _offsets(kernel), strict=True)))


def _matmul_2d(x: jax.Array, w: jax.Array) -> jax.Array:
    """[..., K] @ [K, O] as one 2-d matmul (forward and both gradients are plain GEMMs)."""
    lead = x.shape[:-1]
    y = _matmul(x.reshape(-1, x.shape[-1]), w)
    return y.reshape(*lead, w.shape[-1])


@jax.custom_jvp
def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w`` for 2-d operands, with a weight gradient XLA CPU computes fast.

    Two rewrites in the weight tangent, both for XLA CPU's dot lowering:

    - XLA rewrites a product over one row (a batch of 1) into an elementwise outer product,
      which then fuses with, and recomputes for each of its elements, everything that
      produced both operands: for the bundled example's dense layer the softmax-gradient
      chain and the max pooling, 10 x 128 times. With a zero row appended to ``x`` its
      transpose stays a 2-row GEMM (20% faster steps at batch 1).
    - The weight gradient contracts both operands' leading axis. XLA's dot (Eigen) computes
      it 1.3-3x faster with the smaller of K and O as the result's rows: ``x.T @ g`` [K, O]
      takes 150 us for [1024, 72] x [1024, 8] and ``g.T @ x`` [O, K] 67 us; [1024, 8] x
      [1024, 72] the other way round. For O < K the tangent is written transposed, behind
      an optimization barrier that keeps XLA from folding the transposes back (the bundled
      example's steps 8% / 14% faster at batch 1 / 16, paired).
    """
    return jnp.matmul(x, w)


@functools.partial(_matmul.defjvp, symbolic_zeros=True)
def _matmul_jvp(primals: tuple, tangents: tuple) -> tuple:
    x, w = primals
    tx, tw = tangents
    y = jnp.matmul(x, w)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(jnp.matmul(tx, w))
    if not isinstance(tw, SymbolicZero):
        one_row = x.shape[0] == 1  # see the docstring: keep a 2-row GEMM
        rows = jnp.pad(x, ((0, 1), (0, 0))) if one_row else x
        if w.shape[1] < w.shape[0]:  # O < K: the gradient as [O, K] (see the docstring)
            t = lax.dot_general(rows, lax.optimization_barrier(tw.T), (((1,), (1,)), ((), ())))
        else:
            t = jnp.matmul(rows, tw)
        terms.append(t[:1] if one_row else t)
    return y, _tangent_sum(terms, y)


Geometry = tuple  # (kernel, strides, dilations, pads): hashable, static

#: Bytes of shifted slices one chunk of the weight-gradient scan may hold (see _channelwise).
CHUNK_BYTES = 8 << 20


def _shift_sum(x: jax.Array, wk: jax.Array, geom: Geometry) -> jax.Array:
    """sum_k slice_k(padded x) * wk[k]: one elementwise fusion, no shifted copy materialized."""
    kernel, strides, dilations, pads = geom
    out = _out_sizes(x.shape[1:-1], kernel, strides, dilations, pads)
    acc = None
    for k, t in enumerate(_taps(_pad_spatial(x, pads), kernel, strides, dilations, out)):
        term = t * wk[k]
        acc = term if acc is None else acc + term
    return acc


def _shift_sum_chunked(x: jax.Array, wk: jax.Array, geom: Geometry) -> jax.Array:
    """_shift_sum over batch chunks, rematerialized: transposed w.r.t. ``wk`` (the weight
    gradient) it becomes a scan whose steps reduce the slices of ``CHUNK_BYTES`` of input."""
    n = x.shape[0]
    kernel, strides, dilations, pads = geom
    out = _out_sizes(x.shape[1:-1], kernel, strides, dilations, pads)
    per_image = math.prod(out) * x.shape[-1] * x.dtype.itemsize * math.prod(kernel)
    b = max([d for d in range(1, n + 1) if n % d == 0 and d * per_image <= CHUNK_BYTES] or [1])
    body = jax.checkpoint(lambda xc: _shift_sum(xc, wk, geom))
    if b == n:
        return body(x)
    y = lax.map(body, x.reshape(n // b, b, *x.shape[1:]))
    return y.reshape(n, *y.shape[2:])


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _channelwise(x: jax.Array, wk: jax.Array, geom: Geometry) -> jax.Array:
    """Depthwise convolution with one weight per (tap, channel): x [N, *S, C], wk [K, C].

    The value is :func:`_shift_sum`. Its derivative is written out so the weight gradient is
    computed in batch chunks: differentiated as is, XLA CPU materializes every shifted slice
    of the whole batch for the per-channel reductions (9 x the input for 3x3), and above
    ~32 MB of temporaries every step pays fresh-page faults: 5-10x slower at batch 16,
    64x64x32 (``benchmarks/bench_conv_lowering.py``). All AD modes still work.
    """
    return _shift_sum(x, wk, geom)


@functools.partial(_channelwise.defjvp, symbolic_zeros=True)
def _channelwise_jvp(geom: Geometry, primals: tuple, tangents: tuple) -> tuple:
    x, wk = primals
    tx, twk = tangents
    y = _shift_sum(x, wk, geom)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(_shift_sum(tx, wk, geom))
    if not isinstance(twk, SymbolicZero):
        terms.append(_shift_sum_chunked(x, twk, geom))
    return y, _tangent_sum(terms, y)


def _tangent_sum(terms: list[jax.Array], y: jax.Array) -> jax.Array:
    """The sum of a jvp rule's tangent terms (zeros like ``y`` when every input's is zero)."""
    return sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y)


def _bias_act(y: jax.Array, b: Any, act: int | None) -> jax.Array:
    """Add the bias, then the fused activation (a clamp, as in LiteRT's conv kernels: TANH and
    SIGN_BIT leave the output unchanged, checked against LiteRT in the tests)."""
    if b is not None:
        y = y + b
    return fused_activation(y, act)


def _ints(*values: Any, default: int = 1) -> tuple[int, ...]:
    """Option values as ints; an absent (None) or zero value reads as ``default``."""
    return tuple(int(v) if v else default for v in values)


def _check_float(w: Any, what: str) -> None:
    if not jnp.issubdtype(jnp.result_type(w), jnp.floating):
        raise NotImplementedError(
            f"{what} of dtype {jnp.result_type(w)} (quantized/hybrid weights) is not supported; "
            "dequantize the model first"
        )


def _spatial_conv(ctx: OpContext, x: Any, w: Any, b: Any, strides: tuple[int, ...],
                  dilations: tuple[int, ...]) -> jax.Array:
    """Shared body of CONV_2D / DEPTHWISE_CONV_2D / CONV_3D: w is [*K, C_in/groups, C_out]."""
    o = ctx.options
    nd = len(strides)
    kernel = tuple(w.shape[:nd])
    if x.ndim != nd + 2:
        raise ValueError(f"input must have rank {nd + 2}, got shape {tuple(x.shape)}")
    pads = padding_pairs(o.padding or 0, tuple(x.shape[1:-1]), kernel, strides, dilations)
    y = conv_nd(x, w, strides, dilations, pads)
    return _bias_act(y, b, o.fused_activation_function)


# ----------------------------------------------------------------------------- convolutions


@register("CONV_2D")
def conv_2d(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """NHWC convolution, filter [O, H, W, I]; I < C_in means groups = C_in / I."""
    _check_float(w, "CONV_2D filter")
    o = ctx.options
    if jnp.ndim(w) != 4:
        raise ValueError(f"filter must be [O, H, W, I], got shape {tuple(jnp.shape(w))}")
    w = jnp.transpose(w, (1, 2, 3, 0))  # [H, W, I, O]
    return _spatial_conv(ctx, x, w, b, _ints(o.stride_h, o.stride_w),
                         _ints(o.dilation_h_factor, o.dilation_w_factor))


@register("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """Filter [1, H, W, C*M]; output channel c*M + m = input channel c times filter c*M + m.

    The multiplier M is the filter's channels / input channels (the depth_multiplier option
    is only checked when it is set).
    """
    _check_float(w, "DEPTHWISE_CONV_2D filter")
    o = ctx.options
    shape = tuple(jnp.shape(w))
    c = x.shape[-1]
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f"filter must be [1, H, W, C*M], got shape {shape}")
    if shape[3] % c:
        raise ValueError(f"filter channels {shape[3]} are not a multiple of input channels {c}")
    if o.depth_multiplier and o.depth_multiplier * c != shape[3]:
        raise ValueError(
            f"depth_multiplier {o.depth_multiplier} x input channels {c} != filter channels "
            f"{shape[3]}"
        )
    w = jnp.reshape(w, (shape[1], shape[2], 1, shape[3]))
    return _spatial_conv(ctx, x, w, b, _ints(o.stride_h, o.stride_w),
                         _ints(o.dilation_h_factor, o.dilation_w_factor))


@register("CONV_3D")
def conv_3d(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """NDHWC convolution, filter [D, H, W, I, O]."""
    _check_float(w, "CONV_3D filter")
    o = ctx.options
    if jnp.ndim(w) != 5:
        raise ValueError(f"filter must be [D, H, W, I, O], got shape {tuple(jnp.shape(w))}")
    return _spatial_conv(ctx, x, w, b, _ints(o.stride_d, o.stride_h, o.stride_w),
                         _ints(o.dilation_d_factor, o.dilation_h_factor, o.dilation_w_factor))


# ----------------------------------------------------------------------------- transpose conv


def transpose_conv_2d(x: jax.Array, w: jax.Array, out_hw: Sequence[int],
                      strides: Sequence[int], pad_before: Sequence[int],
                      method: str | None = None) -> jax.Array:
    """Scatter form of a transpose convolution, x [N, H, W, I], filter w [O, kh, kw, I]:

    ``out[n, i*s - pad + f, o] += x[n, i, c] * w[o, f, c]`` (TFLite's definition), keeping only
    output positions inside ``out_hw``. Returns [N, *out_hw, O].
    """
    c_out, kh, kw, c_in = w.shape
    if x.shape[-1] != c_in:
        raise ValueError(f"input channels {x.shape[-1]} != filter input channels {c_in}")
    kernel = (kh, kw)
    if method is None:
        chosen = choose_transpose_conv_lowering(kernel, c_out, math.prod(x.shape[:3]),
                                                x.dtype.itemsize)
        method = _pick(chosen, TRANSPOSE_CONV_LOWERINGS, "a transpose convolution")
    if method not in TRANSPOSE_CONV_LOWERINGS:
        raise ValueError(f"unknown transpose convolution lowering {method!r}")
    return _transpose_impl(x, w, tuple(out_hw), tuple(strides), tuple(pad_before), method)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _transpose_impl(x: jax.Array, w: jax.Array, out_hw: tuple[int, int],
                    strides: tuple[int, int], pad_before: tuple[int, int],
                    method: str) -> jax.Array:
    c_out, kh, kw, c_in = w.shape
    kernel = (kh, kw)
    in_hw = x.shape[1:3]
    if method == "col2im":
        # y[..., tap, o] = sum_c x[..., c] w[o, tap, c]: one matmul for every tap.
        y = _matmul_2d(x, jnp.transpose(w, (3, 1, 2, 0)).reshape(c_in, kh * kw * c_out))
        # lax.split, not y[..., k, :]: the transpose of a split is one concatenate, that of
        # indexing pads every tap's cotangent to the size of y (all materialized).
        parts = lax.split(y, [c_out] * (kh * kw), axis=3)
        zero = jnp.zeros((), y.dtype)
        acc = None
        for part, (fy, fx) in zip(parts, _offsets((kh, kw)), strict=True):
            config = [(0, 0, 0)]
            for f, p, n, m, s in zip((fy, fx), pad_before, in_hw, out_hw, strides, strict=True):
                lo = f - p
                config.append((lo, m - lo - (n - 1) * s - 1, s - 1))
            config.append((0, 0, 0))
            term = lax.pad(part, zero, config)
            acc = term if acc is None else acc + term
        return acc
    # Correlate the stride-dilated input with the spatially flipped filter.
    wf = jnp.flip(jnp.transpose(w, (1, 2, 3, 0)), (0, 1))  # [kh, kw, I, O]
    pads, crop = [], []
    for k, p, n, m, s in zip(kernel, pad_before, in_hw, out_hw, strides, strict=True):
        lo = k - 1 - p
        hi = m - ((n - 1) * s + 1) - lo + k - 1
        pads.append((lo, max(hi, 0)))
        crop.append(m)
    y = lax.conv_general_dilated(x, wf, (1, 1), pads, lhs_dilation=tuple(strides),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y[:, : crop[0], : crop[1], :]


@register("TRANSPOSE_CONV")
def transpose_conv(ctx: OpContext, output_shape: Any, w: Any, x: Any, b: Any = None) -> jax.Array:
    """Inputs (output_shape, filter [O, H, W, I], input, bias?); the gradient of CONV_2D.

    SAME padding is computed from the OUTPUT size (as TFLite does). The batch size is taken
    from the input, so a model can run at another batch size than its output_shape says.
    """
    _check_float(w, "TRANSPOSE_CONV filter")
    o = ctx.options
    shape = [int(v) for v in static(output_shape, "TRANSPOSE_CONV output_shape").reshape(-1)]
    if len(shape) != 4 or x.ndim != 4 or jnp.ndim(w) != 4:
        raise ValueError("TRANSPOSE_CONV needs a 4-d output_shape, input and filter [O, H, W, I]")
    if shape[3] != jnp.shape(w)[0]:
        raise ValueError(f"output_shape channels {shape[3]} != filter outputs {jnp.shape(w)[0]}")
    strides = _ints(o.stride_h, o.stride_w)
    kernel = tuple(jnp.shape(w)[1:3])
    pads = padding_pairs(o.padding or 0, tuple(shape[1:3]), kernel, strides)
    y = transpose_conv_2d(x, w, shape[1:3], strides, [p[0] for p in pads])
    return _bias_act(y, b, o.fused_activation_function)


# TfLitePadding of TFLite's C API (NOT the schema's Padding enum).
_TFLITE_PADDING_SAME, _TFLITE_PADDING_VALID = 1, 2


def parse_transpose_conv_bias_options(data: bytes | None) -> tuple[int, int, int]:
    """(padding, stride_w, stride_h) of MediaPipe's Convolution2DTransposeBias.

    MediaPipe's kernel (mediapipe/util/tflite/operations/transpose_conv_bias.cc) reinterprets
    the custom options as a C ``TfLiteTransposeConvParams``, whose first members are
    ``TfLitePadding padding; int stride_width; int stride_height;`` so the bytes are three
    little-endian int32: padding (1 = SAME, 2 = VALID: TfLitePadding, unlike the schema's
    enum), stride_width, stride_height. Newer structs append more fields; they are ignored.
    """
    if data is None or len(data) < 12:
        raise ValueError(
            "Convolution2DTransposeBias needs 12 bytes of custom options "
            f"(int32 padding, stride_w, stride_h), got {0 if data is None else len(data)}"
        )
    padding, sw, sh = struct.unpack_from("<3i", data)
    if padding not in (_TFLITE_PADDING_SAME, _TFLITE_PADDING_VALID):
        raise ValueError(f"Convolution2DTransposeBias padding {padding} is not 1 (SAME) or 2 "
                         "(VALID)")
    if sw <= 0 or sh <= 0:
        raise ValueError(f"Convolution2DTransposeBias strides must be positive, got {sw}, {sh}")
    return padding, sw, sh


@register("CUSTOM:Convolution2DTransposeBias")
def convolution_2d_transpose_bias(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """MediaPipe's transpose convolution + bias: inputs (input, filter [O, H, W, I], bias).

    Unlike TRANSPOSE_CONV there is no output_shape input: per spatial dim, with
    ``r = (in - 1) % stride``, SAME trims ``t = max(0, k - r - 1)`` pixels (``t // 2`` at the
    start) and the output size is ``stride * (in - 1) + k - t``; VALID trims nothing.
    """
    _check_float(w, "Convolution2DTransposeBias filter")
    padding, sw, sh = parse_transpose_conv_bias_options(ctx.op.custom_options)
    if x.ndim != 4 or jnp.ndim(w) != 4:
        raise ValueError("Convolution2DTransposeBias needs a 4-d input and filter [O, H, W, I]")
    strides = (sh, sw)
    kernel = tuple(jnp.shape(w)[1:3])
    out, before = [], []
    for n, k, s in zip(x.shape[1:3], kernel, strides, strict=True):
        trim = max(0, k - (n - 1) % s - 1) if padding == _TFLITE_PADDING_SAME else 0
        out.append(s * (n - 1) + k - trim)
        before.append(trim // 2)
    y = transpose_conv_2d(x, w, out, strides, before)
    return _bias_act(y, b, None)


# ----------------------------------------------------------------------------- matmuls


@register("FULLY_CONNECTED")
def fully_connected(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """y = x @ w.T + b with w [out, in]; x is flattened to [-1, in] unless keep_num_dims."""
    _check_float(w, "FULLY_CONNECTED weights")
    o = ctx.options
    if o.weights_format:
        raise NotImplementedError(
            f"FULLY_CONNECTED weights_format {o.weights_format} (shuffled int8) is not "
            "supported, only DEFAULT"
        )
    if o.fused_activation_function in (ir.ACT_TANH, ir.ACT_SIGN_BIT):
        raise NotImplementedError(
            "FULLY_CONNECTED supports fused activations NONE, RELU, RELU_N1_TO_1 and RELU6 "
            "(LiteRT rejects TANH and SIGN_BIT too)"
        )
    if jnp.ndim(w) != 2:
        raise ValueError(f"weights must be [out, in], got shape {tuple(jnp.shape(w))}")
    n_in = jnp.shape(w)[1]
    size = math.prod(x.shape)
    if o.keep_num_dims:
        if x.shape[-1] != n_in:
            raise ValueError(f"keep_num_dims: input's last dim {x.shape[-1]} != weights' {n_in}")
    else:
        if size % n_in:
            raise ValueError(f"input of {size} elements cannot be split into rows of {n_in}")
        x = jnp.reshape(x, (size // n_in, n_in))
    y = _matmul_2d(x, jnp.transpose(w))  # XLA folds the transpose into the dot
    return _bias_act(y, b, o.fused_activation_function)


def _batch_matmul(x: Any, y: Any, adj_x: bool, adj_y: bool) -> jax.Array:
    if jnp.ndim(x) < 2 or jnp.ndim(y) < 2:
        raise ValueError(f"operands need rank >= 2, got shapes {jnp.shape(x)} and {jnp.shape(y)}")
    if adj_x:
        x = jnp.swapaxes(x, -1, -2)
    if adj_y:
        y = jnp.swapaxes(y, -1, -2)
    if jnp.shape(x)[-1] != jnp.shape(y)[-2]:
        raise ValueError(f"contracted dims differ: {jnp.shape(x)} @ {jnp.shape(y)}")
    return jnp.matmul(x, y)


@register("BATCH_MATMUL")
def batch_matmul(ctx: OpContext, x: Any, y: Any) -> jax.Array:
    """x @ y over the last two dims (adj_x / adj_y transpose them); batch dims broadcast."""
    o = ctx.options
    return _batch_matmul(x, y, bool(o.adjoint_lhs), bool(o.adjoint_rhs))


def parse_flex_options(data: bytes | None) -> dict[str, Any]:
    """Custom options stored as a FlexBuffer map (empty dict when there are none)."""
    if not data:
        return {}
    from flatbuffers import flexbuffers

    try:
        value = flexbuffers.Loads(bytes(data))
    except Exception as e:  # malformed bytes
        raise ValueError(f"custom options are not a FlexBuffer map: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"custom options are a FlexBuffer {type(value).__name__}, not a map")
    return value


@register("CUSTOM:BatchMatMulV2")
def batch_matmul_v2(ctx: OpContext, x: Any, y: Any) -> jax.Array:
    """TensorFlow's BatchMatMulV2; adj_x / adj_y come from FlexBuffer custom options (default
    False)."""
    opts = parse_flex_options(ctx.op.custom_options)
    return _batch_matmul(x, y, bool(opts.get("adj_x", False)), bool(opts.get("adj_y", False)))

