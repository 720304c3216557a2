"""Golden data: what every tensor of a model holds, forward and backward, for one batch.

``golden`` computes, for the main subgraph of a loaded model:

- the inputs and outputs, in model order;
- every tensor after the forward pass (constants included), keyed by tensor index;
- with expected outputs: the loss of the training configuration, dLoss/dTensor for every
  float tensor it depends on (inputs, activations and float params, whether they train or
  not), and the params after one optimizer step on the whole batch.

A quantization-aware training model (``load(path, qat=True)``) gives the integer model's
golden data for its current weights (the file's at the start): its inputs, outputs and every
tensor as the integer kernels compute them (each quantized tensor carries its ``scale``,
``zero_point`` and ``quantized_dimension`` as h5 attributes), with the float gradients and
update of the QAT step (the simulation's tensors have the file's tensor indices). An integer
input of such a model takes data in its own dtype as the stored integers (written as given,
dequantized with the input's scale and zero point for the QAT forward) or float data as real
values (quantized with the file's parameters, round half away from zero and clamped, as
LiteRT's QUANTIZE). A dequantized model's input takes data in the file's integer dtype as
those stored integers too, dequantized (`TensorSpec.stored`). A model loaded without ``qat``
runs its integer kernels directly: its tensors are the same, with the same attributes.

Each part (the forward, the gradients, the step) runs as one compiled program, as training
does: the golden values are what the training program computes, and a large model takes
seconds, not the minutes of one compile per operator. Everything is computed in ``dtype``
(float64: the arbiter's ground truth; inputs and float params are cast up, and training runs
under the float64 precision policy). The tensors are those of the loaded model: untied
copies and added biases (`circle_jax.passes`) are tensors of their own, appended after the
file's; the index records where each came from.
``write_golden`` writes the files ONE's tools read (`circle_jax.oracle.h5`), luci-value-
test's raw layout on request, and ``index.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from ..formats.atomic import atomic_write
from ..graph import ir
from ..graph.batching import check_input_count
from ..graph.quantization import quantize
from ..model import Model, load
from ..train import TrainConfig, Trainer
from .h5 import Entry, write_h5

DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class GoldenData:
    """The golden tensors of one batch (see the module docstring); ``tensor_of`` maps each
    input/output key ("0"...) to its tensor index; ``settings`` holds the dtype and the
    training hyper-parameters used."""

    inputs: list[Entry]
    outputs: list[Entry]
    tensors: list[Entry]
    tensor_of: dict[str, dict[str, int]]
    settings: dict[str, Any]
    targets: list[Entry] | None = None
    gradients: list[Entry] | None = None
    updated: list[Entry] | None = None
    loss: float | None = None
    trainable: frozenset[int] = field(default_factory=frozenset)


def golden(model: Model, inputs: Sequence[Any], expected: Any = None,
           config: TrainConfig | None = None, *, dtype: str = "float32") -> GoldenData:
    """The golden tensors of ``model`` for the batch ``inputs`` (one array per model input,
    samples on axis 0); with ``expected`` (the targets of the config's ``loss_output``,
    default output 0) also the loss, the
    gradients and the params after one step of ``config`` (its batch size is the batch's)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dt = np.dtype(dtype)
    sg = model.ir.main
    check_input_count(len(sg.inputs), len(inputs))
    inputs = [np.asarray(x) for x in inputs]
    with jax.enable_x64(dt == np.float64):
        xs = [_cast(_real(model, k, x), dt) for k, x in enumerate(inputs)]
        params = {k: _cast(v, dt) for k, v in model.params.items()}
        outs, env, traced = _tensors(model, params, xs)
        index_of = {name: i for name, (k, i) in model.param_keys.items() if k == 0}
        name_of = {i: name for name, i in index_of.items()}
        tensors = []
        for t in sg.tensors:
            value = env.get(t.index)
            if value is None:
                value = params[name_of[t.index]] if t.index in name_of else t.data
            if value is not None:
                tensors.append(Entry(str(t.index), t.name, np.asarray(value), _attrs(t)))
        data = GoldenData(
            inputs=[Entry(str(k), sg.tensors[i].name, np.asarray(x), _attrs(sg.tensors[i]))
                    for k, (i, x) in enumerate(zip(sg.inputs, xs))],
            outputs=[Entry(str(k), sg.tensors[i].name, np.asarray(o), _attrs(sg.tensors[i]))
                     for k, (i, o) in enumerate(zip(sg.outputs, outs))],
            tensors=tensors,
            tensor_of={"input": {str(k): i for k, i in enumerate(sg.inputs)},
                       "expected": {str(k): i for k, i in enumerate(sg.outputs)}},
            settings={"dtype": dtype, "samples": int(np.shape(xs[0])[0]),
                      "numerics": model.numerics.as_dict(),
                      "lowering": "fast" if model.lowering.fast else "reference",
                      "untied_copies": dict(model.rewrites.untied),
                      "added_biases": list(model.rewrites.added_bias)})
        if expected is not None:
            data = _backward(model, data, xs, params, env, traced, _cast(expected, dt), config,
                             dt, index_of)
    return data if model.simulated is None else _integer(model, data, inputs)


def input_dtypes(model: Model) -> list[np.dtype]:
    """The dtype of each input's data as the model's file defines it: an input the file
    stores as quantized integers and the loaded model takes as real values (a QAT or
    dequantized model, `TensorSpec.stored`) takes those integers (int8 for an int8 input),
    every other input the loaded model's dtype (`golden` takes both; the command line reads
    these)."""
    return [np.dtype(s.dtype) if s.stored is None else s.stored.np_dtype
            for s in model.inputs]


def _real(model: Model, k: int, x: np.ndarray) -> np.ndarray:
    """Input ``k`` as the real values the loaded model takes: data in the integer dtype its
    file stores the input in (`TensorSpec.stored`) is those integers, dequantized with the
    input's scale and zero point; float data is taken as real values; other inputs as
    given."""
    q = model.inputs[k].stored
    if q is None or np.issubdtype(x.dtype, np.floating):
        return x
    if x.dtype != q.np_dtype:
        raise ValueError(f"input {k} {model.inputs[k].name!r} is {x.dtype}, expected "
                         f"{q.np_dtype} (the stored integers) or float (real values)")
    return q.real(x)


def _integer(model: Model, data: GoldenData, inputs: Sequence[Any]) -> GoldenData:
    """``data`` with the inputs, outputs and tensors of the integer model that QAT model
    ``model`` exports (see the module docstring)."""
    integer = load(model.export())
    sg = integer.ir.main
    xs = [_quantized(np.asarray(x), sg.tensors[i]) for x, i in zip(inputs, sg.inputs)]
    outs, env, _ = _tensors(integer, integer.params, xs)
    tensors = []
    for t in sg.tensors:
        value = env.get(t.index, t.data)
        if value is not None:
            tensors.append(Entry(str(t.index), t.name, np.asarray(value), _attrs(t)))
    return replace(
        data, tensors=tensors,
        inputs=[Entry(str(k), sg.tensors[i].name, x, _attrs(sg.tensors[i]))
                for k, (i, x) in enumerate(zip(sg.inputs, xs))],
        outputs=[Entry(str(k), sg.tensors[i].name, np.asarray(o), _attrs(sg.tensors[i]))
                 for k, (i, o) in enumerate(zip(sg.outputs, outs))],
        settings={**data.settings, "integer_tensors": "the integer kernels' (tensors.h5)",
                  "gradients": "quantization-aware training's (float)"})


def _tensors(model: Model, params: dict, xs: Sequence[Any]
             ) -> tuple[tuple[Any, ...], dict[int, Any], frozenset[int]]:
    """``model.tensors`` compiled: (outputs, every computed tensor, the indices of those
    that depend on the inputs or params, as opposed to constants folded at load)."""
    traced: set[int] = set()

    def run(p: dict, *x: Any) -> tuple[tuple[Any, ...], dict[int, Any]]:
        outs, env = model.tensors(p, *x)
        traced.update(i for i, v in env.items() if isinstance(v, jax.core.Tracer))
        return outs, env

    outs, env = jax.jit(run)(params, *xs)
    return outs, env, frozenset(traced)


def _attrs(t: ir.Tensor) -> dict[str, Any]:
    """A quantized tensor's parameters as h5 attributes (none for other tensors)."""
    q = t.quantization
    if q is None or t.dtype.startswith("float"):
        return {}
    return {"scale": np.asarray(q.scale, np.float32),
            "zero_point": np.asarray(q.zero_point, np.int64),
            "quantized_dimension": q.quantized_dimension}


def _quantized(x: np.ndarray, t: ir.Tensor) -> np.ndarray:
    """Real-valued ``x`` quantized for integer input ``t`` (round half away from zero, as
    LiteRT's QUANTIZE); ``x`` as it is for a float input."""
    q = t.quantization
    if q is None or t.dtype.startswith("float") or not np.issubdtype(x.dtype, np.floating):
        return x
    info = np.iinfo(ir.as_numpy_dtype(t.dtype))
    return quantize(x, q.scale[0], q.zero_point[0], info.min, info.max).astype(info.dtype)


def _cast(x: Any, dt: np.dtype) -> np.ndarray:
    """``x`` on the host, float in ``dt`` (numpy: no compile per shape)."""
    a = np.asarray(x)
    return a.astype(dt) if np.issubdtype(a.dtype, np.floating) else a


def _backward(model: Model, data: GoldenData, xs: list, params: dict, env: dict,
              traced: frozenset[int], y: Any, config: TrainConfig | None, dt: np.dtype,
              index_of: Mapping[str, int]) -> GoldenData:
    """``data`` with the loss, the gradients (with respect to the float tensors in
    ``traced``) and the one-step update."""
    cfg = replace(config or TrainConfig(), batch_size=int(np.shape(xs[0])[0]),
                  precision="float64" if dt == np.float64 else None)
    trainer = Trainer(model, cfg)
    logits_of, k = trainer.numerics.logits_of, trainer.loss_output
    sg = model.ir.main
    floats = {k: v for k, v in params.items() if np.issubdtype(v.dtype, np.floating)}
    others = {k: v for k, v in params.items() if k not in floats}
    taps = {i: np.zeros(v.shape, v.dtype) for i, v in env.items()
            if i in traced and np.issubdtype(v.dtype, np.floating)}

    def loss_of(p: dict, tapped: dict) -> jax.Array:
        outs, values = model.tensors({**p, **others}, *xs, taps=tapped)
        pred = outs[k] if logits_of is None else values[logits_of[0]] * logits_of[1]
        return trainer.loss_fn(pred.astype(trainer.loss_dtype), y)

    loss, (dparams, dtaps) = jax.jit(jax.value_and_grad(loss_of, argnums=(0, 1)))(floats,
                                                                                   taps)
    grads = {i: g for i, g in dtaps.items()}
    grads.update({index_of[k]: g for k, g in dparams.items() if k in index_of})
    state, frozen = trainer.init(params)
    state, _ = jax.jit(trainer.train_step)(state, frozen, (tuple(xs), y))
    after = {**frozen, **state.params}
    trained = {index_of[k] for k in trainer.trainable if k in index_of}
    return replace(
        data,
        targets=[Entry(str(k), sg.tensors[sg.outputs[k]].name, np.asarray(y))],
        gradients=[Entry(str(i), sg.tensors[i].name, np.asarray(grads[i]))
                   for i in sorted(grads)],
        updated=[Entry(str(index_of[k]), k, np.asarray(v))
                 for k, v in sorted(after.items(), key=lambda kv: index_of.get(kv[0], -1))
                 if k in index_of],
        loss=float(loss), trainable=frozenset(trained),
        settings={**data.settings, **_hyper(trainer)})


def _hyper(trainer: Trainer) -> dict[str, Any]:
    """The training hyper-parameters golden used, as plain values."""
    from ..losses import get_reduction, loss_name
    from ..optim import optimizer_name

    c = trainer.config
    return {"loss": loss_name(c.loss), "reduction": get_reduction(c.reduction).value,
            "optimizer": optimizer_name(c.optimizer), "learning_rate": c.learning_rate,
            "optimizer_kwargs": {k: v if isinstance(v, (int, float, str, bool)) else str(v)
                                 for k, v in trainer.numerics.optimizer_kwargs.items()},
            "from_logits": trainer.numerics.from_logits,
            "loss_reads": ("the softmax input of " if trainer.numerics.logits_of else "")
            + f"output {trainer.loss_output}",
            "trainable": sorted(trainer.trainable)}


FILES = ("input.h5", "expected.h5", "tensors.h5", "targets.h5", "gradients.h5", "updated.h5")


def write_golden(data: GoldenData, directory: str | os.PathLike,
                 luci_name: str | None = None) -> list[str]:
    """Write ``data`` under ``directory``: ``input.h5``, ``expected.h5`` (the model's
    outputs), ``tensors.h5``; with a loss also ``targets.h5``, ``gradients.h5`` (root
    attribute ``loss``) and ``updated.h5``; ``index.json`` listing every file, tensor, dtype
    and shape with the settings. ``luci_name`` (e.g. "model.circle") also writes
    luci-value-test's ``NAME.inputN``, ``NAME.outputN``, ``.outputN.shape`` and
    ``.outputN.dtype``. Returns the paths written."""
    os.makedirs(directory, exist_ok=True)
    roles = {"input.h5": data.inputs, "expected.h5": data.outputs, "tensors.h5": data.tensors,
             "targets.h5": data.targets, "gradients.h5": data.gradients,
             "updated.h5": data.updated}
    written, index = [], {}
    for name, entries in roles.items():
        if entries is None:
            continue
        path = os.path.join(directory, name)
        write_h5(path, entries, {"loss": data.loss} if name == "gradients.h5" else None)
        written.append(path)
        of = data.tensor_of.get(name[:-3], {})
        index[name] = [{"key": e.key, "name": e.name, "tensor": of.get(e.key, _int(e.key)),
                        "dtype": str(e.value.dtype), "shape": list(e.value.shape),
                        **({"quantization": {k: np.asarray(v).tolist()
                                             for k, v in e.attrs.items()}} if e.attrs else {})}
                       for e in entries]
    if luci_name:
        written += _write_luci(data, directory, luci_name)
    path = os.path.join(directory, "index.json")
    doc = {"settings": data.settings, "loss": data.loss,
           "trainable_tensors": sorted(data.trainable), "files": index,
           "luci": [os.path.basename(p) for p in written if not p.endswith(".h5")]}
    atomic_write(path, json.dumps(doc, indent=1).encode())
    return [*written, path]


def _int(key: str) -> int | None:
    return int(key) if key.isdigit() else None


def _write_luci(data: GoldenData, directory: str | os.PathLike, name: str) -> list[str]:
    """luci-value-test's files: raw little-endian values, shapes as "d0,d1,...", dtypes."""
    files: dict[str, bytes] = {}
    for e in data.inputs:
        files[f"{name}.input{e.key}"] = _raw(e.value)
    for e in data.outputs:
        files[f"{name}.output{e.key}"] = _raw(e.value)
        files[f"{name}.output{e.key}.shape"] = ",".join(map(str, e.value.shape)).encode()
        files[f"{name}.output{e.key}.dtype"] = str(e.value.dtype).encode()
    paths = []
    for file, raw in files.items():
        paths.append(os.path.join(directory, file))
        atomic_write(paths[-1], raw)
    return paths


def _raw(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
