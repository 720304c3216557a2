"""The Flex kernels' registry: TF op name -> ``kernel(attrs, *inputs) -> output(s)``.

``attrs`` is the op's NodeDef attr map as plain values (:func:`.nodedef.attributes`); the
inputs are in the TF op's order (the Flex operator's inputs). A kernel returns an array, or a
tuple for an op with several outputs. A kernel is a pure JAX function of its array inputs
except at its *static* positions (shape vectors such as Conv2DBackpropFilter's
``filter_sizes``), which must be known values (numpy, or concrete arrays) because they set
output shapes; a *host* kernel (Save, Restore) reads or writes files and runs outside
``jax.jit`` on numpy values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Kernel = Callable[..., Any]


@dataclass(frozen=True)
class FlexKernel:
    """A TF op's kernel and what its caller must know: which input positions must be
    static, and whether it is a host kernel (file I/O, not traceable)."""

    fn: Kernel
    static_inputs: frozenset[int] = frozenset()
    host: bool = False


KERNELS: dict[str, FlexKernel] = {}


def flex_kernel(*names: str, static_inputs: Sequence[int] = (),
                host: bool = False) -> Callable[[Kernel], Kernel]:
    """Register a kernel under TF op names (see the module's docstring)."""

    def decorate(fn: Kernel) -> Kernel:
        for name in names:
            if name in KERNELS:
                raise ValueError(f"Flex kernel {name} registered twice")
            KERNELS[name] = FlexKernel(fn, frozenset(static_inputs), host)
        return fn

    return decorate
