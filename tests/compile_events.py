"""JAX's compile events inside a block, for tests that check what compiles when."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax

TRACE = "/jax/core/compile/jaxpr_trace_duration"
#: a program lowered to StableHLO: also when its compiled form comes from a cache
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE = "/jax/core/compile/backend_compile_duration"


class Event(NamedTuple):
    name: str  # one of the constants above, or another JAX duration event
    function: str  # the traced or lowered function, e.g. "jit(train_step)"; "" if unnamed


@contextlib.contextmanager
def compile_events() -> Iterator[list[Event]]:
    """The list of JAX's duration events as they happen inside the block (read it there or
    after)."""
    events: list[Event] = []

    def heard(event: str, seconds: float, fun_name: str = "", **_: Any) -> None:
        events.append(Event(event, fun_name))

    jax.monitoring.register_event_duration_secs_listener(heard)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(heard)


def lowered(events: list[Event]) -> list[str]:
    """The functions lowered in ``events``, in order."""
    return [e.function for e in events if e.name == LOWER]
