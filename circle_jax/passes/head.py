"""Replace the classifier head: the model's output computed by a fresh K-class layer.

The head of output ``output`` (default 0) is found walking back from that output tensor:
an optional DEQUANTIZE (an integer model's float output), an optional SOFTMAX or LOGISTIC,
then shape-only operators (RESHAPE, SQUEEZE), then the weighted operator that computes the
class scores: a FULLY_CONNECTED, or a CONV_2D with a 1x1 kernel whose output is 1x1
spatially (MobileNet's logits). Each of these
operators must be read by nothing but the next one, so removing them changes nothing else.
A head whose weights are not float constants is refused (:func:`float_weights_refusal`):
integer (quantized) weights, or float16 weights a DEQUANTIZE makes float32.

:func:`replace_head` removes those operators and appends, reading the weighted operator's
input ``x``: a FULLY_CONNECTED ``head/weights`` [K, in] (Glorot-uniform, seeded) plus
``head/bias`` [K] (zero), whose output has the old output's shape with K classes
(``keep_num_dims`` as the old FULLY_CONNECTED had it), then the old SOFTMAX / LOGISTIC
(same options) when there was one. The new output replaces the old one in the subgraph's
outputs and signature defs, under the old output's name (the old tensor becomes
``<name>/replaced``). The old head's tensors stay in the tensor table, read by nothing
(indices are not renumbered), and are no params.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..errors import ConfigError
from ..graph import ir
from .edit import add_constant, add_operator, add_tensor, record, replace_subgraph, set_outputs

ACTIVATIONS = ("SOFTMAX", "LOGISTIC")
SHAPE_ONLY = ("RESHAPE", "SQUEEZE")
HEAD_WEIGHTS, HEAD_BIAS = "head/weights", "head/bias"


def find_head(sg: ir.Subgraph, output: int = 0) -> tuple[list[ir.Operator], ir.Operator,
                                                         ir.Operator | None]:
    """(the head's operators from the weighted one on, the weighted operator, the final
    activation or None) for output ``output`` of ``sg``; a ValueError says why there is
    none."""
    producer = {t: op for op in sg.operators for t in op.outputs}
    readers: dict[int, int] = {}
    for op in sg.operators:
        for i in set(op.inputs):
            readers[i] = readers.get(i, 0) + 1
    tensor = sg.outputs[output]
    chain: list[ir.Operator] = []
    op = producer.get(tensor)
    activation = None
    if op is not None and op.type == "DEQUANTIZE":  # an integer model's float output
        chain.append(op)
        op = producer.get(op.inputs[0])
    if op is not None and op.type in ACTIVATIONS:
        activation = op
        chain.append(op)
        op = producer.get(op.inputs[0])
    while op is not None and op.type in SHAPE_ONLY:
        chain.append(op)
        op = producer.get(op.inputs[0])
    name = sg.tensors[tensor].name
    if op is None or not _weighted(sg, op, producer):
        what = "a graph input" if op is None else f"{op.key} #{op.index}"
        raise ConfigError(f"output {name!r} is not fed by a weighted operator (FULLY_CONNECTED "
                          f"or 1x1 CONV_2D, then RESHAPE/SQUEEZE, SOFTMAX/LOGISTIC) but by {what}:"
                          " it has no classifier head to replace")
    refusal = float_weights_refusal(sg, op, producer)
    if refusal:
        raise ConfigError(f"the head of output {name!r}: {refusal}")
    chain.append(op)
    for later in chain[:-1]:
        if any(readers.get(t, 0) > 1 for t in later.inputs[:1]) or \
                any(t in sg.outputs and t != tensor for t in later.outputs):
            raise ConfigError(f"the head of output {name!r} feeds other operators too "
                              f"({later.key} #{later.index}'s input is shared)")
    if readers.get(op.outputs[0], 0) > 1:
        raise ConfigError(f"the head of output {name!r} feeds other operators too")
    return chain[::-1], op, activation


def _weighted(sg: ir.Subgraph, op: ir.Operator, producer: dict[int, ir.Operator]) -> bool:
    if op.type not in ("FULLY_CONNECTED", "CONV_2D"):
        return False
    w, y = sg.tensors[op.inputs[1]], sg.tensors[op.outputs[0]]
    src = producer.get(w.index)
    stored = w.is_constant or (src is not None and src.type == "DEQUANTIZE")
    return stored and (op.type == "FULLY_CONNECTED"
                       or (w.shape[1:3] == (1, 1) and y.shape[1:3] == (1, 1)))


def float_weights_refusal(sg: ir.Subgraph, op: ir.Operator,
                          producer: dict[int, ir.Operator]) -> str | None:
    """Why a new head or LoRA cannot train in place of (or beside) ``op``'s stored weights
    (its input 1), naming the way out, or None: integer (quantized) weights run by integer
    kernels, or float16 weights a DEQUANTIZE makes float32 at run time, are refused."""
    w = sg.tensors[op.inputs[1]]
    where = f"{op.key} #{op.index}'s weights {w.name!r} are"
    fix = ("a new head and LoRA train float32 weights: dequantize the model to float32 first "
           "(load(dequantize=True), --dequantize)")
    if w.is_constant and (not w.is_float or w.quantization is not None):
        return f"{where} {w.dtype} (a quantized model, run by integer kernels); {fix}"
    src = producer.get(w.index)
    if not w.is_constant and src is not None and src.type == "DEQUANTIZE":
        q = sg.tensors[src.inputs[0]]
        return f"{where} {q.dtype} {q.name!r} made float32 by DEQUANTIZE #{src.index}; {fix}"
    return None


def seeded_uniform(bound: float, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Float32 weights uniform on +-``bound`` from NumPy's generator seeded by ``seed``: the
    initial draw of a new head and of LoRA's A. Drawn on the host: JAX's generator compiles
    a program per shape (seconds of a load, measured in benchmarks/README.md). A negative
    seed (any 64-bit one trains, as JAX's keys take it) counts modulo 2**64."""
    rng = np.random.default_rng(int(seed) % 2**64)
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def glorot_uniform(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Glorot-uniform weights [out, in]: uniform on +-sqrt(6 / (in + out))."""
    return seeded_uniform(math.sqrt(6 / sum(shape)), shape, seed)


def replace_head(model: ir.Model, classes: int, seed: int = 0, output: int = 0) -> ir.Model:
    """``model`` with the head of output ``output`` replaced by a fresh ``classes``-way one
    (see the module docstring); the record maps the new params to what they are."""
    if not isinstance(classes, (int, np.integer)) or isinstance(classes, bool) or classes < 1:
        raise ConfigError(f"new head: the class count must be an integer >= 1, got {classes!r}")
    sg = model.main
    if not 0 <= output < len(sg.outputs):
        raise ConfigError(f"new head: no output {output}; the model has {len(sg.outputs)}")
    chain, weighted, activation = find_head(sg, output)
    x = sg.tensors[weighted.inputs[0]]
    old_out = sg.tensors[sg.outputs[output]]
    n_in = int(sg.tensors[weighted.inputs[1]].shape[-1])
    shape = (*old_out.shape[:-1], int(classes))
    keep = bool(weighted.type == "FULLY_CONNECTED" and weighted.options.keep_num_dims)
    natural = (*x.shape[:-1], classes) if keep else (int(np.prod(x.shape)) // n_in, classes)
    if tuple(natural) != shape:
        raise ConfigError(f"new head: the head's input {list(x.shape)} does not give the "
                          f"output's shape {list(old_out.shape)} through a FULLY_CONNECTED")
    gone = {op.index for op in chain}
    kept = [op for op in sg.operators if op.index not in gone]
    model = replace_subgraph(model, 0, operators=tuple(
        replace(op, index=j) for j, op in enumerate(kept)))
    model, w = add_constant(model, 0, HEAD_WEIGHTS, glorot_uniform((classes, n_in), seed))
    model, b = add_constant(model, 0, HEAD_BIAS, np.zeros([classes], np.float32))
    name = old_out.name
    tensors = list(model.main.tensors)  # the old output keeps no name the new one takes
    tensors[old_out.index] = replace(old_out, name=f"{name}/replaced")
    model = replace_subgraph(model, 0, tensors=tuple(tensors))
    model, y = add_tensor(model, 0, f"{name}/head" if activation else name, shape)
    model = add_operator(model, 0, "FULLY_CONNECTED", (x.index, w, b), (y,),
                         {"fused_activation_function": ir.ACT_NONE, "keep_num_dims": keep})
    changes = {HEAD_WEIGHTS: f"Glorot-uniform [{classes}, {n_in}], seed {seed}",
               HEAD_BIAS: f"zeros [{classes}]"}
    if activation is not None:
        model, z = add_tensor(model, 0, name, shape)
        model = add_operator(model, 0, activation.type, (y,), (z,), dict(activation.options))
        y = z
    outputs = list(model.main.outputs)
    outputs[output] = y
    model = set_outputs(model, 0, outputs)  # the signature defs follow
    changes.update({f"{op.key} #{op.index}": "removed" for op in chain})
    return record(model, "replace_head", changes, "new param: initial value")
