"""The training step as one graph of builtin operators (the ``functional`` packaging).

From a model's IR and a `StepConfig`, :func:`functional_step` builds a model whose
subgraph 0 is one pure training step:

- inputs: the model's inputs, the targets, then the state: each trainable weight under its
  param name (in the configuration's order), then the optimizer's slots
  (`OptimizerSpec.slots`);
- outputs: the scalar loss, then the new state in the same order;
- operators: the forward operators the loss needs (tensor shapes at the training batch:
  RESHAPE's requested shape follows), the loss and its cotangent (`loss.emit_loss`), the
  backward operators, the update (`optimizer.emit_update`).

The backward covers only what the trainable weights need: a tensor gets a cotangent when
it lies on a path from a trainable weight to the tensor the loss reads, so the operators
before the first trainable one (a frozen prefix) need no rule. Each operator on such a
path needs a rule (`RULES`); :func:`unsupported` lists those without one, or with options
their rule refuses, and :func:`functional_step` refuses the model with all of them in
one line. A weight read by several operators sums their cotangents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ...errors import UnsupportedOperatorError
from ...graph import ir
from . import conv, dense, elementwise, indexing, pooling, reduce, resize, shape, slicing
from .emit import Emitter, Shape
from .loss import LossSpec, emit_loss
from .optimizer import OptimizerSpec, emit_update
from .rule import Backward, Rule

#: Operator -> its backward rule.
RULES: dict[str, Rule] = {name: rule for family in (conv, dense, elementwise, indexing, pooling,
                                                    reduce, resize, shape, slicing)
                          for name, rule in family.RULES.items()}


@dataclass(frozen=True)
class StepConfig:
    """What one training step computes.

    Attributes:
      loss: the loss and how it reads the tensor ``reads``.
      optimizer: the update.
      reads: the subgraph-0 tensor the loss reads (a model output, or the input of the
        SOFTMAX producing one when the loss takes its logits).
      trainable: (param name, tensor index) of each trainable weight, in state order.
      shapes: subgraph 0's tensor shapes at the training batch (tensor index -> shape);
        tensors not named keep their declared shape.
    """

    loss: LossSpec
    optimizer: OptimizerSpec
    reads: int
    trainable: tuple[tuple[str, int], ...]
    shapes: Mapping[int, Shape]


@dataclass(frozen=True)
class TrainingStep:
    """The step's model, and its state: (name, initial value) of each state input, in order
    (``state_inputs``: their tensor indices in subgraph 0)."""

    model: ir.Model
    state: tuple[tuple[str, np.ndarray], ...]
    state_inputs: tuple[int, ...]


def _needed_ops(sg: ir.Subgraph, reads: int) -> list[ir.Operator]:
    """The operators ``reads`` depends on, in graph order."""
    producer = {o: op for op in sg.operators for o in op.outputs}
    wanted, todo = set(), [reads]
    while todo:
        op = producer.get(todo.pop())
        if op is not None and op.index not in wanted:
            wanted.add(op.index)
            todo.extend(i for i in op.inputs if i >= 0)
    return [op for op in sg.operators if op.index in wanted]


def _on_path(ops: list[ir.Operator], sources: set[int], reads: int) -> set[int]:
    """The tensors on a path from ``sources`` to ``reads`` through ``ops``."""
    reached = set(sources)
    for op in ops:
        if reached.intersection(op.inputs):
            reached.update(op.outputs)
    needed, todo = {reads}, [reads]
    producer = {o: op for op in ops for o in op.outputs}
    while todo:
        op = producer.get(todo.pop())
        for i in op.inputs if op is not None else ():
            if i >= 0 and i not in needed:
                needed.add(i)
                todo.append(i)
    return reached & needed


def _backward_ops(sg: ir.Subgraph, config: StepConfig
                  ) -> tuple[list[ir.Operator], set[int]]:
    ops = _needed_ops(sg, config.reads)
    path = _on_path(ops, {i for _, i in config.trainable}, config.reads)
    return [op for op in ops if path.intersection(op.outputs)], path


def _wanted(op: ir.Operator, path: set[int]) -> frozenset[int]:
    return frozenset(p for p, i in enumerate(op.inputs) if i >= 0 and i in path)


def unsupported(model: ir.Model, config: StepConfig) -> list[str]:
    """``"OP #index"`` (with the reason when the rule refuses options) for each operator on
    the trainable path that has no backward rule or whose rule refuses it."""
    sg = model.main
    ops, path = _backward_ops(sg, config)
    e = Emitter(forward_tensors(sg, config), ())
    found = []
    for op in ops:
        rule = RULES.get(op.key)
        if rule is None or (len(op.outputs) != 1 and not rule.many_outputs):
            found.append(f"{op.key} #{op.index}")
            continue
        why = rule.refuse(Backward(e, op, -1, _wanted(op, path))) if rule.refuse else None
        if why:
            found.append(f"{op.key} #{op.index} ({why})")
    return found


def forward_tensors(sg: ir.Subgraph, config: StepConfig) -> list[ir.Tensor]:
    """Subgraph 0's tensors at the training batch, detached from the source file; the
    trainable weights become plain tensors (state inputs) named by their params."""
    names = {i: name for name, i in config.trainable}
    out = []
    for t in sg.tensors:
        t = replace(t, shape=tuple(config.shapes.get(t.index, t.shape)), shape_signature=None,
                    origin=None, buffer=ir.NEW_BUFFER if t.is_constant else 0)
        if t.index in names:
            t = replace(t, name=names[t.index], data=None, buffer=0)
        out.append(t)
    return out


def _detached(sg: ir.Subgraph) -> ir.Subgraph:
    """``sg`` with no element pointing into the source file."""
    return replace(sg, origin=None, operators=tuple(replace(op, origin=None)
                                                    for op in sg.operators),
                   tensors=tuple(replace(t, origin=None, buffer=ir.NEW_BUFFER
                                         if t.is_constant else 0) for t in sg.tensors))


def _rebatched(e: Emitter, op: ir.Operator) -> ir.Operator:
    """``op`` renumbered; a RESHAPE or TRANSPOSE_CONV asks for its output's shape at the
    training batch, a RESHAPE always as its shape input too (onert's loader refuses a
    RESHAPE of one input)."""
    out = e.shape(op.outputs[0])
    inputs = list(op.inputs)
    if op.type == "TRANSPOSE_CONV":
        inputs[0] = e.const(out, "int32")
        return replace(op, inputs=tuple(inputs))
    if op.type != "RESHAPE":
        return op
    inputs = [inputs[0], e.const(out, "int32")]
    options = dict(op.options)
    if "new_shape" in options:
        options["new_shape"] = out
    return replace(op, inputs=tuple(inputs), options=ir.Options(options))


def _unread(e: Emitter, t: int) -> int:
    """``t``, or where an operator reads it, an exact copy of it that none reads (``t * 1``):
    no output of the step is also an operator's input, as onert's inference session
    overwrites such an output's buffer (tests/ondevice/test_functional_step_in_onert.py).
    Only float outputs are read (Adam's new step count is not: `emit_update`)."""
    if not any(t in op.inputs for op in e.operators):
        return t
    assert e.tensors[t].dtype == "float32", e.tensors[t]
    return e.mul(t, e.scalar(1.0))


def functional_step(model: ir.Model, config: StepConfig, params: Mapping[str, np.ndarray]
                    ) -> TrainingStep:
    """The ``functional`` training step of ``model`` (module docstring), its state
    initialised from ``params`` (param name -> the weight's current value)."""
    refused = unsupported(model, config)
    if refused:
        raise UnsupportedOperatorError(
            f"no training-graph rule for {len(refused)} operator(s) on the path the trainable "
            f"weights need: {', '.join(refused)}")
    sg = model.main
    e = Emitter(forward_tensors(sg, config), ())
    forward = [replace(_rebatched(e, op), index=k, origin=None)
               for k, op in enumerate(_needed_ops(sg, config.reads))]
    e.operators = list(forward)
    pred = config.reads
    target = e.tensor("target", *config.loss.target(e.shape(pred)))
    weights = [i for _, i in config.trainable]
    values = [(name, np.asarray(params[name], np.float32)) for name, _ in config.trainable]
    slot_values = config.optimizer.slots(values)
    slots = [e.tensor(name, v.shape, v.dtype.name) for name, v in slot_values]
    loss, grad = emit_loss(e, config.loss, pred, target)
    grads = _backward(e, sg, config, grad)
    weight_grads = [grads.get(i) if i in grads else e.const(np.zeros(e.shape(i), np.float32))
                    for i in weights]
    new_weights, new_slots = emit_update(e, config.optimizer, weights, weight_grads, slots)
    state_in = [*weights, *slots]
    state_out = [*new_weights, *new_slots]
    names = [name for name, _ in values] + [name for name, _ in slot_values]
    loss, state_out = _unread(e, loss), [_unread(e, t) for t in state_out]
    e.tensors[loss] = replace(e.tensors[loss], name="loss")
    for name, t in zip(names, state_out):
        e.tensors[t] = replace(e.tensors[t], name=f"new/{name}")
    inputs = (*sg.inputs, target, *state_in)
    outputs = (loss, *state_out)
    main = ir.Subgraph(0, "train_step", tuple(e.tensors), tuple(e.operators), inputs, outputs)
    signature = ir.SignatureDef(
        "train", 0, {e.tensors[i].name: i for i in inputs},
        {"loss": loss, **{name: t for name, t in zip(names, state_out)}})
    step = ir.Model((main, *(_detached(s) for s in model.subgraphs[1:])), model.file_identifier,
                    3 if model.format == "tflite" else 0,
                    "circle-jax training step (functional)", {}, (signature,))
    return TrainingStep(step, tuple(values + slot_values), tuple(state_in))


def _backward(e: Emitter, sg: ir.Subgraph, config: StepConfig, grad: int) -> dict[int, int]:
    """The cotangent of every tensor on the trainable path, from ``grad`` (the cotangent of
    the tensor the loss reads), the operators visited last to first."""
    ops, path = _backward_ops(sg, config)
    cot = {config.reads: grad}
    for op in reversed(ops):
        grads = tuple(cot.get(y) for y in op.outputs)
        if all(g is None for g in grads):
            continue
        wanted = _wanted(op, path)
        b = Backward(e, op, grads[0] if grads[0] is not None else -1, wanted, grads)
        if grads[0] is None:
            b = replace(b, grad=b.cotangent(0))
        for pos, g in RULES[op.key].backward(b).items():
            if pos not in wanted:
                continue
            x = op.inputs[pos]
            cot[x] = e.add(cot[x], g) if x in cot else g
    return cot
