"""Control flow: IF, WHILE and STABLEHLO_COMPOSITE run other subgraphs of the model.

Branch and loop bodies are subgraphs lowered by ``ctx.run_subgraph``. Values known at lowering
time (numpy) stay static wherever the semantics allow it, so shape arithmetic inside bodies keeps
folding: static IF conditions pick their branch in Python, static operands are closed over
instead of being passed through ``lax.cond``, and static loop variables that a WHILE body passes
through unchanged are never carried.

Eagerly (concrete values) conditions are plain Python booleans, so IF runs one branch and WHILE
iterates in Python. Traced WHILE loops whose trip count follows from static values alone (the
usual ``i = 0; i < N; i += 1`` counter of converted RNNs) run as ``lax.scan`` over that count,
which is reverse-differentiable; loops whose condition depends on run-time values become
``lax.while_loop``, which JAX differentiates in forward mode only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..graph import ir
from .common import is_static
from .registry import OpContext, register

# Most iterations a WHILE loop with concrete values runs in Python before it is refused.
MAX_EAGER_TRIPS = 1_000_000

# Most loop iterations the static trip-count probe follows before giving up (each one traces
# the condition and body abstractly, at lowering time).
MAX_STATIC_TRIPS = 4096


def _split(args: Sequence[Any]) -> tuple[list[int], Callable[[Sequence[Any]], list[Any]]]:
    """Positions of run-time (traced) values, and a function putting them back among statics."""
    dynamic = [j for j, a in enumerate(args) if a is not None and not is_static(a)]

    def merge(values: Sequence[Any]) -> list[Any]:
        out = list(args)
        for j, v in zip(dynamic, values):
            out[j] = v
        return out

    return dynamic, merge


def _is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def _as_bool(cond: Any, what: str) -> Any:
    """A scalar boolean from a condition tensor of shape [] or [1]."""
    if np.size(cond) != 1:
        raise ValueError(f"{what} must hold exactly one element, got shape {list(np.shape(cond))}")
    if is_static(cond) or not _is_tracer(cond):
        return bool(np.asarray(cond).reshape(()))
    c = jnp.reshape(cond, ())
    return c if c.dtype == jnp.bool_ else c != 0


@register("IF", fold=False)
def if_(ctx: OpContext, cond: Any, *operands: Any) -> tuple[Any, ...]:
    """Run subgraph then_subgraph_index or else_subgraph_index on the operands.

    A condition known before run time (static, or a concrete value in eager mode) runs only the
    chosen branch; a traced condition becomes ``lax.cond`` over the traced operands.
    """
    o = ctx.options
    branches = (o.else_subgraph_index, o.then_subgraph_index)
    pred = _as_bool(cond, "IF condition")
    if isinstance(pred, bool):
        return tuple(ctx.run_subgraph(branches[pred], list(operands)))
    dynamic, merge = _split(operands)

    def branch(k: int) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        def run(values: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(jnp.asarray(v) for v in ctx.run_subgraph(k, merge(values)))

        return run

    dyn = [operands[j] for j in dynamic]
    try:
        return tuple(lax.cond(pred, branch(branches[1]), branch(branches[0]), dyn))
    except TypeError as e:
        raise ValueError(
            f"IF branches {branches[1]} and {branches[0]} must produce outputs of the same "
            f"shapes and dtypes when the condition is only known at run time ({e})"
        ) from None


def _probe(ctx: OpContext, k: int, args: Sequence[Any]) -> list[Any]:
    """Run subgraph ``k`` abstractly: static outputs come back as numpy, the rest as structs.

    ``args`` may hold numpy values, arrays, tracers or ``jax.ShapeDtypeStruct``s.
    """
    dynamic, merge = _split(args)
    captured: list[Any] = []

    def run(*values: Any) -> list[Any]:
        outs = list(ctx.run_subgraph(k, merge(values)))
        captured[:] = outs
        return [o for o in outs if not is_static(o)]

    structs = [jax.ShapeDtypeStruct(args[j].shape, args[j].dtype) for j in dynamic]
    shaped = iter(jax.eval_shape(run, *structs))
    return [o if is_static(o) else next(shaped) for o in captured]


def _same_shapes(before: Sequence[Any], after: Sequence[Any]) -> bool:
    return all(
        np.shape(a) == tuple(np.shape(b)) and jnp.result_type(a) == jnp.result_type(b)
        for a, b in zip(before, after)
    )


def _loop_plan(
    ctx: OpContext, cond_k: int, body_k: int, args: Sequence[Any]
) -> tuple[list[bool], bool, int | None]:
    """Facts about a loop found by running it abstractly at lowering time.

    Returns which loop variables the body passes through unchanged (static ones are then
    closed over), whether every variable keeps its shape and dtype, and the trip count when it
    follows from static values alone (None when the condition depends on run-time values, when
    a static variable turns into a run-time one, or after ``MAX_STATIC_TRIPS`` iterations).
    """
    body_out = _probe(ctx, body_k, args)
    if len(body_out) != len(args):
        raise ValueError(
            f"WHILE body subgraph {body_k} returns {len(body_out)} values for "
            f"{len(args)} loop variables"
        )
    invariant = [is_static(a) and o is a for a, o in zip(args, body_out)]
    stable = _same_shapes(args, body_out)
    state, out = list(args), body_out
    for trips in range(MAX_STATIC_TRIPS + 1):
        c = _probe(ctx, cond_k, state)
        if len(c) != 1 or not is_static(c[0]):
            return invariant, stable, None
        if not _as_bool(c[0], "WHILE condition"):
            return invariant, stable, trips
        if trips:
            out = _probe(ctx, body_k, state)
            stable = stable and _same_shapes(state, out)
        if any(is_static(a) and not is_static(v) for a, v in zip(state, out)):
            return invariant, stable, None
        state = out
    return invariant, stable, None


def _run_cond(ctx: OpContext, cond_k: int, state: Sequence[Any]) -> Any:
    outs = ctx.run_subgraph(cond_k, list(state))
    if len(outs) != 1:
        raise ValueError(f"WHILE condition subgraph {cond_k} returns {len(outs)} values, not 1")
    return _as_bool(outs[0], "WHILE condition")


@register("WHILE", fold=False)
def while_(ctx: OpContext, *args: Any) -> tuple[Any, ...]:
    """Repeat subgraph body_subgraph_index while subgraph cond_subgraph_index returns true.

    Iterations whose values are all concrete (eager mode, static values) run in Python, which
    also allows bodies that change shapes. Once values are traced, a trip count known at
    lowering time gives a reverse-differentiable ``lax.scan`` (or a Python unroll when the body
    needs a varying loop variable to stay static, or changes shapes); otherwise the loop is a
    ``lax.while_loop``, which JAX can only differentiate in forward mode.
    """
    o = ctx.options
    cond_k, body_k = o.cond_subgraph_index, o.body_subgraph_index
    if any(a is None for a in args):
        raise ValueError("WHILE loop variables cannot be omitted (-1)")
    state = list(args)
    for _ in range(MAX_EAGER_TRIPS):
        if any(_is_tracer(a) for a in state):
            break
        c = _run_cond(ctx, cond_k, state)
        if not isinstance(c, bool):
            break
        if not c:
            return tuple(state)
        state = _bounded(ctx.run_subgraph(body_k, state))
    else:
        raise ValueError(f"the WHILE loop did not end within {MAX_EAGER_TRIPS} iterations")
    invariant, stable, trips = _loop_plan(ctx, cond_k, body_k, state)
    if trips is not None and not stable:
        return _unrolled(ctx, body_k, state, trips)
    if not stable:
        raise ValueError(
            "the WHILE body changes the shape or dtype of a loop variable and the trip count "
            "depends on run-time values: run the model eagerly (without jit)"
        )
    carried = [j for j in range(len(state)) if not invariant[j]]
    dtypes = [jnp.result_type(state[j]) for j in carried]

    def full(values: Sequence[Any]) -> list[Any]:
        out = list(state)
        for j, v in zip(carried, values):
            out[j] = v
        return out

    def body(values: Sequence[Any]) -> list[Any]:
        outs = ctx.run_subgraph(body_k, full(values))
        return [jnp.asarray(outs[j], dt) for j, dt in zip(carried, dtypes)]

    init = [jnp.asarray(state[j]) for j in carried]
    if trips is not None:
        try:
            final, _ = lax.scan(lambda c, _: (body(c), None), init, None, length=trips)
        except ValueError:  # the body needs a varying loop variable as a static value
            return _unrolled(ctx, body_k, state, trips)
    else:
        final = lax.while_loop(
            lambda values: jnp.asarray(_run_cond(ctx, cond_k, full(values))), body, init
        )
    return tuple(full(final))


def _unrolled(ctx: OpContext, body_k: int, args: Sequence[Any], trips: int) -> tuple[Any, ...]:
    """The loop unrolled in Python (static loop variables stay static, shapes may change)."""
    state = list(args)
    for _ in range(trips):
        state = _bounded(ctx.run_subgraph(body_k, state))
    return tuple(state)


def _bounded(values: Sequence[Any]) -> list[Any]:
    """The loop variables, refused when one grew past ``ir.MAX_TENSOR_ELEMENTS``."""
    for v in values:
        if v is not None and np.size(v) > ir.MAX_TENSOR_ELEMENTS:
            raise ValueError(f"a WHILE loop variable grew to shape {list(np.shape(v))[:8]}, "
                             f"over {ir.MAX_TENSOR_ELEMENTS} elements")
    return list(values)


@register("STABLEHLO_COMPOSITE", fold=False)
def stablehlo_composite(ctx: OpContext, *args: Any) -> tuple[Any, ...]:
    """Run the composite's decomposition subgraph (its attributes only name the pattern)."""
    k = ctx.options.decomposition_subgraph_index
    if k is None:
        raise ValueError("STABLEHLO_COMPOSITE has no decomposition_subgraph_index option")
    return tuple(ctx.run_subgraph(k, list(args)))
