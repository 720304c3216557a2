"""What a backward rule sees, and the fused activations' backward every weighted rule shares.

A rule is a function ``rule(b: Backward) -> {input position: cotangent tensor}``: it emits
the builtin operators of its operator's vector-Jacobian product and returns the
cotangents of the inputs ``b.wanted`` names (it may return more; only wanted ones are used).
A rule's optional ``refuse(b)`` names what of the operator it cannot differentiate (None:
it can), before anything is emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...graph import ir
from .emit import Emitter, Shape


@dataclass(frozen=True)
class Backward:
    """One operator's backward: ``grad`` is the cotangent tensor of its output 0."""

    e: Emitter
    op: ir.Operator
    grad: int
    wanted: frozenset[int]

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
    """A backward rule and, optionally, what it refuses (None: it takes every option)."""

    backward: Callable[[Backward], Cotangents]
    refuse: Callable[[Backward], str | None] | None = None


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
