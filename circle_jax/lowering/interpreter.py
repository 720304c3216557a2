"""Lowering: the IR becomes a pure ``apply(params, *inputs)`` built from registered operators.

Float constant tensors are parameters (looked up by name in ``params``), except those read
only at inputs an operator needs static (`circle_jax.graph.params_policy.STATIC_INPUTS`: RANGE's
bounds); every other constant stays a static numpy value, and operators whose inputs are all
static are evaluated at lowering time (constant folding, unless registered with
``fold=False``), so shape arithmetic never reaches the compiled graph.

Each operator gets the reference implementation of ``circle_jax/ops`` or the fast one of
``circle_jax/lowering``, as the :class:`~circle_jax.lowering.LoweringOptions` say. Building a
:class:`Lowered` checks every operator's static options and input specs (the registered
``check``) and raises one error listing every refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import CircleFormatError, CircleJaxError, DataError, UnsupportedOperatorError
from ..graph import ir
from ..graph.batching import batch_blocker, check_inputs
from ..graph.checks import check_arity, check_graph, check_quantization
from ..graph.params_policy import BIAS_POSITION, STATIC_INPUTS, param_table
from ..ops import fake_quant as fq
from ..ops.common import check_padding
from ..ops.hybrid import hybrid_weight
from ..ops.integer.params import Requantized
from ..ops.registry import OpContext, OpDef, definition, lookup, runs_integer
from ..passes.dequantize import is_quantized
from ..passes.fake_quant import FakeQuantPlan
from ..passes.qat import moving_parameters
from . import LoweringOptions, as_options, implementation
from .half import float32_weight_grads, in_float32, traced_float32

ParamKey = tuple[int, int]  # (subgraph index, tensor index)


def unsupported_operators(model: ir.Model) -> list[str]:
    """A line per operator circle-jax cannot lower (all of them, not just the first)."""
    missing = []
    for sg in model.subgraphs:
        for op in sg.operators:
            if lookup(op.key) is None:
                where = f"subgraph {sg.index} " if len(model.subgraphs) > 1 else ""
                missing.append(f"{op.key} (code {op.code}) at {where}operator {op.index}")
    return missing


def _check_common(op: ir.Operator) -> None:
    """Checks every operator gets: a known fused activation and padding code."""
    act = op.options.get("fused_activation_function")
    if act is not None and act not in range(ir.ACT_SIGN_BIT + 1):
        raise ValueError(f"unknown fused activation code {act}")
    if "padding" in op.options:
        check_padding(op.options.padding)
    for key, value in op.options.items():
        if key.startswith(_GEOMETRY) and isinstance(value, int) and value > MAX_GEOMETRY:
            raise ValueError(f"{key} {value} is out of range (expected at most {MAX_GEOMETRY})")


_GEOMETRY = ("stride", "dilation", "filter_", "depth_multiplier")
MAX_GEOMETRY = 1 << 16
"""The largest stride, dilation, filter size or depth multiplier an option may hold."""


class RowSquares(NamedTuple):
    """A param given to `Lowered.apply` as ``RowSquares(table, squares)`` (``squares``:
    zeros shaped like the table) is read as ``table``, and the cotangent of ``squares`` is
    what the reading operator's backward gives for the SQUARED output cotangent. For a
    gather (each output element reads one table element) that is, per table element, the
    sum over its occurrences of the squared gradient: Keras's sparse-gradient Adam feeds that
    to its second moment (`circle_jax.optim.adam_tf`)."""

    table: Any
    squares: Any


def _read_rows(fn: Callable[..., Any], ctx: OpContext, args: Sequence[Any], pos: int) -> Any:
    """``fn(ctx, *args)`` with ``args[pos]`` a `RowSquares`; the other inputs are indices
    (no gradient flows to them)."""
    dynamic = [i for i, a in enumerate(args) if i != pos and not _static(a)]

    def call(table: Any, *values: Any) -> Any:
        full = list(args)
        full[pos] = table
        for i, v in zip(dynamic, values):
            full[i] = v
        return fn(ctx, *full)

    @jax.custom_vjp
    def read(table: Any, squares: Any, *values: Any) -> Any:
        return call(table, *values)

    def forward(table: Any, squares: Any, *values: Any) -> tuple[Any, Any]:
        return jax.vjp(lambda t: call(t, *values), table)

    def backward(back: Callable[..., Any], g: Any) -> tuple[Any, ...]:
        return (back(g)[0], back(g * g)[0].astype(rows.squares.dtype),
                *(None for _ in dynamic))

    read.defvjp(forward, backward)
    rows = args[pos]
    return read(rows.table, rows.squares, *(args[i] for i in dynamic))


#: The key of a QAT model's params under which its moving activation ranges are given
#: (``load(qat_ranges="ema")``): group name (`circle_jax.passes.fake_quant.moving_ranges`)
#: -> float32 ``[min, max]``. Without it every activation keeps the file's parameters.
RANGES = "(qat activation ranges)"


class Lowered:
    """The lowered model: pure functions over (params, inputs), built once per IR.

    ``lowering``: "fast", "reference", a :class:`~circle_jax.lowering.LoweringOptions` or
    None (the default: fast on CPU, reference on other backends). ``fake_quant``: for a
    model `circle_jax.passes.fake_quantize` made, where it rounds (the plan of its source):
    activations after they are computed or fed, weights and biases as operators read them
    (`circle_jax.ops.fake_quant`).

    ``integer``: that source model, for the *integer forward* of quantization-aware
    training: every operator's value is then its integer kernel's (the source's operator,
    as a load without ``qat`` runs it, bit-exact with LiteRT) on the integers of its
    inputs, the weights and biases re-quantized from the float params as the fake-quant
    forward does (traced scales: exact output multipliers, `ops/integer/fixed_point.py`),
    dequantized; its gradient is the fake-quant float operator's, evaluated at those
    inputs (per operator straight through: ``y = y_int + (y_fq - stop_gradient(y_fq))``).
    The forward then computes what the exported integer file computes. Main subgraph only;
    a quantized constant is re-quantized only as the weight or bias of CONV_2D,
    DEPTHWISE_CONV_2D, FULLY_CONNECTED or TRANSPOSE_CONV (others are refused).
    """

    def __init__(self, model: ir.Model, lowering: str | LoweringOptions | None = None,
                 fake_quant: FakeQuantPlan | None = None,
                 integer: ir.Model | None = None) -> None:
        self.model = model
        self.fake_quant = fake_quant
        self.options = as_options(lowering)
        self.params = param_table(model)
        self._param_name = {key: name for name, key in self.params.items()}
        self._ops = operator_table(model, self.options)
        self.integer = None if integer is None else _integer_forward(integer, fake_quant,
                                                                     self.options)
        #: None when a batch runs as one batched graph; else why it does not follow the batch
        self.batch_blocker: str | None = batch_blocker(model)

    def with_options(self, **changes: Any) -> Lowered:
        """A view of this lowering with ``changes`` to its options (e.g. ``in_loop=True``):
        the same checked operators, each given the implementation the new options choose;
        nothing is lowered again."""
        new = self._view(self.model)
        new.options = replace(self.options, **changes)
        new._ops = {key: (d, _implementation(d, ctx.op.key, new.options),
                          replace(ctx, lowering=new.options))
                    for key, (d, _, ctx) in self._ops.items()}
        return new

    def with_outputs(self, outputs: Sequence[int]) -> Lowered:
        """A view of this lowering whose main subgraph's outputs are the tensors
        ``outputs`` (indices; e.g. a SOFTMAX's input logits in place of its output): the
        same operators, nothing lowered again. Tensors of ``outputs`` must exist."""
        sg = self.model.main
        bad = [i for i in outputs if not 0 <= i < len(sg.tensors)]
        if bad:
            raise ValueError(f"no tensor {bad[0]} in the main subgraph "
                             f"({len(sg.tensors)} tensors)")
        return self._view(replace(self.model, subgraphs=(
            replace(sg, outputs=tuple(outputs)), *self.model.subgraphs[1:])))

    def _view(self, model: ir.Model) -> Lowered:
        """This lowering over ``model`` (the same operators and tensors)."""
        new = object.__new__(Lowered)
        new.__dict__.update(self.__dict__)
        new.model = model
        return new

    def apply(self, params: Mapping[str, Any], *inputs: Any,
              observed: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """Run subgraph 0: the model's outputs, in order, as a tuple.

        Given N samples where the inputs declare a batch of D (their common dimension 0), the
        graph runs as one batch when :attr:`batch_blocker` is None (every operator follows
        the batch, `circle_jax.graph.batching`); else, when D is 1, the batch-1 graph runs mapped
        over the samples (``jax.vmap``), each output the N single-sample outputs
        concatenated on axis 0, and when D is not 1 the batch is refused in one line.
        Either way a batch of N gives what N single-sample runs give.

        ``observed``: a dict that gets, for a QAT model with moving ranges, each range
        group's (min, max) of this forward's real values before rounding (:meth:`observe`).
        """
        missing = [name for name in self.params if name not in params]
        if missing:
            raise KeyError(f"params lack {len(missing)} of the model's {len(self.params)} "
                           f"params, e.g. {missing[0]!r}; expected every param of "
                           "model.params (a trainer's state: {**state.params, **frozen})")
        check_inputs(self.model, inputs)
        mode = self.batching(inputs)
        if mode == "mapped":
            return self.per_sample(params, *inputs, observed=observed)
        if mode == "refused":
            shapes = [list(self.model.main.tensors[i].shape) for i in self.model.main.inputs]
            raise DataError(f"inputs of shapes {[list(np.shape(x)) for x in inputs]}: the "
                            f"model runs only at its declared batch ({shapes}), because "
                            f"{self.batch_blocker}")
        groups = {} if observed is None or self.fake_quant is None else self.fake_quant.moving
        seen: dict[int, Any] = {i: None for members in groups.values() for i in members}
        outputs = self.run(0, params, inputs, keep=False, observed=seen or None)[0]
        for name, members in groups.items():
            observed[name] = (jnp.min(jnp.stack([seen[i][0] for i in members])),
                              jnp.max(jnp.stack([seen[i][1] for i in members])))
        return outputs

    def batching(self, inputs: Sequence[Any]) -> str:
        """How :meth:`apply` runs ``inputs``: "mapped" (the batch-1 graph over the samples),
        "refused" (another batch of a model whose declared batch is not 1 and that does not
        follow the batch) or "direct" (the graph as given: the declared batch, a batch the
        graph follows, or other shapes of a dynamic-shape model)."""
        declared = [self.model.main.tensors[i].shape for i in self.model.main.inputs]
        given = [tuple(np.shape(x)) for x in inputs]
        if len(given) != len(declared) or any(not g or len(g) != len(d)
                                              for g, d in zip(given, declared)):
            return "direct"
        batches, declared_batches = {g[0] for g in given}, {d[0] for d in declared}
        if len(batches) != 1 or len(declared_batches) != 1 or batches == declared_batches:
            return "direct"
        same_samples = all(g[1:] == d[1:] for g, d in zip(given, declared))
        if self.batch_blocker is None and same_samples:
            return "direct"
        if declared_batches == {1}:
            return "mapped"
        return "refused" if same_samples else "direct"

    def observe(self, params: Mapping[str, Any], *inputs: Any) -> dict[str, Any]:
        """The (min, max) (float32) of each moving range group's real values before
        rounding (`moving_parameters`) over these inputs: what ``qat_ranges="ema"`` moves
        its ranges toward."""
        seen: dict[str, Any] = {}
        self.apply(params, *inputs, observed=seen)
        return seen

    def per_sample(self, params: Mapping[str, Any], *inputs: Any,
                   observed: dict[str, Any] | None = None) -> tuple[Any, ...]:
        """Subgraph 0 run on each sample alone (batch 1), mapped over the samples
        (``observed``: as :meth:`apply`'s, over all samples)."""
        def one(*sample: Any) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
            seen = None if observed is None else {}
            return self.apply(params, *(x[None] for x in sample), observed=seen), seen

        outs, seen = jax.vmap(one)(*inputs)
        if observed is not None:
            observed.update({name: (lo.min(), hi.max()) for name, (lo, hi) in seen.items()})
        return tuple(o.reshape((-1, *o.shape[2:])) for o in outs)

    def intermediates(self, params: Mapping[str, Any], *inputs: Any) -> dict[str, Any]:
        """Every tensor of subgraph 0 computed for these inputs, keyed by tensor name."""
        _, env = self.run(0, params, inputs, keep=True)
        tensors = self.model.main.tensors
        return {tensors[i].name: v for i, v in env.items()}

    def tensors(self, params: Mapping[str, Any], *inputs: Any,
                taps: Mapping[int, Any] | None = None) -> tuple[tuple[Any, ...], dict[int, Any]]:
        """(outputs, every tensor of subgraph 0 computed for these inputs, keyed by tensor
        index). ``taps`` maps tensor indices to values added to those tensors where they are
        computed (or fed, for inputs): differentiating at zero taps gives dOutput/dTensor."""
        return self.run(0, params, inputs, keep=True, taps=taps)

    def run(
        self, k: int, params: Mapping[str, Any], inputs: Sequence[Any], keep: bool,
        taps: Mapping[int, Any] | None = None, observed: dict[int, Any] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> tuple[tuple[Any, ...], dict[int, Any]]:
        """Subgraph ``k``'s outputs (and every tensor when ``keep``). A QAT model's params
        may hold moving activation ranges under :data:`RANGES` (`moving_parameters`);
        ``observed``: tensor indices whose ``[min, max]`` before rounding is recorded there;
        ``variables``: the resource variables (`OpContext.variables`), updated in place."""
        sg = self.model.subgraphs[k]
        if len(inputs) != len(sg.inputs):
            raise TypeError(f"subgraph {k} takes {len(sg.inputs)} inputs, got {len(inputs)}")
        taps = taps or {}
        plan = self.fake_quant
        acts = {} if plan is None else {i: (g, g.scale[0], g.zero_point[0])
                                        for (j, i), g in plan.activations.items() if j == k}
        if k == 0 and plan is not None and RANGES in params:  # qat_ranges="ema"
            acts.update(moving_parameters(plan, params[RANGES]))

        def computed(i: int, x: Any) -> Any:
            if i in acts:
                g, scale, zero = acts[i]
                if observed is not None and i in observed:
                    observed[i] = (jnp.min(x).astype(jnp.float32), jnp.max(x).astype(jnp.float32))
                x = fq.fake_quant(x, scale, zero, g.qmin, g.qmax)
            return x + taps[i] if i in taps else x

        env: dict[int, Any] = {i: computed(i, x) for i, x in zip(sg.inputs, inputs)}
        integer = self.integer if k == 0 else None
        ints: dict[int, Any] = {} if integer is None else {
            i: integer.value_of(i, env[i]) for i in sg.inputs}

        def value(i: int, static: bool = False) -> Any:
            if i < 0:
                return None
            if i in env:
                return env[i]
            t = sg.tensors[i]
            name = self._param_name.get((k, i))
            if name is not None and not (static and t.data is not None):
                if plan is not None and (k, i) in plan.weights:
                    return fq.fake_quant_weight(params[name], plan.weights[(k, i)])[0]
                if plan is not None and (k, i) in plan.constants:
                    return fq.fake_quant_constant(params[name], plan.constants[(k, i)])
                return params[name]
            if t.data is not None:
                return t.data
            if t.is_variable:  # a state tensor (e.g. LSTM) with no buffer starts at zero
                return np.zeros(t.shape, ir.as_numpy_dtype(t.dtype))
            raise ValueError(f"subgraph {k}: tensor {t.name!r} is read before it is computed")

        def run_subgraph(j: int, args: Sequence[Any]) -> tuple[Any, ...]:
            return self.run(j, params, args, keep=False, variables=variables)[0]

        for op in sg.operators:
            d, fn, ctx = self._ops[(k, op.index)]
            static = STATIC_INPUTS.get(op.key, frozenset())
            args = [value(i, pos in static) for pos, i in enumerate(op.inputs)]
            if plan is not None:
                args = [self._fake_quant_bias(k, i, a, params, acts)
                        for i, a in zip(op.inputs, args)]
            ctx = replace(ctx, run_subgraph=run_subgraph, variables=variables)
            try:
                rows = next((p for p, a in enumerate(args) if isinstance(a, RowSquares)), None)
                if rows is not None:
                    out = _read_rows(fn, ctx, args, rows)
                elif d.fold and args and all(_static(a) for a in args):
                    with jax.ensure_compile_time_eval():
                        out = fn(ctx, *args)
                    out = jax.tree.map(np.asarray, out)
                elif op.key in self.options.float32_ops:
                    out = in_float32(fn, ctx, args, [k == 0 and i in sg.outputs
                                                      for i in op.outputs])
                elif self.options.half_weights and any(traced_float32(a) for a in args):
                    out = float32_weight_grads(fn, ctx, args, self.options.half_weights)
                else:
                    out = fn(ctx, *args)
            except CircleJaxError:
                raise
            except _FILE_FAULTS as e:
                raise _refusal(e, f"operator {op.index} ({op.key}) of subgraph {k}") from e
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if len(outs) != len(op.outputs):
                raise CircleFormatError(
                    f"operator {op.index} ({op.key}) of subgraph {k} produced {len(outs)} "
                    f"outputs, the model declares {len(op.outputs)}"
                )
            for i, o in zip(op.outputs, outs):
                if o is not None and np.size(o) > ir.MAX_TENSOR_ELEMENTS:
                    raise CircleFormatError(
                        f"operator {op.index} ({op.key}) of subgraph {k} computes shape "
                        f"{list(np.shape(o))[:8]}, over {ir.MAX_TENSOR_ELEMENTS} elements")
                if i >= 0:
                    env[i] = computed(i, o)
            if integer is not None:
                integer.step(op, params, self._param_name, env, ints)
        outputs = tuple(value(i) for i in sg.outputs)
        return outputs, (env if keep else {})

    def _fake_quant_bias(self, k: int, i: int, b: Any, params: Mapping[str, Any],
                         acts: Mapping[int, tuple[Any, Any, Any]]) -> Any:
        """Bias ``b`` (tensor ``i`` of subgraph ``k``) re-quantized at ``s_input * s_weight``
        with the input's scale (``acts``: each activation's parameters, scale and zero
        point) and the weight's scales of this call; any other argument as it is."""
        bias = self.fake_quant.biases.get((k, i)) if self.fake_quant is not None else None
        if bias is None:
            return b
        w = params[self._param_name[(k, bias.weight)]]
        weight = self.fake_quant.weights[(k, bias.weight)]
        s_in = acts[bias.input][1]
        scale = fq.bias_scale(s_in, fq.weight_params(w, weight)[0])
        return fq.fake_quant_bias(b, scale, bias.grid)


class _IntegerForward:
    """The integer forward of a QAT model (see :class:`Lowered`): the source model's
    operators and where the fake-quant plan rounds."""

    def __init__(self, source: ir.Model, plan: FakeQuantPlan, ops: dict) -> None:
        self.source, self.plan, self.ops = source.main, plan, ops

    def value_of(self, i: int, real: Any) -> Any:
        """The source's value of tensor ``i`` from the simulation's real value: integers
        for a quantized tensor, else the value itself."""
        g = self.plan.activations.get((0, i))
        if g is None:
            return real
        return fq.to_integers(real, g.scale[0], g.zero_point[0], g.qmin, g.qmax, g.dtype)

    def _argument(self, i: int, params: Mapping[str, Any], names: Mapping[ParamKey, str],
                  ints: dict[int, Any]) -> Any:
        if i < 0:
            return None
        if i in ints:
            return ints[i]
        plan, t = self.plan, self.source.tensors[i]
        if (0, i) in plan.weights:
            q, scale, zero = fq.quantize_weight(params[names[(0, i)]], plan.weights[(0, i)])
            return Requantized(q.astype(t.dtype), scale, zero)
        if (0, i) in plan.constants:
            return fq.constant_on_grid(params[names[(0, i)]], plan.constants[(0, i)])[0] \
                .astype(t.dtype)
        if (0, i) in plan.biases:
            bias = plan.biases[(0, i)]
            w = params[names[(0, bias.weight)]]
            s_in = plan.activations[(0, bias.input)].scale[0]
            scale = fq.bias_scale(s_in, fq.weight_params(w, plan.weights[(0, bias.weight)])[0])
            return fq.quantize_bias(params[names[(0, i)]], scale, bias.grid).astype(jnp.int32)
        return t.data

    def step(self, op: ir.Operator, params: Mapping[str, Any], names: Mapping[ParamKey, str],
             env: dict[int, Any], ints: dict[int, Any]) -> None:
        """Run ``op``'s integer kernel (an operator on no quantized tensor: its float value)
        and give each output the integer value with the float value's gradient."""
        _, fn, ctx = self.ops[(0, op.index)]
        tensors = self.source.tensors
        if not any(is_quantized(tensors[i]) for i in (*op.inputs, *op.outputs) if i >= 0):
            ints.update({i: env[i] for i in op.outputs if i >= 0})
            return
        out = fn(ctx, *(self._argument(i, params, names, ints) for i in op.inputs))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, o in zip(op.outputs, outs):
            if i < 0:
                continue
            ints[i] = o
            g = self.plan.activations.get((0, i))
            real = o if g is None else fq.from_integers(o, g.scale[0], g.zero_point[0])
            env[i] = fq.straight_through(real, env[i])


def operator_table(model: ir.Model, options: LoweringOptions
               ) -> dict[tuple[int, int], tuple[OpDef, Callable[..., Any], OpContext]]:
    """Every operator's definition, implementation and static context, after its checks:
    the lowering of ``model``'s operators (`Lowered` builds it once per IR; its views share
    it). One error lists every refusal (UnsupportedOperatorError if any is unsupported)."""
    malformed, refused, refused_ops = check_quantization(model, runs_integer)
    parsed, refusals = {}, check_graph(model) + malformed + refused
    unsupported = bool(refused)
    multi = len(model.subgraphs) > 1
    for sg in model.subgraphs:
        for op in sg.operators:
            if (sg.index, op.index) in refused_ops:
                continue
            where = f"{op.key} (code {op.code}) at {f'subgraph {sg.index} ' if multi else ''}" \
                f"operator {op.index}"
            ins = tuple(sg.tensors[i] if i >= 0 else None for i in op.inputs)
            outs = tuple(sg.tensors[i] for i in op.outputs)
            d = definition(op.key, runs_integer(op.key, ins, outs),
                           hybrid_weight(op.key, ins, op.options) is not None)
            if d is None:
                refusals.append(where)
                unsupported = True
                continue
            ctx = OpContext(op, ins, outs, _no_subgraph, options, subgraph=sg)
            try:
                check_arity(op, d.fn)
                _check_common(op)
                if d.check is not None:
                    d.check(ctx)
            except (ValueError, TypeError, NotImplementedError) as e:
                refusals.append(f"{where}: {e}")
                unsupported |= isinstance(e, NotImplementedError)
                continue
            parsed[(sg.index, op.index)] = (d, _implementation(d, op.key, options), ctx)
    if refusals:
        error = UnsupportedOperatorError if unsupported else CircleFormatError
        what = "unsupported operator(s)" if unsupported else "invalid operator(s)"
        raise error(f"{len(refusals)} {what}: " + _first_refusals(refusals)
                    + (" (see circle_jax.supported_operators())" if unsupported else ""))
    return parsed


def _integer_forward(source: ir.Model, plan: FakeQuantPlan | None,
                     options: LoweringOptions) -> _IntegerForward:
    """The integer forward of ``source`` (refusals: one line)."""
    if plan is None or len(source.subgraphs) > 1:
        raise UnsupportedOperatorError("the integer QAT forward runs single-subgraph fully "
                                       "quantized models (qat_forward='fake_quant' runs others)")
    sg = source.main
    for op in sg.operators:
        for pos, i in enumerate(op.inputs):
            if (0, i) in plan.weights and not (op.type in BIAS_POSITION and pos == 1):
                raise UnsupportedOperatorError(
                    f"operator {op.index} ({op.key}) reads quantized constant "
                    f"{sg.tensors[i].name[:60]!r}: the integer QAT forward re-quantizes only "
                    "weights of CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV "
                    "(qat_forward='fake_quant' runs it)")
    return _IntegerForward(source, plan, operator_table(source, options))


MAX_MESSAGE = 1000
"""The longest list of refusals one load error spells out (each cut at 160 characters); the
rest are counted."""


def _first_refusals(refusals: list[str]) -> str:
    """As many refusals as fit in :data:`MAX_MESSAGE` characters, then how many more."""
    shown: list[str] = []
    for r in refusals:
        if shown and len("; ".join([*shown, r])) > MAX_MESSAGE:
            break
        shown.append(r if len(r) <= 160 else r[:157] + "...")
    rest = len(refusals) - len(shown)
    return "; ".join(shown) + (f"; and {rest} more" if rest else "")


# What an operator raises while traced when the file's values make no sense for it.
_FILE_FAULTS = (ValueError, TypeError, NotImplementedError, IndexError, KeyError,
                ZeroDivisionError, OverflowError, AttributeError, RecursionError)


def _refusal(e: Exception, where: str) -> CircleJaxError:
    """One line (at most ~200 characters of the cause) naming the operator: unsupported
    when the kernel says so, else a format error."""
    cause = (str(e).splitlines() or [""])[0]
    if len(cause) > 200:
        cause = cause[:197] + "..."
    if not isinstance(e, ValueError):
        cause = f"{type(e).__name__}: {cause}"
    kind = UnsupportedOperatorError if isinstance(e, NotImplementedError) else CircleFormatError
    return kind(f"{where}: {cause}")


def _implementation(d: OpDef, key: str, options: LoweringOptions) -> Callable[..., Any]:
    """The fast lowering of a float kernel where the options choose one, else ``d.fn``
    (integer kernels have no fast variant)."""
    return d.fn if d.integer else (implementation(key, options) or d.fn)


def _no_subgraph(j: int, args: Sequence[Any]) -> tuple[Any, ...]:
    raise RuntimeError("subgraphs run only while the model is applied")


def _static(x: Any) -> bool:
    return x is None or isinstance(x, (np.ndarray, np.generic))


def lower(model: ir.Model, lowering: str | LoweringOptions | None = None
          ) -> Callable[..., tuple[Any, ...]]:
    """``apply(params, *inputs)`` for subgraph 0 of ``model`` (``lowering``: see
    :class:`Lowered`)."""
    return Lowered(model, lowering).apply
