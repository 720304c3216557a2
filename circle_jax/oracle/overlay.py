"""Model Explorer overlays of the oracle's findings: one number per operator of the main
subgraph, as Model Explorer node data (`circle_jax.interop.model_explorer`: built with its
own classes, keyed by the node ids its TFLite adapter gives the operators).

- ``compare_overlay``: per operator, the largest |difference| between onert's and
  circle-jax's weights it reads (its untied copies folded back into the file's tensor),
  over every compared step; operators that read no compared weight have no value.
- ``golden_overlay``: with gradients (golden with expected outputs), per operator the L2
  norm of dLoss/d(its outputs) (over all its float outputs together); without them, the
  largest |value| of its float outputs. Operators with neither have no value. These span
  decades, so nodes are coloured by the logarithm of the value.

``write_overlay`` writes one atomically; ``circle-jax view MODEL --overlay FILE`` (or
`circle_jax.oracle.view`) shows it on the graph.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..formats.atomic import atomic_write
from ..interop.model_explorer import node_data
from ..model import Model
from .compare import CompareReport
from .golden import GoldenData

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
    source = {int(e.key): e.value for e in (data.gradients if grads else data.tensors)}
    values: dict[int, float] = {}
    for op in model.ir.main.operators:
        outs = [np.asarray(source[i], np.float64) for i in op.outputs
                if i in source and np.issubdtype(source[i].dtype, np.floating)]
        if outs:
            values[op.index] = (float(np.sqrt(sum(np.sum(o * o) for o in outs))) if grads
                                else max(float(np.max(np.abs(o), initial=0.0)) for o in outs))
    name = ("golden: L2 norm of dLoss/d(output)" if grads else "golden: max |output|")
    return node_data(model.ir, values, f"{name} ({data.settings['dtype']})", log_scale=True)


def write_overlay(overlay: Any, path: str | os.PathLike) -> None:
    """Write ``overlay`` (a ``ModelNodeData``) as Model Explorer's JSON, atomically."""
    atomic_write(path, overlay.to_json_string(indent=1).encode())


def _param_readers(model: Model) -> dict[str, set[int]]:
    """The file's param name -> the operators of the main subgraph reading it or any of its
    untied copies."""
    origin = model.rewrites.untied
    names = {i: origin.get(name, name) for name, (k, i) in model.param_keys.items() if k == 0}
    readers: dict[str, set[int]] = {}
    for op in model.ir.main.operators:
        for i in op.inputs:
            if i in names:
                readers.setdefault(names[i], set()).add(op.index)
    return readers
