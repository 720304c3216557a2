"""Convolutions and matrix products: FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
CONV_3D, BATCH_MATMUL, and the custom ops ``Convolution2DTransposeBias`` (MediaPipe) and
``BatchMatMulV2`` (TensorFlow).

The reference definitions: plain ``lax.conv_general_dilated`` / ``jnp.matmul``. The faster
lowerings of the same operators are in ``circle_jax/lowering`` and reuse the static geometry
computed here (:func:`spatial_geometry`, :func:`transpose_geometry`, :func:`dense_rows`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..graph import ir
from .common import check_float_input, check_padding, fused_activation, padding_pairs, positive
from .common import static as static_value
from .registry import OpContext, register


@dataclass(frozen=True)
class Geometry:
    """The static geometry of a convolution: per spatial dim its stride, dilation and
    (before, after) padding, and the filter's spatial size."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]


def out_sizes(sizes: Sequence[int], g: Geometry) -> tuple[int, ...]:
    """The output's spatial size; a ValueError when the kernel does not fit."""
    out = []
    for n, k, s, d, (lo, hi) in zip(sizes, g.kernel, g.strides, g.dilations, g.pads,
                                    strict=True):
        m = (n + lo + hi - (k - 1) * d - 1) // s + 1
        if m <= 0:
            raise ValueError(
                f"the kernel ({k}, dilation {d}) is larger than the padded input ({n + lo + hi})"
            )
        out.append(m)
    return tuple(out)


def dimension_numbers(nd: int) -> tuple[str, str, str]:
    """Channels-last layouts of an ``nd``-d convolution: input, filter [*K, I, O], output."""
    sp = "DHW"[-nd:]
    return f"N{sp}C", f"{sp}IO", f"N{sp}C"


def conv(x: jax.Array, w: jax.Array, g: Geometry) -> jax.Array:
    """x [N, *S, C_in] convolved with w [*K, C_in/groups, C_out]; groups = C_in / w.shape[-2]."""
    out_sizes(x.shape[1:-1], g)
    return lax.conv_general_dilated(
        x, w, g.strides, g.pads, rhs_dilation=g.dilations,
        dimension_numbers=dimension_numbers(x.ndim - 2), feature_group_count=x.shape[-1] //
        w.shape[-2])


def bias_act(y: jax.Array, b: Any, act: int | None) -> jax.Array:
    """Add the bias, then the fused activation (a clamp, as in LiteRT's conv kernels: TANH and
    SIGN_BIT leave the output unchanged, checked against LiteRT in the tests)."""
    if b is not None:
        if jnp.ndim(b) == 1 and b.shape[0] == y.shape[-1] and b.dtype == y.dtype:
            # in `jax.lax`: ``jnp``'s ``+`` is a jitted call, traced again per layer
            y = lax.add(y, lax.broadcast_in_dim(b, y.shape, (y.ndim - 1,)))
        else:
            y = y + b
    return fused_activation(y, act)


def _ints(*values: Any, default: int = 1) -> tuple[int, ...]:
    """Option values as ints; an absent (None) or zero value reads as ``default``."""
    return tuple(int(v) if v else default for v in values)


def _strides_dilations(o: ir.Options, nd: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    dims = "dhw"[-nd:]
    return (_ints(*(o.get(f"stride_{d}") for d in dims)),
            _ints(*(o.get(f"dilation_{d}_factor") for d in dims)))


#: The filter layout of each spatial convolution and its spatial rank.
_FILTERS = {"CONV_2D": ("[O, H, W, I]", 2), "DEPTHWISE_CONV_2D": ("[1, H, W, C*M]", 2),
            "CONV_3D": ("[D, H, W, I, O]", 3)}


def spatial_geometry(ctx: OpContext, x: Any, w: Any) -> tuple[jax.Array, Geometry]:
    """The filter as [*K, C_in/groups, C_out] and the convolution's geometry.

    CONV_2D's filter [O, H, W, I] has groups = C_in / I; DEPTHWISE_CONV_2D's [1, H, W, C*M]
    gives output channel c*M + m = input channel c times filter c*M + m; CONV_3D's filter is
    [D, H, W, I, O].
    """
    key, o = ctx.op.key, ctx.options
    nd = _FILTERS[key][1]
    if x.ndim != nd + 2:
        raise ValueError(f"input must have rank {nd + 2}, got shape {tuple(x.shape)}")
    shape = tuple(jnp.shape(w))
    if key == "CONV_2D":
        w = jnp.transpose(w, (1, 2, 3, 0))
    elif key == "DEPTHWISE_CONV_2D":
        if shape[3] % x.shape[-1]:
            raise ValueError(f"filter channels {shape[3]} are not a multiple of input channels "
                             f"{x.shape[-1]}")
        w = jnp.reshape(w, (shape[1], shape[2], 1, shape[3]))
    cg, c_out = w.shape[-2], w.shape[-1]
    if x.shape[-1] % cg or c_out % (x.shape[-1] // cg):
        raise ValueError(f"input channels {x.shape[-1]} and output channels {c_out} are not a "
                         f"multiple of the filter's {cg} input channels per group")
    strides, dilations = _strides_dilations(o, nd)
    kernel = tuple(w.shape[:nd])
    pads = padding_pairs(o.padding or 0, tuple(x.shape[1:-1]), kernel, strides, dilations)
    return w, Geometry(kernel, strides, dilations, tuple(tuple(p) for p in pads))


def check_spatial(ctx: OpContext) -> None:
    """Load-time checks of CONV_2D / DEPTHWISE_CONV_2D / CONV_3D: float filter of the right
    rank, a known padding, non-negative strides and dilations, a consistent multiplier."""
    key, o = ctx.op.key, ctx.options
    layout, nd = _FILTERS[key]
    check_float_input(ctx, 1, f"{key} filter")
    check_padding(o.padding)
    positive({k: v for k, v in o.items() if k.startswith(("stride", "dilation"))})
    w = ctx.inputs[1]
    if w is None:
        return
    if len(w.shape) != nd + 2 or (key == "DEPTHWISE_CONV_2D" and w.shape[0] != 1):
        raise ValueError(f"filter must be {layout}, got shape {w.shape}")
    x = ctx.inputs[0]
    if key == "DEPTHWISE_CONV_2D" and o.depth_multiplier and x is not None and x.shape:
        if o.depth_multiplier * x.shape[-1] != w.shape[3]:
            raise ValueError(f"depth_multiplier {o.depth_multiplier} x input channels "
                             f"{x.shape[-1]} != filter channels {w.shape[3]}")


@register("CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", check=check_spatial)
def spatial_conv(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """Channels-last convolution (see :func:`spatial_geometry` for the filter layouts), plus
    bias and fused activation."""
    w, g = spatial_geometry(ctx, x, w)
    return bias_act(conv(x, w, g), b, ctx.options.fused_activation_function)


# ----------------------------------------------------------------------------- transpose conv


@dataclass(frozen=True)
class TransposeGeometry:
    """A transpose convolution's output size, strides and padding before, per spatial dim."""

    out: tuple[int, int]
    strides: tuple[int, int]
    before: tuple[int, int]


def transpose_conv_2d(x: jax.Array, w: jax.Array, g: TransposeGeometry) -> jax.Array:
    """Scatter form of a transpose convolution, x [N, H, W, I], filter w [O, kh, kw, I]:

    ``out[n, i*s - pad + f, o] += x[n, i, c] * w[o, f, c]`` (TFLite's definition), keeping only
    output positions inside ``g.out``: the stride-dilated input correlated with the spatially
    flipped filter. Returns [N, *g.out, O].
    """
    if x.shape[-1] != w.shape[3]:
        raise ValueError(f"input channels {x.shape[-1]} != filter input channels {w.shape[3]}")
    wf = jnp.flip(jnp.transpose(w, (1, 2, 3, 0)), (0, 1))  # [kh, kw, I, O]
    pads = []
    for k, p, n, m, s in zip(w.shape[1:3], g.before, x.shape[1:3], g.out, g.strides,
                             strict=True):
        lo = k - 1 - p
        pads.append((lo, max(m - ((n - 1) * s + 1) - lo + k - 1, 0)))
    y = lax.conv_general_dilated(x, wf, (1, 1), pads, lhs_dilation=g.strides,
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y[:, : g.out[0], : g.out[1], :]


# TfLitePadding of TFLite's C API (NOT the schema's Padding enum).
_TFLITE_PADDING_SAME, _TFLITE_PADDING_VALID = 1, 2


def parse_transpose_conv_bias_options(data: bytes | None) -> tuple[int, int, int]:
    """(padding, stride_w, stride_h) of MediaPipe's Convolution2DTransposeBias.

    MediaPipe's kernel reinterprets the custom options as a C ``TfLiteTransposeConvParams``,
    whose first members are ``TfLitePadding padding; int stride_width; int stride_height;``
    so the bytes are three little-endian int32: padding (1 = SAME, 2 = VALID: TfLitePadding,
    unlike the schema's enum), stride_width, stride_height. Later fields are ignored.
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


def transpose_geometry(ctx: OpContext, x: Any, w: Any, output_shape: Any = None
                       ) -> TransposeGeometry:
    """The geometry of TRANSPOSE_CONV (from its output_shape input: SAME padding is computed
    from the OUTPUT size, as TFLite does) or of Convolution2DTransposeBias (no output_shape:
    per spatial dim, with ``r = (in - 1) % stride``, SAME trims ``t = max(0, k - r - 1)``
    pixels, ``t // 2`` at the start, and the output size is ``stride * (in - 1) + k - t``)."""
    if x.ndim != 4:
        raise ValueError(f"input must be 4-d NHWC, got shape {tuple(x.shape)}")
    kernel = tuple(jnp.shape(w)[1:3])
    if ctx.op.key == "TRANSPOSE_CONV":
        o = ctx.options
        shape = [int(v) for v in static_value(output_shape, "output_shape").reshape(-1)]
        if len(shape) != 4:
            raise ValueError(f"output_shape must have 4 values, got {shape}")
        if shape[3] != jnp.shape(w)[0]:
            raise ValueError(f"output_shape channels {shape[3]} != filter outputs "
                             f"{jnp.shape(w)[0]}")
        strides = _ints(o.stride_h, o.stride_w)
        for out, n, k, st in zip(shape[1:3], x.shape[1:3], kernel, strides, strict=True):
            if not 1 <= out <= n * st + k:
                raise ValueError(f"output_shape {shape} does not fit the input "
                                 f"{list(x.shape)}: each spatial size must be 1..in*stride+kernel")
        pads = padding_pairs(o.padding or 0, tuple(shape[1:3]), kernel, strides)
        return TransposeGeometry(tuple(shape[1:3]), strides, tuple(p[0] for p in pads))
    padding, sw, sh = parse_transpose_conv_bias_options(ctx.op.custom_options)
    out, before = [], []
    for n, k, s in zip(x.shape[1:3], kernel, (sh, sw), strict=True):
        trim = max(0, k - (n - 1) % s - 1) if padding == _TFLITE_PADDING_SAME else 0
        out.append(s * (n - 1) + k - trim)
        before.append(trim // 2)
    return TransposeGeometry(tuple(out), (sh, sw), tuple(before))


def check_transpose(ctx: OpContext) -> None:
    """Load-time checks of the transpose convolutions: a float filter [O, H, W, I], valid
    padding and strides (custom options of Convolution2DTransposeBias)."""
    key = ctx.op.key
    check_float_input(ctx, 1, f"{key} filter")  # the filter is input 1 of both
    w = ctx.inputs[1]
    if w is not None and len(w.shape) != 4:
        raise ValueError(f"filter must be [O, H, W, I], got shape {w.shape}")
    if key == "TRANSPOSE_CONV":
        check_padding(ctx.options.padding)
        positive({k: v for k, v in ctx.options.items() if k.startswith("stride")})
    else:
        parse_transpose_conv_bias_options(ctx.op.custom_options)


@register("TRANSPOSE_CONV", check=check_transpose)
def transpose_conv(ctx: OpContext, output_shape: Any, w: Any, x: Any, b: Any = None) -> jax.Array:
    """Inputs (output_shape, filter [O, H, W, I], input, bias?); the gradient of CONV_2D.

    The batch size is taken from the input, so a model can run at another batch size than
    its output_shape says.
    """
    g = transpose_geometry(ctx, x, w, output_shape)
    return bias_act(transpose_conv_2d(x, w, g), b, ctx.options.fused_activation_function)


@register("CUSTOM:Convolution2DTransposeBias", check=check_transpose)
def convolution_2d_transpose_bias(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """MediaPipe's transpose convolution + bias: inputs (input, filter [O, H, W, I], bias)."""
    return bias_act(transpose_conv_2d(x, w, transpose_geometry(ctx, x, w)), b, None)


# ----------------------------------------------------------------------------- matmuls


def dense_rows(ctx: OpContext, x: Any, w: Any) -> jax.Array:
    """FULLY_CONNECTED's input as rows of ``in`` values: flattened to [-1, in] unless
    keep_num_dims."""
    n_in = jnp.shape(w)[1]
    if ctx.options.keep_num_dims:
        if x.shape[-1] != n_in:
            raise ValueError(f"keep_num_dims: input's last dim {x.shape[-1]} != weights' {n_in}")
        return x
    size = math.prod(x.shape)
    if size % n_in:
        raise ValueError(f"input of {size} elements cannot be split into rows of {n_in}")
    return jnp.reshape(x, (size // n_in, n_in))


def check_fully_connected(ctx: OpContext) -> None:
    """Load-time checks of FULLY_CONNECTED: float weights [out, in], weights_format DEFAULT,
    a fused activation LiteRT supports there."""
    o = ctx.options
    check_float_input(ctx, 1, "FULLY_CONNECTED weights")
    if o.weights_format:
        raise NotImplementedError(
            f"FULLY_CONNECTED weights_format {o.weights_format} (shuffled int8) is not "
            "supported, only DEFAULT")
    if o.fused_activation_function in (ir.ACT_TANH, ir.ACT_SIGN_BIT):
        raise NotImplementedError(
            "FULLY_CONNECTED supports fused activations NONE, RELU, RELU_N1_TO_1 and RELU6 "
            "(LiteRT rejects TANH and SIGN_BIT too)")
    w = ctx.inputs[1]
    if w is not None and len(w.shape) != 2:
        raise ValueError(f"weights must be [out, in], got shape {w.shape}")


@register("FULLY_CONNECTED", check=check_fully_connected)
def fully_connected(ctx: OpContext, x: Any, w: Any, b: Any = None) -> jax.Array:
    """y = x @ w.T + b with w [out, in] (see :func:`dense_rows` for the input's shape)."""
    y = jnp.matmul(dense_rows(ctx, x, w), jnp.transpose(w))
    return bias_act(y, b, ctx.options.fused_activation_function)


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


@register("CUSTOM:BatchMatMulV2", check=lambda ctx: parse_flex_options(ctx.op.custom_options))
def batch_matmul_v2(ctx: OpContext, x: Any, y: Any) -> jax.Array:
    """TensorFlow's BatchMatMulV2; adj_x / adj_y come from FlexBuffer custom options (default
    False)."""
    opts = parse_flex_options(ctx.op.custom_options)
    return _batch_matmul(x, y, bool(opts.get("adj_x", False)), bool(opts.get("adj_y", False)))

