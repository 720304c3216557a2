"""Recurrent layers: UNIDIRECTIONAL_SEQUENCE_LSTM (TFLite, float) and Circle's GRU.

Both run their time loop as ``lax.scan`` with the input projections of every time step computed
up front in one matmul, so only the recurrent matmul sits inside the loop.

State inputs are TFLite *variable* tensors: their value at the start of a run is their buffer
(zeros when they have none, or when the lowering hands over ``None``); the updated states are
not returned, because a pure ``apply`` has no place to keep them between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from ..graph import ir
from .common import activation_function, clip_tf
from .registry import OpContext, register

# UNIDIRECTIONAL_SEQUENCE_LSTM input positions (TFLite's lstm_shared.h numbering).
_X_W = slice(1, 5)  # input-to-{input, forget, cell, output} weights [n_cell, n_input]
_H_W = slice(5, 9)  # recurrent-to-gate weights [n_cell, n_output] (or [n_cell] if diagonal)
_PEEPHOLE = (9, 10, None, 11)  # cell-to-{input, forget, -, output} weights [n_cell]
_BIAS = slice(12, 16)
_PROJ_W, _PROJ_B = 16, 17
_OUTPUT_STATE, _CELL_STATE = 18, 19
_LAYER_NORM = slice(20, 24)
_LSTM_INPUTS = 24

# TFLite's MeanStddevNormalization uses this in place of a zero variance.
_LAYER_NORM_EPS = 1e-8


def _mean_stddev_normalize(v: jax.Array) -> jax.Array:
    """(v - mean) / stddev over the last axis, as TFLite's layer-norm LSTM (1e-8 if var == 0)."""
    mean = jnp.mean(v, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(v), axis=-1, keepdims=True) - jnp.square(mean)
    safe = jnp.where(var > 0, var, _LAYER_NORM_EPS)
    return (v - mean) * lax.rsqrt(safe)


def _require_float(ctx: OpContext, positions: Sequence[int], what: str) -> None:
    for i in positions:
        t = ctx.inputs[i] if i < len(ctx.inputs) else None
        if t is not None and not t.is_float:
            raise NotImplementedError(
                f"{what} with {t.dtype} tensor {t.name!r} (quantized / hybrid kernels) is not "
                "supported; only float models are"
            )


def _initial_state(state: Any, batch: int, size: int, dtype: Any) -> jax.Array:
    if state is None:
        return jnp.zeros((batch, size), dtype)
    return jnp.broadcast_to(jnp.asarray(state, dtype), (batch, size))


def _time_major(x: Any, time_major: bool, what: str) -> jax.Array:
    if jnp.ndim(x) != 3:
        raise ValueError(f"{what} input must have rank 3, got shape {list(jnp.shape(x))}")
    return x if time_major else jnp.swapaxes(x, 0, 1)


@register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(ctx: OpContext, x: Any, *args: Any) -> jax.Array:
    """TFLite's float LSTM over a sequence (gate order input, forget, cell, output).

    Supports CIFG (no input gate: i = 1 - f), peepholes, layer normalization (gate bias added
    after normalizing), projection with proj_clip, cell_clip, diagonal recurrent weights and
    time_major; the cell and output activations are fused_activation_function.
    """
    o = ctx.options
    ins = list(args) + [None] * (_LSTM_INPUTS - 1 - len(args))
    ins.insert(0, x)
    _require_float(ctx, range(1, len(ctx.inputs)), "UNIDIRECTIONAL_SEQUENCE_LSTM")
    if len(ctx.outputs) != 1:
        raise NotImplementedError("UNIDIRECTIONAL_SEQUENCE_LSTM with more than one output")
    xs = _time_major(jnp.asarray(x), bool(o.time_major), "UNIDIRECTIONAL_SEQUENCE_LSTM")
    dtype = xs.dtype
    cifg = ins[1] is None
    gates = [g for g in range(4) if not (cifg and g == 0)]  # 0 i, 1 f, 2 c, 3 o
    w_x = [jnp.asarray(ins[_X_W][g], dtype) for g in gates]
    w_h = [jnp.asarray(ins[_H_W][g], dtype) for g in gates]
    # Per gate id (0 i, 1 f, 2 c, 3 o): bias, layer-norm coefficients, peephole weights.
    bias = {g: ins[_BIAS][g] for g in gates}
    norm = {g: ins[_LAYER_NORM][g] for g in gates}
    peep = {g: None if _PEEPHOLE[g] is None else ins[_PEEPHOLE[g]] for g in gates}
    n_cell = w_x[0].shape[0]
    proj_w, proj_b = ins[_PROJ_W], ins[_PROJ_B]
    n_out = n_cell if proj_w is None else jnp.shape(proj_w)[0]
    batch = xs.shape[1]
    h0 = _initial_state(ins[_OUTPUT_STATE], batch, n_out, dtype)
    c0 = _initial_state(ins[_CELL_STATE], batch, n_cell, dtype)
    act = o.fused_activation_function
    diagonal = bool(o.diagonal_recurrent_tensors)

    # Input projections of all time steps at once; biases join here unless layer norm moves
    # them after the normalization.
    x_proj = jnp.einsum("tbi,gi->tbg", xs, jnp.concatenate(w_x, axis=0))
    pre_bias = [bias[g] if norm[g] is None else None for g in gates]
    if any(b is not None for b in pre_bias):
        x_proj = x_proj + jnp.concatenate(
            [jnp.zeros((n_cell,), dtype) if b is None else jnp.asarray(b, dtype)
             for b in pre_bias])
    w_rec = None if diagonal else jnp.concatenate(w_h, axis=0)

    def gate(k: int, z: jax.Array, c: jax.Array, activation: Any) -> jax.Array:
        if peep[k] is not None:
            z = z + jnp.asarray(peep[k], dtype) * c
        if norm[k] is not None:
            z = _mean_stddev_normalize(z) * jnp.asarray(norm[k], dtype)
            if bias[k] is not None:
                z = z + jnp.asarray(bias[k], dtype)
        return activation(z)

    def step(carry: tuple[jax.Array, jax.Array], xp: jax.Array) -> tuple[Any, jax.Array]:
        h, c = carry
        if diagonal:
            rec = jnp.concatenate([h * jnp.asarray(w, dtype) for w in w_h], axis=-1)
        else:
            rec = h @ w_rec.T
        z = dict(zip(gates, jnp.split(xp + rec, len(gates), axis=-1)))
        f = gate(1, z[1], c, jax.nn.sigmoid)
        i = 1.0 - f if cifg else gate(0, z[0], c, jax.nn.sigmoid)
        g = gate(2, z[2], c, lambda v: activation_function(v, act))
        c_new = f * c + i * g
        if o.cell_clip and o.cell_clip > 0:
            c_new = clip_tf(c_new, -o.cell_clip, o.cell_clip)
        out_gate = gate(3, z[3], c_new, jax.nn.sigmoid)
        h_new = out_gate * activation_function(c_new, act)
        if proj_w is not None:
            h_new = h_new @ jnp.asarray(proj_w, dtype).T
            if proj_b is not None:
                h_new = h_new + jnp.asarray(proj_b, dtype)
            if o.proj_clip and o.proj_clip > 0:
                h_new = clip_tf(h_new, -o.proj_clip, o.proj_clip)
        return (h_new, c_new), h_new

    _, ys = lax.scan(step, (h0, c0), x_proj)
    return ys if o.time_major else jnp.swapaxes(ys, 0, 1)


@register("GRU")
def gru(
    ctx: OpContext, x: Any, w_x: Any, b_x: Any, w_h: Any, b_h: Any, state: Any = None
) -> jax.Array:
    """Circle's GRU (onert-micro's kernel): Keras' GRU with reset_after=True, gates z, r, n.

    Inputs: input [T, B, I] (time first, whatever time_major says: onert-micro always reads
    dim 0 as time, and luci's FuseGRU pass writes time-major data with time_major=false),
    ``hidden_hidden`` [3H, I] and its bias — despite the name, the weights applied to the
    INPUT —, ``hidden_input`` [3H, H] and its bias, applied to the hidden state, and the
    initial state [B, H]. Per step, with a = W_h h + b_h and b = W_x x + b_x split in thirds:
    z = sigmoid(a0 + b0), r = sigmoid(a1 + b1), n = tanh(b2 + r * a2),
    h = z * h + (1 - z) * n. The output is the last state [B, H], or every state [T, B, H]
    with return_sequences (onert-micro supports only the former).
    """
    o = ctx.options
    _require_float(ctx, range(1, len(ctx.inputs)), "GRU")
    if o.fused_activation_function not in (None, ir.ACT_NONE, ir.ACT_TANH):
        raise NotImplementedError(
            f"GRU with fused_activation_function {o.fused_activation_function} (the candidate "
            "activation is always tanh)"
        )
    xs = _time_major(jnp.asarray(x), True, "GRU")
    dtype = xs.dtype
    w_x, w_h = jnp.asarray(w_x, dtype), jnp.asarray(w_h, dtype)
    hidden = w_h.shape[-1]
    if w_x.shape[0] != 3 * hidden or w_h.shape[0] != 3 * hidden:
        raise ValueError(
            f"GRU weights {list(w_x.shape)} (input) and {list(w_h.shape)} (hidden) must both have "
            f"3 * {hidden} rows"
        )
    x_proj = jnp.einsum("tbi,gi->tbg", xs, w_x)
    if b_x is not None:
        x_proj = x_proj + jnp.asarray(b_x, dtype)
    b_h = None if b_h is None else jnp.asarray(b_h, dtype)

    def step(h: jax.Array, xp: jax.Array) -> tuple[jax.Array, jax.Array]:
        a = h @ w_h.T
        if b_h is not None:
            a = a + b_h
        a0, a1, a2 = jnp.split(a, 3, axis=-1)
        b0, b1, b2 = jnp.split(xp, 3, axis=-1)
        z = jax.nn.sigmoid(a0 + b0)
        r = jax.nn.sigmoid(a1 + b1)
        n = jnp.tanh(b2 + r * a2)
        h_new = z * h + (1.0 - z) * n
        return h_new, h_new

    h0 = _initial_state(state, xs.shape[1], hidden, dtype)
    last, seq = lax.scan(step, h0, x_proj)
    return seq if o.return_sequences else last
