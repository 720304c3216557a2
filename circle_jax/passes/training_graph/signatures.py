"""The ``signatures`` packaging: the training step over resource variables, as LiteRT's
on-device training files hold it (`SIGNATURES`, no Flex operator).

Every state value of the functional step (`step.functional_step`: the trainable weights,
then the optimizer's slots) becomes a variable named by its state name (VAR_HANDLE's
``shared_name``). Subgraphs, each starting with CALL_ONCE of the last one:

- ``train``: inputs the model's inputs and ``target``; reads the variables, runs one step,
  assigns the new state; output ``loss``;
- ``infer``: the model's inputs -> its outputs, the weights read from the variables, at the
  model's declared shapes;
- ``save``: no inputs; outputs every variable's value, by state name;
- ``restore``: inputs every variable's value, by state name; assigns them (no outputs);
- the initialiser (no signature): assigns each variable its initial value, a constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ...formats.schema import OPERATOR_CODES
from ...graph import ir
from .emit import Emitter
from .step import StepConfig, TrainingStep, forward_tensors

SIGNATURES = ("train", "infer", "save", "restore")


class _Graph:
    """One subgraph: an emitter for its tensors, its operators listed in order."""

    def __init__(self, tensors: Sequence[ir.Tensor], init_index: int) -> None:
        self.e = Emitter(tensors, ())
        self.ops: list[tuple[str, tuple[int, ...], tuple[int, ...], dict]] = [
            ("CALL_ONCE", (), (), {"init_subgraph_index": init_index})]

    def handle(self, name: str) -> int:
        h = self.e.tensor(f"{name}/handle", (), "resource")
        self.ops.append(("VAR_HANDLE", (), (h,), {"container": "", "shared_name": name}))
        return h

    def read(self, name: str, into: int) -> int:
        """READ_VARIABLE ``name`` into tensor ``into``; its handle."""
        h = self.handle(name)
        self.ops.append(("READ_VARIABLE", (h,), (into,), {}))
        return h

    def assign(self, handle: int, value: int) -> None:
        self.ops.append(("ASSIGN_VARIABLE", (handle, value), (), {}))

    def extend(self, operators: Sequence[ir.Operator]) -> None:
        self.ops.extend((op.type, op.inputs, op.outputs, dict(op.options)) for op in operators)

    def subgraph(self, index: int, name: str, inputs: Sequence[int], outputs: Sequence[int]
                 ) -> ir.Subgraph:
        ops = tuple(ir.Operator(k, t, OPERATOR_CODES[t], tuple(i), tuple(o), ir.Options(opts))
                    for k, (t, i, o, opts) in enumerate(self.ops))
        return ir.Subgraph(index, name, tuple(self.e.tensors), ops, tuple(inputs),
                           tuple(outputs))


def signature_model(model: ir.Model, config: StepConfig, step: TrainingStep) -> ir.Model:
    """``step`` (the functional packaging of ``model`` under ``config``) packaged with
    resource variables and the `SIGNATURES` (module docstring)."""
    if len(model.subgraphs) > 1:  # the forward's own subgraphs would need renumbering
        raise ValueError("the signatures packaging takes single-subgraph models; use the "
                         "functional packaging")
    names = [name for name, _ in step.state]
    init = len(SIGNATURES)
    fn = step.model.main
    n_in = len(model.main.inputs)
    # train: the functional step with its state read from, and written to, the variables
    train = _Graph(fn.tensors, init)
    handles = [train.read(name, i) for name, i in zip(names, step.state_inputs)]
    train.extend(fn.operators)
    for h, new in zip(handles, fn.outputs[1:]):
        train.assign(h, new)
    train_sg = train.subgraph(0, "train", fn.inputs[:n_in + 1], fn.outputs[:1])
    # infer: the model's forward at its declared shapes, the weights read
    infer = _Graph(forward_tensors(model.main, replace(config, shapes={})), init)
    for name, i in config.trainable:
        infer.read(name, i)
    infer.extend([replace(op, origin=None) for op in model.main.operators])
    infer_sg = infer.subgraph(1, "infer", model.main.inputs, model.main.outputs)
    # save and restore
    save, restore = _Graph((), init), _Graph((), init)
    values = [save.e.tensor(name, v.shape, v.dtype.name) for name, v in step.state]
    for name, t in zip(names, values):
        save.read(name, t)
    given = [restore.e.tensor(name, v.shape, v.dtype.name) for name, v in step.state]
    for name, t in zip(names, given):
        restore.assign(restore.handle(name), t)
    save_sg = save.subgraph(2, "save", (), values)
    restore_sg = restore.subgraph(3, "restore", given, ())
    # the initialiser
    first = _Graph((), -1)
    first.ops.clear()
    for name, value in step.state:
        first.assign(first.handle(name), first.e.const(np.asarray(value), value.dtype.name))
    init_sg = first.subgraph(init, "initialise_variables", (), ())

    def sig(key: str, sg: ir.Subgraph) -> ir.SignatureDef:
        return ir.SignatureDef(key, sg.index, {sg.tensors[i].name: i for i in sg.inputs},
                               {sg.tensors[i].name: i for i in sg.outputs})

    subgraphs = (train_sg, infer_sg, save_sg, restore_sg, init_sg)
    return replace(step.model, subgraphs=subgraphs, description="circle-jax training step "
                   "(signatures)", signature_defs=tuple(sig(k, s) for k, s in
                                                        zip(SIGNATURES, subgraphs)))
