"""Choosing a signature of a multi-signature model: its subgraph becomes the main one.

A SignatureDef names a subgraph (e.g. a transformer's prefill and decode graphs).
`select_signature` rewrites the model file so that subgraph is subgraph 0, swapping it with
the old subgraph 0 and renumbering every reference to either (control-flow options such as
WHILE's ``cond_subgraph_index``, every option field naming a subgraph, the signature defs),
then reads it back: running, training and exporting then act on the chosen signature, and
an exported file still holds every signature, each naming its own subgraph.
"""

from __future__ import annotations

from typing import Any

from . import ir
from .errors import CircleFormatError
from .formats.reader import model_from_object, unpack
from .formats.writer import _inline_external_buffers, pack


def signature_keys(model: ir.Model) -> list[str]:
    """The model's signature keys, in file order."""
    return [s.key for s in model.signature_defs]


def select_signature(model: ir.Model, key: str) -> ir.Model:
    """``model`` with signature ``key``'s subgraph as subgraph 0 (see the module docstring);
    one-line `CircleFormatError` naming the available keys when there is no such one."""
    found = {s.key: s.subgraph_index for s in model.signature_defs}
    if key not in found:
        have = ", ".join(repr(k) for k in found) or "none"
        raise CircleFormatError(f"the model has no signature {key!r} (signatures: {have})")
    k = found[key]
    if not 0 <= k < len(model.subgraphs):
        raise CircleFormatError(f"signature {key!r} names subgraph {k}; the model has "
                                f"{len(model.subgraphs)}")
    if k == 0:
        return model
    m = unpack(model.source)
    _inline_external_buffers(m, model.source)
    swap = {0: k, k: 0}
    m.subgraphs[0], m.subgraphs[k] = m.subgraphs[k], m.subgraphs[0]
    for sg in m.subgraphs:
        for op in sg.operators or []:
            for options in (op.builtinOptions, getattr(op, "builtinOptions2", None)):
                _renumber(options, swap)
    for s in m.signatureDefs or []:
        s.subgraphIndex = swap.get(s.subgraphIndex, s.subgraphIndex)
    flat = pack(m, model.format)
    return model_from_object(unpack(flat), flat)


def _renumber(options: Any, swap: dict[int, int]) -> None:
    """Renumber the subgraph indices an operator's options name (fields named *Subgraph*)."""
    if options is None:
        return
    for name, value in vars(options).items():
        if "subgraph" in name.lower() and isinstance(value, int):
            setattr(options, name, swap.get(value, value))
