"""``circle_jax.load``: a model file becomes a pure ``apply`` plus a params pytree."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .errors import (
    CircleFormatError,
    CircleJaxError,
    ConfigError,
    TrainingError,
)
from .formats.reader import MAX_TENSOR_ELEMENTS, parse_model, read_bytes
from .formats.writer import with_weights, write_model
from .graph import ir
from .graph.aliases import param_aliases, resolve_param_names
from .graph.checks import check_graph
from .graph.params_policy import CONTROL_FLOW, ParamRole, classify_params, describe_roles
from .graph.quantization import QParams, as_real_inputs, stored_integers
from .lowering import LoweringOptions
from .lowering.interpreter import RANGES, Lowered, ParamKey, param_table
from .numerics import Numerics, get_numerics
from .ops import fake_quant as fq
from .passes import (
    adapter_names,
    bias_selection,
    check_lora_options,
    check_personalizable,
    merge_lora,
    personal_params,
    personalize,
    pipeline_stages,
    ran,
    requantize_weights,
    run,
    run_stages,
)
from .passes.dequantize import describe_quantization, is_quantized
from .passes.fake_quant import fake_quant_plan, moving_ranges
from .passes.qat import QAT_SOFTMAX_CCE, QatSettings, integer_model
from .passes.stages import dequantized_in_layout
from .signatures.source import OnDeviceFile, restored_values


@dataclass(frozen=True)
class Rewrites:
    """The params the passes added: untied copies (copy name -> shared tensor name) and
    added biases (names), read from the model's pass records."""

    untied: dict[str, str] = field(default_factory=dict)
    added_bias: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.untied or self.added_bias)

    @classmethod
    def of(cls, model: ir.Model) -> Rewrites:
        changes = {r.name: r.changes for r in model.passes}
        return cls(dict(changes.get("untie_shared_constants", {})),
                   tuple(changes.get("add_missing_biases", {})))


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a model input or output; ``stored``: for a float input the
    model's file holds as quantized integers (a dequantized or quantization-aware training
    model), the file's integer dtype and quantization: data in that dtype is those stored
    integers (`circle_jax.train.data.model_input`)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stored: QParams | None = field(default=None, compare=False)


class Model:
    """A loaded model: ``apply(params, *inputs) -> tuple`` and its float weights ``params``.

    ``apply`` is pure: it reads weights only from the ``params`` argument, so it can be
    differentiated, jitted and vmapped. ``params`` maps unique tensor names to arrays.
    ``lowering`` chooses the operators' implementations (see :func:`load`). ``numerics`` is
    the profile training uses by default; ``param_roles`` says which params train under its
    trainable policy, and why; ``passes`` lists the graph passes `load` ran and what each
    changed, ``rewrites`` the untied copies and added biases among them (``original``: the
    model before those two, which export writes while they were not trained apart).
    ``quantized``: the weight-only quantized model ``model`` was dequantized from, whose
    layout export writes the weights back in (`circle_jax.passes.requantize_weights`).
    ``simulated``: the fully quantized model this one simulates by fake quantization
    (quantization-aware training: ``load(qat=True)``), which export writes; ``qat_forward``
    how, ``qat_ranges`` and ``qat_range_decay`` its activation ranges (see :func:`load`).
    ``stored``: the model a dequantized one was loaded from, whose quantized integer inputs
    give the inputs' `TensorSpec.stored` (QAT's come from ``simulated``).
    """

    def __init__(self, model: ir.Model, lowering: str | LoweringOptions | None = None,
                 numerics: Numerics | str | None = None,
                 original: ir.Model | None = None, *,
                 quantized: ir.Model | None = None,
                 simulated: ir.Model | None = None, stored: ir.Model | None = None,
                 qat_forward: str = "integer",
                 qat_ranges: str = "file", qat_range_decay: float = 0.999) -> None:
        self.ir = model
        self.rewrites = Rewrites.of(model)
        self._original = original if self.rewrites else None
        self._quantized = quantized
        self.numerics = get_numerics(numerics)
        #: the integer model this one simulates (None: not a QAT model)
        self.simulated = simulated
        self.fake_quant = None if simulated is None else fake_quant_plan(simulated)
        #: "integer" or "fake_quant" for a QAT model (see `load`), else None
        self.qat_forward = None if simulated is None else qat_forward
        #: "file" or "ema" for a QAT model (see `load`), else None; the moving average's decay
        self.qat_ranges = None if simulated is None else qat_ranges
        self.qat_range_decay = qat_range_decay
        if self.qat_ranges == "ema":
            self.fake_quant = replace(self.fake_quant, moving=moving_ranges(simulated))
        integer = simulated if self.qat_forward == "integer" else None
        self._lowered = Lowered(model, lowering, self.fake_quant, integer)
        self._variants: dict[tuple, Lowered] = {}
        self._compiled_apply = jax.jit(self._lowered.apply)
        self._control_flow = any(op.type in CONTROL_FLOW for sg in model.subgraphs
                                 for op in sg.operators)
        #: SHA-256 of the file and the load options (set by `load`; None otherwise): what
        #: the model's traced programs depend on besides their arguments
        self.digest: str | None = None
        #: the on-device training file loaded from (`circle_jax.signatures.source`) or None
        self.ondevice: Any = None
        self.param_keys: dict[str, ParamKey] = dict(self._lowered.params)
        # one transfer for all of them (an eager op per param would compile per shape)
        self.params: dict[str, jax.Array] = jax.device_put({
            name: model.subgraphs[k].tensors[i].data for name, (k, i) in self.param_keys.items()
        })
        self.param_roles: dict[str, ParamRole] = classify_params(
            model, self.param_keys, self.numerics.trainable_policy)
        sg = model.main
        #: the file's model as loaded before dequantizing, or QAT's integer model
        self._stored = simulated if stored is None else stored
        encodings = (stored_integers(self._stored, model) if self._stored is not None
                     else (None,) * len(sg.inputs))
        self.inputs = tuple(_spec(sg.tensors[i], q) for i, q in zip(sg.inputs, encodings))
        self.outputs = tuple(_spec(sg.tensors[i]) for i in sg.outputs)

    def apply(self, params: Mapping[str, Any], *inputs: Any, **observed: Any
              ) -> tuple[jax.Array, ...]:
        """The model's outputs for ``inputs``, in the model's output order (``observed=``:
        see `circle_jax.lowering.interpreter.Lowered.apply`).

        Called outside a trace it runs compiled (``jax.jit``, once per input shape): operator
        by operator JAX would compile each primitive on its first call (a MobileNet's first
        call 7 s against 1.0 s). Operator by operator run: a model with WHILE or IF (concrete
        conditions stay Python booleans, `circle_jax.ops.control`), a call without inputs
        (outputs folded from constants stay numpy, int64 included), and a call that raises
        a `CircleJaxError` (raised again there, without JAX's note on traced frames). Data
        in an input's `TensorSpec.stored` dtype is those integers, dequantized, as in `fit`."""
        inputs = as_real_inputs([s.stored for s in self.inputs], map(jnp.asarray, inputs), jnp)
        if observed or self._control_flow or not inputs:
            return self._lowered.apply(params, *inputs, **observed)
        try:
            return self._compiled_apply(params, *inputs)
        except CircleJaxError:
            return self._lowered.apply(params, *inputs)

    @property
    def batch_blocker(self) -> str | None:
        """None when a batch of N samples runs as one batched graph; else why the graph does
        not follow the batch (the first operator that pins dimension 0, see
        `circle_jax.graph.batching`): a batch-1 model then runs its batch-1 graph mapped over the
        samples, and another model runs only at its declared batch."""
        return self._lowered.batch_blocker

    @property
    def lowering(self) -> LoweringOptions:
        """The options the operators were lowered with."""
        return self._lowered.options

    def view(self, outputs: Sequence[int] | None = None, **changes: Any) -> Lowered:
        """The model's one lowering seen with ``changes`` to :attr:`lowering` (e.g.
        ``in_loop=True``) and/or other main-subgraph ``outputs`` (tensor indices, e.g. a
        SOFTMAX's input logits): `Lowered.with_options` / `Lowered.with_outputs`, kept per
        argument; no operator is lowered again."""
        key = (None if outputs is None else tuple(outputs), tuple(sorted(changes.items())))
        if key not in self._variants:
            view = self._lowered if outputs is None else self._lowered.with_outputs(outputs)
            self._variants[key] = view.with_options(**changes) if changes else view
        return self._variants[key]

    def lowered(self, **changes: Any) -> Callable[..., tuple[jax.Array, ...]]:
        """``apply`` lowered with ``changes`` to :attr:`lowering`, e.g. ``in_loop=True`` for a
        model traced inside a compiled loop body (a ``lax.scan`` over batches); a
        :meth:`view` of the one lowering."""
        variant = self.view(**changes)

        def apply(params: Mapping[str, Any], *inputs: Any, **observed: Any
                  ) -> tuple[jax.Array, ...]:
            return variant.apply(params, *(jnp.asarray(x) for x in inputs), **observed)

        return apply

    def intermediates(self, params: Mapping[str, Any], *inputs: Any) -> dict[str, jax.Array]:
        """Every tensor of the main subgraph, keyed by tensor name (for oracle dumps)."""
        return self._lowered.intermediates(params, *(jnp.asarray(x) for x in inputs))

    def tensors(self, params: Mapping[str, Any], *inputs: Any,
                taps: Mapping[int, Any] | None = None) -> tuple[tuple[jax.Array, ...],
                                                                dict[int, jax.Array]]:
        """(outputs, every computed tensor of the main subgraph keyed by tensor index);
        ``taps`` are added to the tensors of those indices where they are computed, so
        differentiating at zero taps gives the gradient with respect to each tensor."""
        return self._lowered.tensors(params, *(jnp.asarray(x) for x in inputs), taps=taps)

    @property
    def ranges(self) -> dict[str, np.ndarray]:
        """A ``qat_ranges="ema"`` model's moving activation ranges as the file gives them
        (group name -> float32 ``[min, max]``; `circle_jax.passes.fake_quant.moving_ranges`):
        training's initial values, which it moves and gives ``apply`` and ``export`` in the
        params under `circle_jax.lowering.interpreter.RANGES`. Empty for other models."""
        plan = self.fake_quant
        return {} if plan is None else {
            name: fq.file_range(plan.activations[(0, members[0])])
            for name, members in plan.moving.items()}

    def observe(self, params: Mapping[str, Any], *inputs: Any) -> dict[str, Any]:
        """Each moving range group's (min, max) over ``inputs`` before rounding
        (`circle_jax.lowering.interpreter.Lowered.observe`)."""
        return self._lowered.observe(params, *(jnp.asarray(x) for x in inputs))

    def __call__(self, *inputs: Any) -> tuple[jax.Array, ...]:
        """``apply`` with the model's own weights."""
        return self.apply(self.params, *inputs)

    @property
    def trainable_params(self) -> frozenset[str]:
        """The params that train under the model's trainable policy."""
        return frozenset(k for k, r in self.param_roles.items() if r.trainable)

    @property
    def operators(self) -> tuple[ir.Operator, ...]:
        return self.ir.main.operators

    def param_operators(self) -> dict[str, list[int]]:
        """For each param, the indices of the main-subgraph operators that read it."""
        readers: dict[str, list[int]] = {}
        for name, (k, i) in self.param_keys.items():
            if k == 0:
                readers[name] = [op.index for op in self.operators if i in op.inputs]
        return readers

    @property
    def aliases(self) -> dict[str, str]:
        """Param name -> short readable alias (``op3.bias``; see `circle_jax.graph.aliases`)."""
        return param_aliases(self.ir, self.param_keys)

    def resolve_params(self, names: Iterable[str]) -> frozenset[str]:
        """The param names meant by ``names``, each a param name or an alias."""
        return resolve_param_names(self.ir, self.param_keys, names)

    def export(
        self,
        params: Mapping[str, Any] | None = None,
        file_format: str | None = None,
        metadata: Mapping[str, bytes | None] | None = None,
        *,
        merge_adapters: bool = True,
    ) -> bytes:
        """The model file's bytes with ``params`` written in (default: the model's own).

        The IR as load's passes left it is written by `circle_jax.formats.write_model`:
        everything else of the source (operators, tensors, names, metadata, signature defs,
        fields the IR does not model) is preserved.
        ``file_format`` is "circle" or "tflite" (TFL3, version 3: LiteRT runs it). Untied
        copies and added biases (``rewrites``) are written as tensors with buffers of their
        own, so the file computes the trained function; while every copy still equals the
        param it was copied from and every added bias is zero, the input's own layout is
        written instead (nothing was trained apart). LoRA adapters (`circle_jax.passes.lora`)
        are merged into their base weights (``W + s * B A``, the original graph) unless
        ``merge_adapters`` is False, which writes the graph with the adapter operators.
        A weight-only quantized model (int8, int4 or int2 weights of hybrid operators or
        read by DEQUANTIZE, per channel or blockwise; float16 weights; dequantized at load)
        is written in its own layout: changed weights requantized into their own type with
        symmetric scales (blockwise ones per block, their float16 scales recomputed),
        float16 ones rounded (`circle_jax.passes.requantize_weights`).
        """
        params = self.params if params is None else params
        unknown = sorted(set(params) - set(self.param_keys) - {RANGES})
        if unknown:
            raise ValueError(f"unknown param name(s) {unknown}")
        if self.ondevice is not None:  # every signature kept, params as initial values
            return self.ondevice.export(self, params, file_format, metadata)
        if self.simulated is not None:
            names = {key: name for name, key in self.param_keys.items()}
            floats = {name: _finite(name, np.asarray(v)) for name, v in params.items()
                      if name != RANGES}
            ranges = {k: _finite(f"range {k}", np.asarray(v, np.float32))
                      for k, v in params.get(RANGES, {}).items()}
            integer = integer_model(self.simulated, self.fake_quant, {**self.params, **floats},
                                    names, ranges)
            return write_model(integer, file_format, metadata)
        model, keys = self.ir, self.param_keys
        if self._original is not None and not self._rewrites_matter(params):
            model = self._original
            keys = {k: v for k, v in param_table(model).items() if k in params}
        weights = {}
        for name, (k, i) in keys.items():
            if name not in params:
                continue
            old = model.subgraphs[k].tensors[i].data
            new = _finite(name, np.asarray(params[name]).astype(old.dtype))
            if old.tobytes() != new.tobytes():  # unchanged weights keep shared buffers shared
                weights[(k, i)] = new
        model = with_weights(model, weights)
        if merge_adapters:
            model = merge_lora(model)
        if self._quantized is not None:
            model = requantize_weights(model, self._quantized, self.rewrites.untied)
        return write_model(model, file_format, metadata)

    def personalize(self, *, new_head: int | None = None, seed: int = 0,
                    output: int | str = 0, lora: int | None = None,
                    lora_alpha: float | None = None,
                    lora_targets: str | Iterable[str] = "all") -> Model:
        """This model with a new ``new_head``-way classifier head on output ``output`` and/or
        rank-``lora`` adapters (`circle_jax.passes.personalize`), same lowering and numerics;
        its :attr:`personal_params` train by default. Refusals are one ValueError line."""
        check_personalizable(self.ir)
        index = _output_index(self, output)
        model = run(self.ir, personalize(new_head=new_head, seed=seed, output=index, lora=lora,
                                         lora_alpha=lora_alpha, lora_targets=lora_targets))
        out = Model(model, self.lowering, self.numerics, quantized=self._quantized,
                    stored=self._stored)
        if self.digest is not None:
            out.digest = _personal_digest(self.digest, new_head, seed, index, lora, lora_alpha,
                                          lora_targets)
        return out

    @property
    def personal_params(self) -> frozenset[str]:
        """The params a new head and LoRA adapters added: what trains by default."""
        return personal_params(self.ir)

    @property
    def adapters(self) -> dict[str, str]:
        """LoRA adapter param (A, B) -> the base weight it adapts (frozen)."""
        return adapter_names(self.ir)

    def _rewrites_matter(self, params: Mapping[str, Any]) -> bool:
        """Whether some untied copy differs from its origin or some added bias is nonzero."""
        def value(name: str) -> np.ndarray:
            return np.asarray(params.get(name, self.params[name]))

        return (any(value(new).tobytes() != value(old).tobytes()
                    for new, old in self.rewrites.untied.items())
                or any(np.any(value(b) != 0) for b in self.rewrites.added_bias))

    def summary(self) -> str:
        """A printable table of operators, tensors, params and their trainability."""
        shapes = {k: tuple(v.shape) for k, v in self.params.items()}
        lines = [summarize(self.ir, self.param_keys), "", *self.numerics.describe(),
                 describe_roles(self.param_roles, shapes)]
        lines += [f"  untied copy {new} of {old}" for new, old in self.rewrites.untied.items()]
        lines += [f"  added zero bias {name}" for name in self.rewrites.added_bias]
        lines += [line for r in self.passes for line in r.describe()]
        return "\n".join(lines)

    @property
    def passes(self) -> tuple[ir.PassRecord, ...]:
        """The graph passes `load` ran, in order, each with what it changed."""
        return self.ir.passes

    def __repr__(self) -> str:
        n = sum(int(np.prod(p.shape)) for p in self.params.values())
        return (
            f"Model({self.ir.format}, {len(self.operators)} operators, "
            f"{len(self.params)} params / {n} weights, inputs={[s.shape for s in self.inputs]})"
        )


def _finite(name: str, value: np.ndarray) -> np.ndarray:
    """``value``, refused when a float param holds NaN or infinity."""
    if np.issubdtype(value.dtype, np.inexact) and not np.isfinite(value).all():
        raise TrainingError(f"param {name!r} holds NaN or infinity; a model is exported only "
                            "with finite weights")
    return value


def _spec(t: ir.Tensor, stored: QParams | None = None) -> TensorSpec:
    return TensorSpec(t.name, t.shape, t.dtype, stored)


def load(
    source: str | os.PathLike | bytes,
    lowering: str | LoweringOptions | None = None,
    *,
    numerics: Numerics | str | None = None,
    tie_shared_weights: bool | None = None,
    add_missing_bias: bool | str | Iterable[str] | None = None,
    trainable_policy: str | None = None,
    signature: str | None = None,
    dequantize: bool | None = None,
    max_elements: int = MAX_TENSOR_ELEMENTS,
    new_head: int | None = None,
    seed: int = 0,
    lora: int | None = None,
    lora_alpha: float | None = None,
    lora_targets: str | Iterable[str] = "all",
    qat: bool | str | None = None,
    qat_forward: str | None = None,
    qat_ranges: str | None = None,
    qat_range_decay: float | None = None,
    restore: str | os.PathLike | None = None,
) -> Model:
    """Load a .circle or .tflite model (a path or the file's bytes).

    The whole graph is validated here: a malformed file raises one
    :class:`~circle_jax.CircleFormatError` line; a tensor declaring more than
    ``max_elements`` elements is refused before anything is allocated.

    ``lowering``: "fast" (the kernels of ``circle_jax.lowering``), "reference" (the plain
    definitions of ``circle_jax.ops``), a :class:`~circle_jax.lowering.LoweringOptions`, or
    None: fast on CPU, reference on other backends. Every operator's options are checked
    here: one error lists every refusal.

    ``numerics`` names the profile ("onert", the default; "keras"; "onert-micro"; see
    `circle_jax.numerics`); the other keywords override its fields. They choose the graph
    passes run on the parsed model (`circle_jax.passes.pipeline_stages`, recorded in
    ``Model.passes``): ``signature`` picks a SignatureDef by key, whose subgraph becomes the
    model's main one (default: subgraph 0); unless tied, a trainable constant read by
    several operators becomes one param per reader; ``add_missing_bias`` ("all" or True,
    "none" or False, or operator aliases such as ``"op3,op5"`` / ``["op3"]``; None: the
    profile's: keras and torch "all", the others "none") gives those of the weighted
    operators without a bias a zero one that trains. ``dequantize=True`` makes every
    quantized tensor float32 (`circle_jax.passes.dequantize_model`; export then writes a
    float model); the default (None) does so only for weight-only quantized models
    (dynamic-range int8 weights with float activations, float16 weights), which train as
    float32 and export in their own layout, and runs full-integer models with integer
    kernels; ``False`` never does. ``trainable_policy`` is "weights" (default), "all_float"
    or "fc_conv" (onert-micro's). The file is parsed once, the passes run once, the result is
    lowered once; nothing is serialized.

    Personalizing (the pipeline's last stage, as `Model.personalize` would, inside the one
    lowering): ``new_head=K`` replaces the classifier head of output 0 by a fresh K-way one;
    ``lora=R`` adds rank-R adapters scaled by ``lora_alpha / R`` on ``lora_targets`` ("all",
    "fc", "conv", "matmul" or weight names and aliases); ``seed`` seeds their initial values.

    ``qat=True``: a fully quantized model (quantized activations) loads as its
    quantization-aware training model: the float model that simulates it by fake
    quantization (`circle_jax.passes.fake_quantize`), with float32 masters of its weights
    and biases, whose export writes the integer model (`circle_jax.passes.qat`); shared weights stay
    tied and no bias is added (every param maps to a tensor of the file). ``qat=False``: a
    fully quantized model loads dequantized (``dequantize=True``: float training). Other
    models are refused (nothing to simulate); ``qat="auto"`` (the command line's) is
    ``True`` for a fully quantized model, and loads any other as without ``qat``. Default:
    a fully quantized model runs its integer kernels. ``qat_forward`` (with ``qat=True``):
    "integer" (the default) computes the forward's values with the integer kernels (what
    the exported file computes, LiteRT's values) and its gradients through the fake-quant
    float graph, operator by operator; "fake_quant" computes both in float (each operator
    within one step of its grid of the integer kernels', differences compounding through
    the layers).
    ``qat_ranges``: "file" (the default) keeps the file's activation scales and zero points;
    "ema" re-estimates them as TF's QAT does (tfmot's MovingAverageQuantizer): each training
    step moves every range ``[min, max]`` toward the batch's, widened to hold 0, as
    ``r * qat_range_decay + batch * (1 - qat_range_decay)`` (default decay 0.999, TF's),
    the step's forward using the ranges before its update; export writes the scales and
    zero points of the moved ranges (`circle_jax.passes.fake_quant.moving_ranges` says which
    activations move, and which share a range). Moving ranges are traced values, which
    only the fake-quant forward takes: ``qat_forward`` defaults to "integer" with "file"
    ranges and to "fake_quant" with "ema" ranges ("integer" with "ema" is refused).
    ``lora_alpha`` / ``lora_targets`` without ``lora`` are refused before the file is read;
    so are ``dequantize=True`` with ``qat=True`` and ``qat_range_decay`` without
    ``qat_ranges="ema"``; ``qat_forward`` / ``qat_ranges`` / ``qat_range_decay`` given for
    a model that does not load for QAT are refused once it is read. A QAT model's
    cross-entropy on a SOFTMAX output reads the SOFTMAX's input logits
    (``softmax_cce=QAT_SOFTMAX_CCE`` in a profile given by name; a
    :class:`~circle_jax.numerics.Numerics` given is used as it is).
    An on-device training file's signature: see `circle_jax.signatures.source` (``restore``
    a TF V1 checkpoint its restore signature reads; export keeps every signature).
    """
    check_lora_options(lora, lora_alpha, lora_targets)
    q = QatSettings.of(qat, dequantize, qat_forward, qat_ranges, qat_range_decay)
    prof = get_numerics(numerics).with_overrides(
        tie_shared_weights=tie_shared_weights,
        add_missing_bias=None if add_missing_bias is None else bias_selection(add_missing_bias),
        trainable_policy=trainable_policy)
    personal = new_head is not None or lora is not None
    personalizing = personalize(new_head=new_head, seed=seed, lora=lora,
                                lora_alpha=lora_alpha, lora_targets=lora_targets) \
        if personal else ()
    data, where = read_bytes(source)
    parsed = parse_model(data, where, max_elements=max_elements)
    refusals = check_graph(parsed)
    if refusals:  # before the passes, which walk the graph
        raise CircleFormatError(f"{len(refusals)} invalid graph element(s): "
                                + "; ".join(refusals)[:1000])
    restored = restored_values(parsed, signature, restore)  # on-device: restore's variables
    stages = pipeline_stages(
        signature=signature, dequantize=dequantize, qat=q, untie=not prof.tie_shared_weights,
        add_bias=prof.add_missing_bias, policy=prof.trainable_policy, variables=restored,
        personal=personalizing, personal_check=check_personalizable)
    stage = run_stages(parsed, stages)
    selected, original, model = stage["selected"], stage["float"], stage[stages[-1].name]
    dq = ran(original, "dequantize")
    if ran(model, "fake_quantize"):
        if not isinstance(numerics, Numerics):  # a profile by name: see QAT_SOFTMAX_CCE
            prof = prof.with_overrides(softmax_cce=QAT_SOFTMAX_CCE)
        loaded = Model(model, lowering, prof, simulated=original, qat_forward=q.forward,
                       qat_ranges=q.ranges, qat_range_decay=q.range_decay)
    else:
        in_layout = dq and dequantized_in_layout(dequantize, qat)
        loaded = Model(model, lowering, prof, None if personal else original,
                       quantized=selected if in_layout else None,
                       stored=selected if dq else None)
    digest = hashlib.sha256(data)
    digest.update(repr((loaded.lowering, prof, signature, dq, max_elements, qat,
                        loaded.qat_forward, loaded.qat_ranges, q.range_decay)).encode())
    loaded.digest = digest.hexdigest()
    if ran(selected, "read_variables_as_constants") and not personal:
        # an on-device file: only its variables train; export writes the file (a
        # personalized model, a graph the file does not hold, exports as a model)
        OnDeviceFile(parsed, restored, restore).attach(loaded)
    if personal:  # as Model.personalize's digest
        loaded.digest = _personal_digest(loaded.digest, new_head, seed, 0, lora, lora_alpha,
                                         lora_targets)
    return loaded


def _personal_digest(digest: str, *extra: Any) -> str:
    """A personalized model's digest: its base's and the personalizing options."""
    *head, targets = extra
    return hashlib.sha256((digest + repr((*head, str(targets)))).encode()).hexdigest()


def _output_index(model: Model, spec: int | str) -> int:
    names = [o.name for o in model.outputs]
    if isinstance(spec, str) and spec in names:
        return names.index(spec)
    if isinstance(spec, int) and 0 <= spec < len(names):
        return spec
    raise ConfigError(f"no model output {spec!r}; the outputs are {names}")


def summarize(model: ir.Model, param_keys: Mapping[str, ParamKey] | None = None) -> str:
    """The text ``circle-jax info`` prints: file facts, inputs/outputs, operators, params."""
    param_keys = param_keys or {}
    lines = [
        f"format: {model.format} ({model.file_identifier}), schema version {model.version}, "
        f"{len(model.subgraphs)} subgraph(s)",
    ]
    if model.description:
        lines.append(f"description: {model.description}")
    if model.metadata:
        lines.append("metadata: " + ", ".join(sorted(model.metadata)))
    for sig in model.signature_defs:
        lines.append(f"signature {sig.key!r}: subgraph {sig.subgraph_index}")
    counted = {key for key in param_keys.values()}
    total = 0
    for sg in model.subgraphs:
        title = f"subgraph {sg.index}" + (f" {sg.name!r}" if sg.name else "")
        lines.append(f"\n{title}: {len(sg.operators)} operators, {len(sg.tensors)} tensors")
        for kind, idx in (("input", sg.inputs), ("output", sg.outputs)):
            for i in idx:
                t = sg.tensors[i]
                lines.append(f"  {kind:6} {t.name}: {t.dtype}{list(t.shape)}")
        lines.append(f"  {'#':>4}  {'operator':28} inputs -> outputs")
        for op in sg.operators:
            ins = ", ".join(_short(sg, i) for i in op.inputs)
            outs = ", ".join(_short(sg, i) for i in op.outputs)
            lines.append(f"  {op.index:>4}  {op.key:28} {ins} -> {outs}")
        quantized = [t for t in sg.tensors if is_quantized(t)]
        if quantized:
            lines.append(f"  quantized tensors ({len(quantized)}; per-channel: N scales@axis):")
            lines += [f"  {t.index:>4}  {describe_quantization(t):40} {t.name}"
                      for t in quantized]
        n = sum(
            int(np.prod(t.shape)) for t in sg.tensors if (sg.index, t.index) in counted
        )
        total += n
        lines.append(
            f"  params: {sum(1 for k, _ in counted if k == sg.index)} tensors, {n} weights"
        )
    lines.append(f"\ntotal trainable-capable weights: {total}")
    return "\n".join(lines)


def _short(sg: ir.Subgraph, i: int) -> str:
    if i < 0:
        return "-"
    t = sg.tensors[i]
    tag = "w" if t.is_constant else ""
    return f"{tag}{t.dtype}{list(t.shape)}"
