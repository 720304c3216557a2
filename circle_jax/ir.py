"""Moved to `circle_jax.graph.ir`; this module re-exports it for code written before the move
(``from circle_jax import ir`` keeps working). New code imports `circle_jax.graph.ir`."""

from .graph.ir import *  # noqa: F403
from .graph.ir import MAX_TENSOR_ELEMENTS, NEW_BUFFER, as_numpy_dtype  # noqa: F401
