"""Depthwise convolution as shifted slices times per-channel weights, summed ("shift").

No grouped convolution anywhere, forward or backward: XLA CPU's grouped convolution and
its gradient are the biggest performance trap of these models (benchmarks/README.md).
"""

from __future__ import annotations

import functools
import math

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero

from ..ops.conv import Geometry, out_sizes
from ._taps import tangent_sum, taps

#: Bytes of shifted slices one chunk of the weight-gradient scan may hold.
CHUNK_BYTES = 8 << 20


def shift_sum(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """sum_k slice_k(padded x) * wk[k] for x [N, *S, C], wk [K, C]: one elementwise fusion."""
    acc = None
    for k, t in enumerate(taps(x, g)):
        term = t * wk[k]
        acc = term if acc is None else acc + term
    return acc


def shift_sum_chunked(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """:func:`shift_sum` over batch chunks, rematerialized: transposed w.r.t. ``wk`` (the weight
    gradient) it becomes a loop whose steps reduce the slices of ``CHUNK_BYTES`` of input."""
    n = x.shape[0]
    out = out_sizes(x.shape[1:-1], g)
    per_image = math.prod(out) * x.shape[-1] * x.dtype.itemsize * math.prod(g.kernel)
    b = max([d for d in range(1, n + 1) if n % d == 0 and d * per_image <= CHUNK_BYTES] or [1])
    body = jax.checkpoint(lambda xc: shift_sum(xc, wk, g))
    if b == n:
        return body(x)
    y = lax.map(body, x.reshape(n // b, b, *x.shape[1:]))
    return y.reshape(n, *y.shape[2:])


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def channelwise(x: jax.Array, wk: jax.Array, g: Geometry) -> jax.Array:
    """Depthwise convolution with one weight per (tap, channel): x [N, *S, C], wk [K, C].

    The value is :func:`shift_sum`; the weight tangent is :func:`shift_sum_chunked`, so the
    weight gradient never materializes every shifted slice of the whole batch. All AD modes
    work.
    """
    return shift_sum(x, wk, g)


@functools.partial(channelwise.defjvp, symbolic_zeros=True)
def _channelwise_jvp(g: Geometry, primals: tuple, tangents: tuple) -> tuple:
    x, wk = primals
    tx, twk = tangents
    y = shift_sum(x, wk, g)
    terms = []
    if not isinstance(tx, SymbolicZero):
        terms.append(shift_sum(tx, wk, g))
    if not isinstance(twk, SymbolicZero):
        terms.append(shift_sum_chunked(x, twk, g))
    return y, tangent_sum(terms, y)
