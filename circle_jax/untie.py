"""Rewrites of a model file that change its params: untie shared constants, add missing biases.

Both produce a new model file (bytes) and read it back, so everything downstream (lowering,
training, export, checkpoints, .wof) sees an ordinary model whose every trained weight has a
tensor and a buffer of its own:

- **untie**: a trainable constant read by several operators (TF's converter deduplicates equal
  buffers, e.g. the zero biases of several convolutions) gets one copy per reading operator,
  initialised from the shared value. The first reader keeps the original tensor; the others read
  a new tensor ``<name>/op<k>`` (k: the reader's operator index) with a buffer of its own.
  onert trains such copies separately; the exported file then computes what was trained.
- **add missing bias**: a weighted operator of the main subgraph without its optional bias
  (the converter drops all-zero FULLY_CONNECTED biases; Keras still trains them) gets a zero
  bias tensor ``<weights name>/bias`` of the output channel count.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import ir
from .formats.reader import model_from_object, unpack
from .formats.schema import schema, tensor_type
from .formats.writer import _inline_external_buffers, pack
from .lower import param_table
from .params_policy import classify_params, missing_biases, shared_constants


@dataclass(frozen=True)
class Rewrites:
    """What was rewritten: untied copies (new name -> shared name) and added bias names."""

    untied: dict[str, str] = field(default_factory=dict)
    added_bias: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.untied or self.added_bias)


def rewrite_params(model: ir.Model, *, untie: bool, add_bias: bool,
                   policy: str = "weights") -> tuple[ir.Model, Rewrites]:
    """``model`` with shared trainable constants untied and/or missing biases added."""
    keys = param_table(model)
    shared = shared_constants(model, keys, classify_params(model, keys, policy)) if untie else {}
    biases = missing_biases(model) if add_bias else []
    if not shared and not biases:
        return model, Rewrites()
    m = unpack(model.source)
    _inline_external_buffers(m, model.source)
    untied: dict[str, str] = {}
    for (k, i), ops in shared.items():
        sg = m.subgraphs[k]
        name = model.subgraphs[k].tensors[i].name
        for j in ops[1:]:
            new = _append_tensor(m, sg, copy.deepcopy(sg.tensors[i]), f"{name}/op{j}",
                                 model.subgraphs[k].tensors[i].data)
            op = sg.operators[j]
            op.inputs = [new if t == i else int(t) for t in op.inputs]
            untied[f"{name}/op{j}"] = name
    added = []
    for j, pos, channels in biases:
        sg = m.subgraphs[0]
        op = sg.operators[j]
        weights = sg.tensors[int(op.inputs[1])]
        y = model.main.tensors[model.main.operators[j].outputs[0]]
        t = copy.deepcopy(weights)
        t.shape, t.shapeSignature, t.quantization = [channels], None, None
        t.type = _type_code(weights.type, y.dtype)
        name = f"{model.main.tensors[model.main.operators[j].inputs[1]].name}/bias"
        data = np.zeros([channels], ir.as_numpy_dtype(y.dtype))
        new = _append_tensor(m, sg, t, name, data)
        inputs = [int(t) for t in op.inputs] + [-1] * (pos + 1 - len(op.inputs))
        inputs[pos] = new
        op.inputs = inputs
        added.append(name)
    flat = pack(m, model.format)
    return model_from_object(unpack(flat), flat), Rewrites(untied, tuple(added))


def _append_tensor(m: Any, sg: Any, tensor: Any, name: str, data: np.ndarray) -> int:
    """Append ``tensor`` (a ``TensorT``) named ``name`` with its own buffer holding ``data``."""
    buf = schema.Buffer.BufferT()
    buf.data = np.ascontiguousarray(data).view(np.uint8).ravel().copy()
    m.buffers.append(buf)
    tensor.name = name
    tensor.buffer = len(m.buffers) - 1
    sg.tensors.append(tensor)
    return len(sg.tensors) - 1


def _type_code(weight_type: int, dtype: str) -> int:
    try:
        return tensor_type(dtype)
    except (KeyError, ValueError):
        return weight_type
