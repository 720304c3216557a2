"""Host-side diagnosis of a step whose gradients are not finite: which tensor turns
non-finite first, and at which operator.

Nothing here runs in the compiled epochs: `fit` calls `first_non_finite` at a logging point,
only when the loss scale can no longer back off and steps are still being skipped. It
re-runs the training step's forward and backward (same precision policy, lowering, loss and
loss scale) with a zero tap on every computed tensor
(`circle_jax.lowering.interpreter.Lowered.tensors`), so that one gradient gives every
tensor's cotangent, and reads where non-finite values start, in the order the step
computes them: the forward in operator order, then the loss, then the backward from the
last operator to the first (an operator's output gradient, then the weight gradients its
backward produces).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..lowering.interpreter import Lowered
from .trainer import Trainer


@dataclass(frozen=True)
class NonFinite:
    """The first non-finite value of a training step.

    Attributes:
      what: "forward" (a computed tensor), "loss", "gradient" (a tensor's gradient) or
        "weight gradient".
      tensor: the tensor's (or weight's) name; "loss" for the loss.
      operator: the index of the operator that computes the tensor (forward, gradient) or
        reads the weight (weight gradient, its last reader); None for the loss.
      op_type: that operator's type, e.g. "SOFTMAX".
      loss_scale: the loss scale the step ran at.
    """

    what: str
    tensor: str
    operator: int | None
    op_type: str | None
    loss_scale: float

    def __str__(self) -> str:
        where = "" if self.operator is None else f" (operator {self.operator}, {self.op_type})"
        name = "the loss" if self.what == "loss" else f"the {self.what} of {self.tensor!r}"
        return f"{name}{where} is the first non-finite value at loss scale {self.loss_scale:g}"


def first_non_finite(trainer: Trainer, params: dict, frozen: dict, x: Sequence[Any],
                     y: Any, loss_scale: float, max_batches: int = 16) -> NonFinite | None:
    """The first non-finite value of the training step on the first of the batches of
    (``x``, ``y``) (in order, at most ``max_batches``) whose step has one, at ``loss_scale``;
    None when every such step is finite. ``params``: the trainable masters (``state.params``);
    one compiled program, run batch by batch."""
    flags = jax.jit(functools.partial(_finite_flags, trainer, _lowered(trainer)))
    b = trainer.config.batch_size
    n = int(np.shape(y)[0])
    scale = jnp.float32(loss_scale)
    for start in range(0, min(n - b, (max_batches - 1) * b) + 1, b):
        batch = (tuple(a[start:start + b] for a in x), y[start:start + b])
        found = _first(trainer, *jax.device_get(flags(params, frozen, batch, scale)),
                       loss_scale)
        if found is not None:
            return found
    return None


def _lowered(trainer: Trainer) -> Lowered:
    """The model's lowering as the trainer's forward sees it (its lowering changes): a view
    (`Model.view`), nothing lowered again."""
    return trainer.model.view(**trainer.lowering_changes)


def _finite_flags(trainer: Trainer, lowered: Lowered, trainable: dict, frozen: dict,
                  batch: tuple, scale: jax.Array) -> tuple[dict, jax.Array, dict, dict]:
    """(forward tensor -> all finite, loss finite, tensor -> gradient all finite, weight ->
    gradient all finite) for one step at loss scale ``scale``."""
    p = trainer.policy
    x, y = batch
    inputs = p.cast_to_compute(tuple(x))

    def params_of(tr: dict) -> dict:
        return trainer.forward_params(tr, frozen)

    _, env = lowered.tensors(params_of(trainable), *inputs)
    computed = {i: v for i, v in env.items()
                if i not in lowered.model.main.inputs and jnp.issubdtype(v.dtype, jnp.floating)}

    def loss(taps: dict, tr: dict) -> jax.Array:
        outs, tensors = lowered.tensors(params_of(tr), *inputs, taps=taps)
        if trainer.numerics.logits_of is not None:
            index, beta = trainer.numerics.logits_of
            out = tensors[index] * beta
        else:
            out = outs[trainer.loss_output]
        value = trainer.loss_fn(p.cast_to_output(out).astype(trainer.loss_dtype), y)
        return value * scale.astype(value.dtype)

    taps = {i: jnp.zeros_like(v) for i, v in computed.items()}
    value, (g_taps, g_params) = jax.value_and_grad(loss, argnums=(0, 1))(taps, trainable)
    finite = functools.partial(jax.tree.map, lambda a: jnp.all(jnp.isfinite(a)))
    return finite(computed), jnp.isfinite(value), finite(g_taps), finite(g_params)


def _first(trainer: Trainer, forward: dict, loss: bool, grads: dict, weights: dict,
           scale: float) -> NonFinite | None:
    """The first False of the flags, in the order the step computes them."""
    sg = trainer.model.ir.main
    for op in sg.operators:
        for i in op.outputs:
            if not forward.get(i, True):
                return NonFinite("forward", sg.tensors[i].name, op.index, op.key, scale)
    if not loss:
        return NonFinite("loss", "loss", None, None, scale)
    readers = trainer.model.param_operators()
    for op in reversed(sg.operators):
        for i in op.outputs:
            if not grads.get(i, True):
                return NonFinite("gradient", sg.tensors[i].name, op.index, op.key, scale)
        for name, ok in weights.items():
            if not ok and max(readers.get(name) or [-1]) == op.index:
                return NonFinite("weight gradient", name, op.index, op.key, scale)
    bad = next((name for name, ok in weights.items() if not ok), None)
    return None if bad is None else NonFinite("weight gradient", bad, None, None, scale)
