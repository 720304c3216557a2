"""What a backward rule sees, and the fused activations' backward every weighted rule shares.

A rule is a function ``rule(b: Backward) -> {input position: cotangent tensor}``: it emits
the builtin operators of its operator's vector-Jacobian product and returns the
cotangents of the inputs ``b.wanted`` names (it may return more; only wanted ones are used).
A rule's optional ``refuse(b)`` names what of the operator it cannot differentiate (None:
it can), before anything is emitted. An operator of several outputs (SPLIT) has a rule
marked ``many_outputs``: it reads each output's cotangent with ``b.cotangent(k)``, zeros
for an output the loss does not read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...graph import ir
from .emit import Emitter, Shape


@dataclass(frozen=True)
class Backward:
    """One operator's backward: ``grad`` is the cotangent tensor of its output 0;
    ``grads`` that of each output (None: the output gets none), for many-output rules."""

    e: Emitter
    op: ir.Operator
    grad: int
    wanted: frozenset[int]
    grads: tuple[int | None, ...] = ()

    def cotangent(self, k: int) -> int:
        """The cotangent of output ``k``: zeros where the output gets none."""
        grads = self.grads or (self.grad,)
        g = grads[k] if k < len(grads) else None
        if g is None:
            out = self.op.outputs[k]
            return self.e.const(np.zeros(self.e.shape(out), np.float32))
        return g

    def x(self, pos: int) -> int:
        """The tensor index of input ``pos``."""
        return self.op.inputs[pos]

    def shape(self, pos: int) -> Shape:
        return self.e.shape(self.op.inputs[pos])

    @property
    def y(self) -> int:
        """The tensor index of output 0."""
        return self.op.outputs[0]

    def has(self, pos: int) -> bool:
        """Whether input ``pos`` is present (an optional input may be -1 or missing)."""
        return pos < len(self.op.inputs) and self.op.inputs[pos] >= 0


Cotangents = dict[int, int]


@dataclass(frozen=True)
class Rule:
    """A backward rule, optionally what it refuses (None: it takes every option), and
    whether it takes operators of several outputs."""

    backward: Callable[[Backward], Cotangents]
    refuse: Callable[[Backward], str | None] | None = None
    many_outputs: bool = False


#: The clamp range of each fused activation LiteRT's float kernels apply (TANH and SIGN_BIT
#: leave the value unchanged there, see `circle_jax.ops.common.fused_activation`).
CLAMPS: dict[int, tuple[float | None, float | None]] = {
    ir.ACT_RELU: (0.0, None), ir.ACT_RELU6: (0.0, 6.0), ir.ACT_RELU_N1_TO_1: (-1.0, 1.0)}


def clamp_backward(e: Emitter, y: int, g: int, lo: float | None, hi: float | None) -> int:
    """The cotangent before a clamp to [lo, hi] from its output ``y``: ``g`` where
    ``lo < y < hi`` strictly, else 0 (TF's rule: no gradient at the kinks)."""
    if lo is not None:
        g = e.mul(g, e.mask("GREATER", y, e.scalar(lo)))
    if hi is not None:
        g = e.mul(g, e.mask("LESS", y, e.scalar(hi)))
    return g


def activation_backward(b: Backward) -> int:
    """The cotangent before the operator's fused activation (its output's otherwise)."""
    code = b.op.options.fused_activation_function
    if code in CLAMPS:
        return clamp_backward(b.e, b.y, b.grad, *CLAMPS[code])
    return b.grad
