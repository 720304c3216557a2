"""The optimizer's update as builtin operators, in circle-jax's numerics
(`circle_jax.optim`).

- SGD: ``w -= lr * g``.
- momentum (SGD with momentum ``mu``, optax's ``trace`` as `circle_jax.optim.sgd` takes
  it), one slot ``m`` per weight: ``m = g + mu * m``, ``w -= lr * m``; Nesterov's steps
  along ``g + mu * m`` (the new ``m``) instead.
- Adam, with ``t`` the updates made so far plus one and slots ``m``, ``v`` per weight and
  one int32 step count:

  - eps placement ``tf`` (TF, Keras, onert; `circle_jax.optim.adam_tf`):
    ``m += (g - m)(1 - b1)``, ``v += (g*g - v)(1 - b2)``,
    ``w -= lr sqrt(1 - b2**t) / (1 - b1**t) * m / (sqrt(v) + eps)``;
  - ``optax``: ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g*g``,
    ``w -= lr * m_hat / (sqrt(v_hat) + eps)``, ``m_hat = m / (1 - b1**t)`` (so ``v_hat``);
  - ``onert_micro``: as ``optax`` with ``sqrt(v_hat + eps)``.

``grad_scale`` multiplies the gradient first (onert-micro's Adam takes the batch's sum of
per-sample gradients: the batch size).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .emit import Emitter

OPTIMIZERS = ("sgd", "momentum", "adam")
PLACEMENTS = ("tf", "optax", "onert_micro")


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer and its hyperparameters."""

    name: str
    learning_rate: float
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-7
    eps_placement: str = "tf"
    grad_scale: float = 1.0
    momentum: float = 0.9
    nesterov: bool = False

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}: expected one of "
                             f"{', '.join(OPTIMIZERS)}")
        if self.eps_placement not in PLACEMENTS:
            raise ValueError(f"unknown eps placement {self.eps_placement!r}: expected one of "
                             f"{', '.join(PLACEMENTS)}")

    def slots(self, weights: list[tuple[str, np.ndarray]]) -> list[tuple[str, np.ndarray]]:
        """The optimizer's state after the weights, with initial values: Adam's ``m`` of
        every weight, then its ``v``, then the step count; momentum's ``m`` of every
        weight."""
        if self.name == "sgd":
            return []
        if self.name == "momentum":
            return [(f"{n}/momentum", np.zeros_like(w)) for n, w in weights]
        return ([(f"{n}/m", np.zeros_like(w)) for n, w in weights]
                + [(f"{n}/v", np.zeros_like(w)) for n, w in weights]
                + [("adam/step", np.zeros((), np.int32))])


def emit_update(e: Emitter, spec: OptimizerSpec, weights: list[int], grads: list[int],
                slots: list[int]) -> tuple[list[int], list[int]]:
    """(new weights, new slots) emitted from the weights, their gradients and the slots
    (in `OptimizerSpec.slots`' order)."""
    grads = [e.scale(g, spec.grad_scale) for g in grads]
    lr = e.scalar(spec.learning_rate)
    if spec.name == "sgd":
        return [e.sub(w, e.mul(g, lr)) for w, g in zip(weights, grads)], []
    if spec.name == "momentum":
        new_w, new_m = [], []
        for w, g, m in zip(weights, grads, slots):
            m2 = e.add(g, e.scale(m, spec.momentum))
            step = e.add(g, e.scale(m2, spec.momentum)) if spec.nesterov else m2
            new_w.append(e.sub(w, e.mul(step, lr)))
            new_m.append(m2)
        return new_w, new_m
    n = len(weights)
    ms, vs, count = slots[:n], slots[n:2 * n], slots[2 * n]
    new_count = e.binary("ADD", count, e.const(1, "int32"), dtype="int32")
    one = e.scalar(1.0)
    t = e.add(e.op("CAST", [count], ()), one)  # float(new_count) below 2**24
    fix1 = e.sub(one, e.binary("POW", e.scalar(spec.b1), t))  # 1 - b1**t
    fix2 = e.sub(one, e.binary("POW", e.scalar(spec.b2), t))
    new_w, new_m, new_v = [], [], []
    if spec.eps_placement == "tf":
        alpha = e.div(e.mul(lr, e.unary("SQRT", fix2)), fix1)
        for w, g, m, v in zip(weights, grads, ms, vs):
            m2 = e.add(m, e.scale(e.sub(g, m), 1 - np.float32(spec.b1)))
            v2 = e.add(v, e.scale(e.sub(e.mul(g, g), v), 1 - np.float32(spec.b2)))
            step = e.div(e.mul(alpha, m2), e.add(e.unary("SQRT", v2), e.scalar(spec.eps)))
            new_w.append(e.sub(w, step))
            new_m.append(m2)
            new_v.append(v2)
        return new_w, [*new_m, *new_v, new_count]
    inner, outer = (0.0, spec.eps) if spec.eps_placement == "optax" else (spec.eps, 0.0)
    for w, g, m, v in zip(weights, grads, ms, vs):
        m2 = e.add(e.scale(g, 1 - spec.b1), e.scale(m, spec.b1))
        v2 = e.add(e.scale(e.mul(g, g), 1 - spec.b2), e.scale(v, spec.b2))
        m_hat, v_hat = e.div(m2, fix1), e.div(v2, fix2)
        if inner:
            v_hat = e.add(v_hat, e.scalar(inner))
        root = e.unary("SQRT", v_hat)
        if outer:
            root = e.add(root, e.scalar(outer))
        new_w.append(e.sub(w, e.mul(lr, e.div(m_hat, root))))
        new_m.append(m2)
        new_v.append(v2)
    return new_w, [*new_m, *new_v, new_count]

