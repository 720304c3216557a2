"""Graph passes: pure rewrites of the IR, each one rule, run in an explicit pipeline.

A pass is a function ``ir.Model -> ir.Model`` that returns a new model and appends a
:class:`~circle_jax.graph.ir.PassRecord` of what it changed to ``model.passes``; it never reads
or writes bytes (the reader parsed the file once; `circle_jax.formats.writer.write_model`
writes any pass's output). `circle_jax.load` runs :func:`pipeline` of its options; every
pass is also usable alone:

    model = read_model("m.tflite")
    model = run(model, [partial(select_signature, key="decode"), untie_shared_constants])
    data = write_model(model, "tflite")

Passes: :func:`select_signature` (`.signature`), :func:`untie_shared_constants`
(`.untie`), :func:`add_missing_biases` (`.bias`). New passes build on the helpers of
`.edit` (``add_tensor``, ``add_constant``, ``add_operator``, ``set_outputs``, ``record``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from ..graph import ir
from .bias import add_missing_biases
from .edit import (
    add_constant,
    add_operator,
    add_tensor,
    record,
    replace_inputs,
    replace_subgraph,
    set_inputs,
    set_outputs,
)
from .signature import select_signature, signature_keys
from .untie import untie_shared_constants

Pass = Callable[[ir.Model], ir.Model]


def run(model: ir.Model, passes: Iterable[Pass]) -> ir.Model:
    """``model`` rewritten by each pass in turn."""
    for p in passes:
        model = p(model)
    return model


def pipeline(*, signature: str | None = None, untie: bool = False, add_bias: bool = False,
             policy: str = "weights") -> list[Pass]:
    """The passes `circle_jax.load` runs for its options, in order: the signature's
    subgraph made the main one, then shared trainable constants untied (under the
    trainable ``policy``), then missing biases added."""
    passes: list[Pass] = []
    if signature is not None:
        passes.append(partial(select_signature, key=signature))
    if untie:
        passes.append(partial(untie_shared_constants, policy=policy))
    if add_bias:
        passes.append(add_missing_biases)
    return passes


__all__ = [
    "Pass", "add_constant", "add_missing_biases", "add_operator", "add_tensor", "pipeline",
    "record", "replace_inputs", "replace_subgraph", "run", "select_signature", "set_inputs",
    "set_outputs", "signature_keys", "untie_shared_constants",
]
