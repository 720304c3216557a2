"""``export_training_graph``: the training step circle-jax's ``fit`` takes, as a file any
inference runtime runs.

A `TrainConfig` (with the model's circle+ values and the defaults, as ``fit`` resolves
it) and the model's numerics profile decide the step: the trainable set
(`circle_jax.train.select_trainable`: the last N operators' weights and biases, or named
params), the loss and how it reads the output (`circle_jax.train.numerics`: a SOFTMAX's
probabilities clipped, or its input logits), the optimizer's numerics (Adam's eps
placement). They become a `circle_jax.passes.training_graph.StepConfig`, whose pass builds
the step graph; here it is written as bytes, with its initial state as a ``.wof``.

Packaging ``signatures`` (`circle_jax.passes.training_graph.signature_model`): resource
variables initialised through CALL_ONCE, signatures ``train``, ``infer``, ``save``,
``restore``, LiteRT's on-device training file without Flex operators.

Packaging ``functional``: subgraph 0 is the pure step (inputs: the model's inputs, the
targets, the state; outputs: the loss, the new state, `circle_jax.passes.training_graph`);
a runtime trains by feeding each step's new state into the next. The ``.wof`` holds the
initial state (buffer k = tensor k of subgraph 0: the state inputs' values, no buffer for
the other tensors).

A model of several signatures exports the step of its main one (subgraph 0, or the one
``load(signature=...)`` picked): the subgraphs it never runs are dropped, and the weights
only they read take no gradient from that step (``fit`` leaves them as they are) and are
not in the file.

A model whose subgraph 0 holds STABLEHLO_COMPOSITE operators is exported with their
decompositions inlined, its loops of a static trip count (a converted Keras RNN's WHILE)
and its plain LSTM layers unrolled into their iterations (`exportable`): those builtin
operators have backward rules, and the exported forward computes what circle-jax runs.

What the step cannot take is refused in one line (`ConfigError`, or
`UnsupportedOperatorError` naming every operator without a backward rule on the trainable
path) before anything is written: optimizers other than SGD (with or without momentum,
Nesterov's too) and Adam,
torch's optimizer family, Keras's normalising probability clip, a model whose graph does not
follow the batch at a batch size other than its declared one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError
from ..formats.wof import encode_wof
from ..formats.writer import write_model
from ..graph.batching import free_axes
from ..losses import get_clip, loss_name
from ..model import Model
from ..optim import hyperparameters, optimizer_name
from ..passes.composite import COMPOSITE, inline_composites
from ..passes.loops import unroll_static_whiles
from ..passes.recurrent import LSTM, unroll_lstms
from ..passes.signature import keep_reachable, reachable, runs
from ..passes.training_graph import (
    LossSpec,
    OptimizerSpec,
    StepConfig,
    functional_step,
    signature_model,
)
from ..train import TrainConfig, select_trainable
from ..train.config import check_loss_output, output_index, training_reduction
from ..train.numerics import training_numerics

PACKAGINGS = ("functional", "signatures")
_PLACEMENT_OF = {"adam": None, "adam_optax": "optax", "adam_onert_micro": "onert_micro"}


@dataclass(frozen=True)
class TrainingExport:
    """An exported training step: the model file's bytes, the initial state as ``.wof``
    bytes (functional packaging; None for signatures, whose file initialises its variables),
    the names of subgraph 0's inputs and outputs in order, and the initial state (state
    name -> value, in the graph's order)."""

    model: bytes
    wof: bytes | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    state: dict[str, np.ndarray]


def export_training_graph(model: Model, config: TrainConfig | None = None, *,
                          params: Mapping[str, Any] | None = None,
                          packaging: str = "functional", file_format: str = "tflite",
                          input_shapes: Sequence[Sequence[int]] | None = None,
                          **overrides: Any) -> TrainingExport:
    """``model``'s training step as builtin operators (module docstring), its state
    initialised from ``params`` (default: the model's). ``config`` with ``overrides``
    (`TrainConfig` fields: ``loss``, ``optimizer``, ``learning_rate``, ``batch_size``,
    ``trainable``, ``reduction``, ``from_logits``, ``loss_output``, ``optimizer_kwargs``,
    ``numerics``) is resolved as ``fit`` resolves it; ``file_format`` "tflite" or "circle".
    ``input_shapes``: each input's shape in the step, batch first (default: the declared
    ones at the batch size); needed where an input's shape signature leaves a dimension
    past the batch dynamic, whose declared size is a placeholder."""
    if packaging not in PACKAGINGS:
        raise ConfigError(f"unknown training-graph packaging {packaging!r}: expected one of "
                          f"{', '.join(PACKAGINGS)}")
    flat = exportable(model)
    params = {k: np.asarray(v) for k, v in (model.params if params is None else params).items()}
    step = step_config(flat, config, trainable_of=model, input_shapes=input_shapes,
                       **overrides)
    model = flat
    built = functional_step(model.ir, step, params)
    if packaging == "signatures":
        try:
            packed = signature_model(model.ir, step, built)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        sg = packed.main
        return TrainingExport(write_model(packed, file_format, share_equal_buffers=True), None,
                              tuple(sg.tensors[i].name for i in sg.inputs),
                              tuple(sg.tensors[i].name for i in sg.outputs),
                              {name: value for name, value in built.state})
    sg = built.model.main
    buffers: list[np.ndarray | None] = [None] * len(sg.tensors)
    for (_, value), i in zip(built.state, built.state_inputs):
        buffers[i] = value
    return TrainingExport(write_model(built.model, file_format, share_equal_buffers=True),
                          encode_wof(buffers),
                          tuple(sg.tensors[i].name for i in sg.inputs),
                          tuple(sg.tensors[i].name for i in sg.outputs),
                          {name: value for name, value in built.state})


def exportable(model: Model) -> Model:
    """The model the step is built from: ``model`` with subgraph 0's composites inlined, its
    loops of a static trip count and its plain LSTM layers unrolled
    (`circle_jax.passes.unroll_static_whiles`, `circle_jax.passes.unroll_lstms`), the
    subgraphs subgraph 0 does not run (any more) dropped (same lowering and numerics);
    ``model`` itself when there is none."""
    if not any(op.type in (COMPOSITE, LSTM, "WHILE") for op in model.ir.main.operators) \
            and not _unreached(model):
        return model
    flat = keep_reachable(unroll_lstms(unroll_static_whiles(inline_composites(model.ir))))
    return Model(flat, model.lowering, model.numerics)


def step_config(model: Model, config: TrainConfig | None = None, *,
                trainable_of: Model | None = None,
                input_shapes: Sequence[Sequence[int]] | None = None,
                **overrides: Any) -> StepConfig:
    """The `StepConfig` of ``model`` trained with ``config`` and ``overrides`` (see
    `export_training_graph`); ConfigError (one line) for what the step cannot take.
    ``trainable_of``: the model whose operators and params the trainable set is chosen
    from (default ``model``): the loaded model, when ``model`` is its `exportable` form
    (``--num_of_trainable_ops N`` counts the file's operators, not the unrolled ones)."""
    cfg = (config or TrainConfig())
    if overrides:
        from dataclasses import replace

        cfg = replace(cfg, **overrides)
    cfg = cfg.with_defaults(model)
    for field, default in (("accumulate", 1), ("loss_scale", "none"), ("precision", None),
                           ("ignore_index", None)):
        if getattr(cfg, field) != default:
            raise ConfigError(f"the exported training step does not take {field}="
                              f"{getattr(cfg, field)!r}")
    loss, opt = loss_name(cfg.loss), optimizer_name(cfg.optimizer)
    output = output_index(model, cfg.loss_output)
    check_loss_output(model, cfg, output)
    reduction = training_reduction(cfg.reduction)
    num = training_numerics(model, loss, opt, cfg.numerics, cfg.from_logits, cfg.clip,
                            dict(cfg.optimizer_kwargs), output=output)
    if num.optimizers != "keras":
        raise ConfigError(f"the exported training step takes the keras optimizer family; the "
                          f"numerics profile {num.numerics.name!r} takes {num.optimizers}'s")
    loss_spec = _loss_spec(loss, reduction.value, num)
    opt_spec = _optimizer_spec(opt, float(cfg.learning_rate), num.optimizer_kwargs,
                               float(cfg.batch_size) if num.sum_gradients else 1.0)
    chosen_from = trainable_of or model
    names = select_trainable(chosen_from, cfg.trainable) - _unreached(chosen_from)
    if not names:
        raise ConfigError("nothing trains: the trainable set is empty (expected "
                          "--num_of_trainable_ops -1 or N > 0, or params named)")
    keys = model.param_keys
    outside = sorted(n for n in names if n not in keys or keys[n][0] != 0)
    if outside:
        held = {keys[n][0] for n in outside if n in keys}
        raise ConfigError(f"{', '.join(_runners(model, held)) or 'another subgraph'} reads "
                          f"the trainable params {outside}: a loop whose trip count is not "
                          "static, or a branch, has no backward the step can write")
    trainable = tuple((n, keys[n][1]) for n in sorted(names, key=lambda n: keys[n][1]))
    reads = num.logits_of[0] if num.logits_of else model.ir.main.outputs[output]
    return StepConfig(loss_spec, opt_spec, reads, trainable,
                      _batch_shapes(model, int(cfg.batch_size), input_shapes))


def _runners(model: Model, subgraphs: set[int]) -> list[str]:
    """The operators of subgraph 0 that run any of ``subgraphs``, directly or not."""
    return [f"{op.type} #{i}" for i, op in enumerate(model.ir.main.operators)
            if any(reachable(model.ir, v) & subgraphs for v in runs(model.ir, op))]


def _unreached(model: Model) -> frozenset[str]:
    """The params of the subgraphs subgraph 0 never runs (another signature's): no operator
    of the step reads them, so they take no gradient (``fit`` leaves them as they are)."""
    reached = reachable(model.ir, 0)
    return frozenset(n for n, (k, _) in model.param_keys.items() if k not in reached)


def _loss_spec(loss: str, reduction: str, num: Any) -> LossSpec:
    beta = num.logits_of[1] if num.logits_of else 1.0
    if loss == "mean_squared_error" or num.from_logits:
        return LossSpec(loss, reduction, num.from_logits, beta)
    clip = get_clip(num.clip)
    if clip.normalize or clip.eps_max is not None:
        raise ConfigError("the exported training step clips probabilities below only "
                          f"(onert's max(p, eps)); the clip {num.clip!r} also normalises or "
                          "clips above: use the onert numerics or from_logits")
    return LossSpec(loss, reduction, False, beta, clip.eps_min)


def _optimizer_spec(name: str, lr: float, kwargs: Mapping[str, Any], grad_scale: float
                    ) -> OptimizerSpec:
    if name in ("sgd", "momentum", "nesterov"):
        hyper = hyperparameters(name, **kwargs)  # refuses keywords the optimizer does not take
        momentum = float(hyper.get("momentum") or 0.0)
        nesterov = name == "nesterov" or bool(kwargs.get("nesterov", False))
        if not momentum:
            if nesterov:
                raise ConfigError("nesterov=True needs a non-zero momentum")
            return OptimizerSpec("sgd", lr)
        if not 0 <= momentum <= 1:
            raise ConfigError(f"momentum must be in [0, 1], got {momentum}")
        return OptimizerSpec("momentum", lr, momentum=momentum, nesterov=nesterov)
    if name not in _PLACEMENT_OF:
        raise ConfigError(f"the exported training step takes sgd, momentum, nesterov or adam, "
                          f"not {name!r}")
    kwargs = dict(kwargs)
    placement = _PLACEMENT_OF[name] or kwargs.pop("eps_placement", "tf")
    hyper = hyperparameters(name, **kwargs)
    return OptimizerSpec("adam", lr, float(hyper["beta1"]), float(hyper["beta2"]),
                         float(hyper["epsilon"]), placement, grad_scale)


def _batch_shapes(model: Model, batch: int, input_shapes: Sequence[Sequence[int]] | None
                  ) -> dict[int, tuple[int, ...]]:
    """Every tensor's shape of subgraph 0 at ``batch`` samples, the inputs of
    ``input_shapes`` or of their declared shapes past the batch (circle-jax's own shape
    propagation); refused when the graph does not follow the batch, when an input's shape
    signature leaves a dimension past the batch dynamic and no shape is given, and when a
    given shape's rank or batch does not fit."""
    declared = model.inputs[0].shape[0] if model.inputs and model.inputs[0].shape else None
    if batch != declared and model.batch_blocker is not None:
        raise ConfigError(f"batch size {batch}: the graph does not follow the batch "
                          f"({model.batch_blocker}); export at its declared batch {declared}")
    shapes = [(batch, *s.shape[1:]) for s in model.inputs]
    if input_shapes is None:
        for s, i in zip(model.inputs, model.ir.main.inputs):
            t = model.ir.main.tensors[i]
            if free_axes(t):
                raise ConfigError(
                    f"input {s.name!r} declares {list(s.shape)} for the dynamic shape "
                    f"{list(t.shape_signature)}: give its shape in the step (input_shapes, "
                    "--input_shapes)")
    else:
        shapes = [tuple(int(d) for d in s) for s in input_shapes]
        if len(shapes) != len(model.inputs) or any(
                len(s) != len(t.shape) or s[0] != batch for s, t in zip(shapes, model.inputs)):
            raise ConfigError(
                f"input_shapes {[list(s) for s in shapes]}: expected one shape per input, "
                f"of the declared ranks {[len(t.shape) for t in model.inputs]}, each of "
                f"batch {batch}")
    specs = [jax.ShapeDtypeStruct(shape, np.dtype(s.dtype))
             for shape, s in zip(shapes, model.inputs)]
    _, tensors = jax.eval_shape(lambda *xs: model.tensors(model.params, *xs), *specs)
    shapes = {i: tuple(t.shape) for i, t in tensors.items()}
    for i, s in zip(model.ir.main.inputs, specs):
        shapes[i] = s.shape
    return shapes
