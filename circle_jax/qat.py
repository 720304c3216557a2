"""Quantization-aware training's export: trained float masters back into the integer model.

A QAT model (``circle_jax.load(path, qat=True)``) is the float model
`circle_jax.passes.fake_quantize` makes of a fully quantized file, lowered with the
rounding its :class:`~circle_jax.passes.fake_quant.FakeQuantPlan` describes (its values
the file's integer kernels' under the default ``qat_forward="integer"``,
`circle_jax.lower`). Its export is the source file with, for every weight and bias, the
integers and parameters the simulation used (:func:`integer_model`, computed by the same
functions of `circle_jax.ops.fake_quant`):

- a weight: ``quantize_weight`` of its master (re-quantized with the file's scheme);
- a bias: ``round(b / (s_input * s_weight))`` at that scale, zero point 0;
- activations keep the file's scales and zero points, as the simulation used them; with
  moving ranges (``load(qat_ranges="ema")``) those of the ranges given, computed by the
  simulation's function (`circle_jax.ops.fake_quant.range_params`).

Everything else of the file (operators, I/O types, metadata) is written as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from .graph import ir
from .graph.quantization import QParams
from .lower import moving_parameters
from .ops import fake_quant as fq
from .passes.edit import replace_subgraph
from .passes.fake_quant import FakeQuantPlan


def _written(t: ir.Tensor, q: Any, g: QParams) -> ir.Tensor:
    """``t`` holding integers ``q`` (as floats) with parameters ``g``."""
    data = np.clip(np.asarray(q, np.float64), g.qmin, g.qmax)
    data = data.astype(ir.as_numpy_dtype(g.dtype)).reshape(t.shape)
    data.flags.writeable = False
    return replace(t, data=data, quantization=g.quantization())


def integer_model(source: ir.Model, plan: FakeQuantPlan, params: Mapping[str, Any],
                  names: Mapping[tuple[int, int], str],
                  ranges: Mapping[str, Any] | None = None) -> ir.Model:
    """``source`` with its weights and biases replaced by the integers of float ``params``
    (``names``: the param name of each (subgraph, tensor) of the plan), as the simulation
    rounds them, and its moving activation ranges (``ranges``, `circle_jax.lower.RANGES`)
    written as their scales and zero points (see the module docstring)."""
    weights: dict[tuple[int, int], tuple[Any, Any]] = {}
    moved = moving_parameters(plan, ranges) if ranges else {}
    for sg in source.subgraphs:
        tensors = list(sg.tensors)
        for i, (g, scale, zero) in moved.items() if sg.index == 0 else ():
            tensors[i] = replace(tensors[i], quantization=replace(
                g, scale=scale, zero_point=zero).quantization())
        for (k, i), g in plan.weights.items():
            if k != sg.index or (k, i) not in names:
                continue
            q, scale, zero = fq.quantize_weight(np.asarray(params[names[(k, i)]], np.float32), g)
            weights[(k, i)] = (scale, zero)
            tensors[i] = _written(tensors[i], q, replace(g, scale=scale, zero_point=zero))
        for (k, i), b in plan.biases.items():
            if k != sg.index or (k, i) not in names or (k, b.weight) not in weights:
                continue
            s_in = moved[b.input][1] if k == 0 and b.input in moved \
                else plan.activations[(k, b.input)].scale[0]
            scale = fq.bias_scale(s_in, weights[(k, b.weight)][0])
            q = fq.quantize_bias(np.asarray(params[names[(k, i)]], np.float32), scale, b.grid)
            tensors[i] = _written(tensors[i], q, replace(b.grid, scale=scale, zero_point=0))
        source = replace_subgraph(source, sg.index, tensors=tuple(tensors))
    return source
