"""Model Explorer overlays of the oracle's findings: one number per operator of the main
subgraph, as Model Explorer node data (`circle_jax.interop.model_explorer`: built with its
own classes, keyed by the node ids its TFLite adapter gives the operators: an operator's
index in the file, ``origin``, not in the graph load's passes rewrote).

- ``compare_overlay``: per operator, the largest |difference| between onert's and
  circle-jax's weights it reads (its untied copies folded back into the file's tensor),
  over every compared step; operators that read no compared weight have no value.
- ``golden_overlay``: with gradients (golden with expected outputs), per operator the L2
  norm of dLoss/d(its outputs) (over all its float outputs together); without them, the
  largest |value| of its outputs (real values: a quantized integer tensor dequantized with
  its scale and zero point). Operators with neither have no value. These span decades, so
  nodes are coloured by the logarithm of the value.

Operators the passes removed (the DEQUANTIZE of float16 weights, QUANTIZE/DEQUANTIZE left
between float tensors by ``dequantize``) and operators they added (LoRA adapters) get no
value; every other operator's value is keyed by its index in the file.

``write_overlay`` writes one atomically; ``circle-jax view MODEL --overlay FILE`` (or
`circle_jax.oracle.view`) shows it on the graph.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..formats.atomic import atomic_write
from ..graph.quantization import dequantize
from ..interop.model_explorer import node_data
from ..model import Model
from .compare import CompareReport
from .golden import GoldenData
from .h5 import Entry

__all__ = ["compare_overlay", "golden_overlay", "write_overlay"]


def compare_overlay(report: CompareReport, model: Model) -> Any:
    """``ModelNodeData``: per operator, the largest weight difference from onert (see the
    module docstring). ``model`` is the model compared, loaded with the same options."""
    readers = _param_readers(model)
    values: dict[int, float] = {}
    for name, by_step in report.tensors.items():
        worst = max(by_step.values(), default=0.0)
        for op in readers.get(name, ()):
            values[op] = max(values.get(op, 0.0), worst)
    steps = report.settings.get("steps", len(report.steps))
    return node_data(model.ir, values, f"compare: max |weight - onert's| over {steps} steps")


def golden_overlay(data: GoldenData, model: Model) -> Any:
    """``ModelNodeData``: per operator, the gradient norm of its outputs, or without
    gradients their largest |value| (see the module docstring)."""
    grads = data.gradients is not None
    source = {int(e.key): _real(e) for e in (data.gradients if grads else data.tensors)}
    values: dict[int, float] = {}
    for op in model.ir.main.operators:
        outs = [source[i] for i in op.outputs if source.get(i) is not None]
        if outs and op.origin is not None:
            values[op.origin] = (float(np.sqrt(sum(np.sum(o * o) for o in outs))) if grads
                                 else max(float(np.max(np.abs(o), initial=0.0)) for o in outs))
    name = ("golden: L2 norm of dLoss/d(output)" if grads else "golden: max |output|")
    return node_data(model.ir, values, f"{name} ({data.settings['dtype']})", log_scale=True)


def write_overlay(overlay: Any, path: str | os.PathLike) -> None:
    """Write ``overlay`` (a ``ModelNodeData``) as Model Explorer's JSON, atomically."""
    atomic_write(path, overlay.to_json_string(indent=1).encode())


def _real(e: Entry) -> np.ndarray | None:
    """An entry's real values (float64): a float tensor's own, a quantized integer tensor's
    dequantized with its h5 attributes; None for other integer tensors (indices, shapes)."""
    if np.issubdtype(e.value.dtype, np.floating):
        return np.asarray(e.value, np.float64)
    if "scale" in e.attrs:
        return dequantize(e.value, e.attrs["scale"], e.attrs["zero_point"],
                          int(e.attrs["quantized_dimension"]))
    return None


def _param_readers(model: Model) -> dict[str, set[int]]:
    """The file's param name -> the operators of the main subgraph reading it or any of its
    untied copies, by their index in the file."""
    origin = model.rewrites.untied
    names = {i: origin.get(name, name) for name, (k, i) in model.param_keys.items() if k == 0}
    readers: dict[str, set[int]] = {}
    for op in model.ir.main.operators:
        for i in op.inputs:
            if i in names and op.origin is not None:
                readers.setdefault(names[i], set()).add(op.origin)
    return readers
