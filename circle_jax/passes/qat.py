"""Quantization-aware training's settings (:class:`QatSettings`: `circle_jax.load`'s QAT
keywords, checked) and its export: trained float masters back into the integer model.

A QAT model (``circle_jax.load(path, qat=True)``) is the float model
`circle_jax.passes.fake_quantize` makes of a fully quantized file, lowered with the
rounding its :class:`~circle_jax.passes.fake_quant.FakeQuantPlan` describes (its values
the file's integer kernels' under the default ``qat_forward="integer"``,
`circle_jax.lowering.interpreter`). Its export is the source file with, for every weight
and bias, the integers and parameters the simulation used (:func:`integer_model`, computed
by the same functions of `circle_jax.ops.fake_quant`):

- a weight: ``quantize_weight`` of its master (re-quantized with the file's scheme);
- a grid constant (an ADD's or MUL's constant operand): ``constant_on_grid`` of its master,
  the file's scale and zero point;
- a bias: ``round(b / (s_input * s_weight))`` at that scale, zero point 0;
- activations keep the file's scales and zero points, as the simulation used them; with
  moving ranges (``load(qat_ranges="ema")``) those of the ranges given, computed by the
  simulation's function (`circle_jax.ops.fake_quant.range_params`).

Everything else of the file (operators, I/O types, metadata) is written as it was.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..graph import ir
from ..graph.quantization import QParams
from ..ops.fake_quant import (
    bias_scale,
    constant_on_grid,
    quantize_bias,
    quantize_weight,
    range_params,
)
from .edit import replace_subgraph
from .fake_quant import FakeQuantPlan

#: How a QAT model's forward computes its values (``load(qat_forward=...)``).
QAT_FORWARDS = ("integer", "fake_quant")
#: Where a QAT model's activation ranges come from (``load(qat_ranges=...)``).
QAT_RANGES = ("file", "ema")
#: How a QAT model's cross-entropy reads a SOFTMAX output (`circle_jax.numerics`'s
#: ``softmax_cce``): from the SOFTMAX's input logits, the integer model's own values. Its
#: quantized probabilities (int8: steps of 1/256, 0 below 1/512) would give a loss that moves
#: only when a probability crosses a step, coarse gradients ``-1 / p`` through the rounding
#: and none where the true class's probability rounds to 0 (``-log max(p, 1e-20)``: 46 per
#: sample). TF's QAT does the same: tfmot leaves a Softmax's output unquantized and Keras
#: computes the loss from its logits.
QAT_SOFTMAX_CCE = "logits"


@dataclass(frozen=True)
class QatSettings:
    """`circle_jax.load`'s QAT keywords, checked and with their defaults: ``forward``
    ("integer", or "fake_quant" with "ema" ranges), ``ranges`` ("file"), ``range_decay``
    (0.999, TF's); ``given`` names the QAT options the caller set."""

    qat: bool | str | None
    forward: str
    ranges: str
    range_decay: float
    given: tuple[str, ...]

    @classmethod
    def of(cls, qat: bool | str | None, dequantize: bool | None, forward: str | None,
           ranges: str | None, range_decay: float | None) -> QatSettings:
        """ConfigError (one line), before the file is read, for a ``qat`` other than
        True, False, None or "auto"; ``dequantize=True`` with ``qat=True`` (a float model
        has nothing to simulate); QAT options with ``qat=False``; ``range_decay`` without
        "ema" ranges or outside [0, 1); an unknown forward or ranges, or "ema" ranges
        with the integer forward (which cannot take moving ranges)."""
        given = tuple(k for k, v in (("qat_forward", forward), ("qat_ranges", ranges),
                                     ("qat_range_decay", range_decay)) if v is not None)
        if qat not in (True, False, None, "auto"):
            raise ConfigError(f"qat={qat!r}: expected True, False, None or 'auto'")
        if qat is True and dequantize:
            raise ConfigError("dequantize=True makes the model float, which qat=True cannot "
                              "simulate: give one of them")
        if qat is False and given:
            raise ConfigError(f"{given[0]} is a QAT option, and qat=False trains the model "
                              "dequantized: drop one of them")
        if range_decay is not None and ranges != "ema":
            raise ConfigError("qat_range_decay moves ranges only with qat_ranges='ema'")
        ranges = ranges or "file"
        forward = forward or ("fake_quant" if ranges == "ema" else "integer")
        decay = 0.999 if range_decay is None else range_decay
        if forward not in QAT_FORWARDS:
            raise ConfigError(f"qat_forward {forward!r}: expected one of {QAT_FORWARDS}")
        if ranges not in QAT_RANGES:
            raise ConfigError(f"qat_ranges {ranges!r}: expected one of {QAT_RANGES}")
        if ranges == "ema" and forward == "integer":
            raise ConfigError("qat_ranges 'ema' moves the activation ranges, which the "
                              "integer forward cannot take; use qat_forward='fake_quant'")
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real) \
                or not 0.0 <= decay < 1.0:
            raise ConfigError(f"qat_range_decay {decay!r}: expected a number in [0, 1)")
        return cls(qat, forward, ranges, float(decay), given)

    def check_applies(self, simulate: bool) -> None:
        """ConfigError (one line) once the model is read: ``qat=True`` for a model without
        quantized activations (``simulate`` False: nothing to simulate), or QAT options
        for a load that does not simulate."""
        if self.qat is True and not simulate:
            raise ConfigError("qat=True: the model has no quantized activations (a float or "
                              "weight-only quantized model), nothing for quantization-aware "
                              "training to simulate; load it without qat")
        if self.given and not (self.qat and simulate):
            why = "the model has no quantized activations" if not simulate \
                else f"qat={self.qat!r}"
            raise ConfigError(f"{self.given[0]} is an option of quantization-aware training, "
                              f"which this load does not do ({why}); drop it or load with qat")


def moving_parameters(plan: FakeQuantPlan, ranges: Mapping[str, Any]
                      ) -> dict[int, tuple[QParams, Any, Any]]:
    """Each main-subgraph activation of a moving range group: (its file parameters, the
    scale and zero point of its group's range ``ranges[name]``, `range_params`)."""
    out = {}
    for name, members in plan.moving.items():
        for i in members:
            g = plan.activations[(0, i)]
            out[i] = (g, *range_params(ranges[name], g))
    return out


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
    rounds them, and its moving activation ranges (``ranges``,
    `circle_jax.lowering.interpreter.RANGES`) written as their scales and zero points (see
    the module docstring)."""
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
            q, scale, zero = quantize_weight(np.asarray(params[names[(k, i)]], np.float32), g)
            weights[(k, i)] = (scale, zero)
            tensors[i] = _written(tensors[i], q, replace(g, scale=scale, zero_point=zero))
        for (k, i), g in plan.constants.items():
            if k == sg.index and (k, i) in names:
                q = constant_on_grid(np.asarray(params[names[(k, i)]], np.float32), g)[0]
                tensors[i] = _written(tensors[i], q, g)
        for (k, i), b in plan.biases.items():
            if k != sg.index or (k, i) not in names or (k, b.weight) not in weights:
                continue
            s_in = moved[b.input][1] if k == 0 and b.input in moved \
                else plan.activations[(k, b.input)].scale[0]
            scale = bias_scale(s_in, weights[(k, b.weight)][0])
            q = quantize_bias(np.asarray(params[names[(k, i)]], np.float32), scale, b.grid)
            tensors[i] = _written(tensors[i], q, replace(b.grid, scale=scale, zero_point=0))
        source = replace_subgraph(source, sg.index, tensors=tuple(tensors))
    return source
