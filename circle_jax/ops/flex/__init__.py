"""TensorFlow's Flex operators of on-device training files, as kernels of TF's semantics.

A Flex op is a CUSTOM operator, custom_code ``"Flex" + TF op name``; its attributes come from
its NodeDef (:func:`circle_jax.ops.flex.nodedef.attributes`). ``FLEX_KERNELS[name](attrs,
*inputs)`` runs TF op ``name`` (see :mod:`.registry` for the calling convention);
``FLEX_OPS[name]`` tells which inputs must be static and whether the kernel is a host one
(Save/Restore). One module per family: :mod:`.activation_grads`, :mod:`.pooling_grads`,
:mod:`.conv_grads`, :mod:`.losses`, :mod:`.shape_ops`, :mod:`.checkpoint_ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..registry import OpContext, register
from . import (  # noqa: F401  (the families register their kernels)
    activation_grads,
    checkpoint_ops,
    conv_grads,
    losses,
    pooling_grads,
    shape_ops,
)
from .nodedef import attributes
from .registry import KERNELS as FLEX_OPS
from .registry import FlexKernel

FLEX_KERNELS: dict[str, Callable] = {name: k.fn for name, k in sorted(FLEX_OPS.items())}
"""TF op name -> ``kernel(attrs, *inputs) -> output(s)``."""


def _operator(kernel: FlexKernel) -> Callable:
    """The operator implementation (``fn(ctx, *inputs)``) of a Flex kernel: its attributes
    decoded from the operator's NodeDef."""
    def run(ctx: OpContext, *inputs: object) -> object:
        _, attrs = attributes(ctx.op.custom_options or b"", ctx.op.custom_code)
        return kernel.fn(attrs, *inputs)

    return run


for _name, _kernel in sorted(FLEX_OPS.items()):  # each runs as the CUSTOM operator Flex<name>
    register(f"CUSTOM:Flex{_name}", fold=not _kernel.host)(_operator(_kernel))


def flex_op_name(custom_code: str) -> str | None:
    """The TF op name of a Flex custom_code (``"FlexReluGrad"`` -> ``"ReluGrad"``), else None."""
    return custom_code[4:] if custom_code.startswith("Flex") and len(custom_code) > 4 else None


def unknown_flex_ops(names: Iterable[str]) -> list[str]:
    """The names without a kernel, sorted, each once; a name may be a TF op name or a Flex
    custom_code (``"FlexReluGrad"``)."""
    return sorted({name for name in names if (flex_op_name(name) or name) not in FLEX_OPS})

__all__ = ["FLEX_KERNELS", "FLEX_OPS", "FlexKernel", "flex_op_name", "unknown_flex_ops"]
