"""A model file's signatures as pure functions over its resource variables.

LiteRT's on-device training files (`circle_jax.graph.variables`) hold several SignatureDefs
(``train``, ``infer``, ``save``, ``restore``) over variables they share. A :class:`Program`
reads the file once; :meth:`Program.signature` lowers one signature (its subgraph and those
it runs, `circle_jax.passes.keep_reachable`: another signature's operators never stop it) to
a :class:`Signature`, the pure function

    outputs, variables = signature(variables, inputs)

``variables`` maps shared_names to arrays (those the file initialises come from
:meth:`Program.initial_variables`: its init subgraphs, which CALL_ONCE names, run once);
``inputs`` and ``outputs`` map the signature's names to arrays. It is jit-able (string
inputs, such as a checkpoint path, are not JAX values: a signature taking them runs
eagerly). Refused in one line each: a signature or input name that does not exist (naming
what does), an input of another shape, a variable read that holds nothing (naming it), and,
when a signature is lowered, every Flex operator of it circle-jax has no kernel for (named
by TF op; a kernel registered as ``CUSTOM:Flex<op>`` makes it run, its NodeDef in
``ctx.op.custom_options``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import CircleFormatError, DataError, UnsupportedOperatorError, VariableError
from ..formats.flex import flex_options
from ..formats.reader import parse_model, read_bytes
from ..graph import ir
from ..graph.checks import check_graph
from ..graph.variables import Variable, flex_op, init_subgraphs, variables
from ..lowering import LoweringOptions
from ..lowering.interpreter import Lowered
from ..ops.registry import definition
from ..passes import keep_reachable, reachable, run, select_signature, select_subgraph

_NARROW = {"int64": np.int32, "uint64": np.uint32}
"""What JAX computes 64-bit integers as without ``jax_enable_x64``."""


def _check_fits(what: str, value: Any) -> None:
    """One `VariableError` line when a 64-bit integer ``value`` does not fit the 32 bits JAX
    computes it in without 64-bit mode (a value that fits is exact)."""
    if isinstance(value, jax.core.Tracer):  # checked where the values are concrete
        return
    a = value if isinstance(value, jax.Array) else np.asarray(value)
    if jax.config.jax_enable_x64 or a.dtype.kind not in "iu" or a.dtype.itemsize <= 4 \
            or not a.size:
        return
    narrow = np.iinfo(_NARROW[a.dtype.name])
    lo, hi = int(a.min()), int(a.max())
    if lo < narrow.min or hi > narrow.max:
        raise VariableError(f"{what} ({a.dtype.name}) holds {hi if hi > narrow.max else lo}, "
                            f"which JAX computes as {narrow.dtype.name} without 64-bit mode: "
                            "enable jax_enable_x64 to run it exactly")


def _names(names: Mapping[str, Any] | list[str]) -> str:
    return ", ".join(repr(n) for n in names) or "none"


class Signature:
    """One signature as a pure function (see the module docstring). ``inputs`` and
    ``outputs``: its names -> the tensors they are; ``init_subgraphs``: the file's init
    subgraphs (their indices in the file) its CALL_ONCE operators name, which must have run
    on the variables it is given."""

    def __init__(self, key: str, model: ir.Model, init: tuple[int, ...],
                 lowering: str | LoweringOptions | None) -> None:
        self.key = key
        self.init_subgraphs = init
        self._lowered = Lowered(model, lowering)
        sg, sig = model.main, next(s for s in model.signature_defs if s.key == key)
        self.inputs = {name: sg.tensors[i] for name, i in sig.inputs.items()}
        self.outputs = {name: sg.tensors[i] for name, i in sig.outputs.items()}
        self._in_position = {name: sg.inputs.index(i) for name, i in sig.inputs.items()}
        self._out_position = {name: sg.outputs.index(i) for name, i in sig.outputs.items()}
        self._params = {name: model.subgraphs[k].tensors[i].data
                        for name, (k, i) in self._lowered.params.items()}
        self._wide = {n for n, v in variables(model).items() if v.dtype in _NARROW}
        #: whether every input is a JAX value (no string): the function can be jitted
        self.jittable = all(t.dtype != "string" for t in self.inputs.values())

    def __call__(self, variables: Mapping[str, Any], inputs: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(outputs by name, every variable after the run)."""
        self.check_variables(variables)
        args: list[Any] = [None] * len(self._in_position)
        for name, value in self._checked(inputs).items():
            args[self._in_position[name]] = value
        store = dict(variables)
        outs, _ = self._lowered.run(0, self._params, args, keep=False, variables=store)
        return {name: outs[j] for name, j in self._out_position.items()}, store

    def check_variables(self, variables: Mapping[str, Any]) -> None:
        """One `VariableError` line for a 64-bit integer variable whose value does not fit
        the 32 bits JAX computes it in without ``jax_enable_x64`` (Keras's step counter
        restored from a long run); values that fit are exact. Arithmetic inside a step is
        in 32 bits then: a counter wraps past 2**31 - 1."""
        for name in self._wide & set(variables):
            _check_fits(f"variable {name!r}", variables[name])

    def _checked(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` as the signature's tensors take them; one-line `DataError` for an
        unknown or missing name, or a shape other than the file's."""
        unknown = [n for n in inputs if n not in self.inputs]
        missing = [n for n in self.inputs if n not in inputs]
        if unknown or missing:
            what = (f"has no input {unknown[0]!r}" if unknown
                    else f"needs input(s) {_names(missing)}")
            raise DataError(f"signature {self.key!r} {what} (its inputs: {_names(self.inputs)})")
        out = {}
        for name, t in self.inputs.items():
            value = inputs[name]
            if t.dtype == "string":
                value = np.vectorize(lambda s: s if isinstance(s, bytes) else str(s).encode(),
                                     otypes=[object])(np.asarray(value, object))
            elif not isinstance(value, jax.Array):
                value = np.asarray(value)
                if t.dtype in _NARROW:
                    _check_fits(f"signature {self.key!r} input {name!r}", value)
            declared = t.shape_signature or t.shape
            if len(np.shape(value)) != len(declared) or any(
                    d >= 0 and d != g for d, g in zip(declared, np.shape(value))):
                raise DataError(f"signature {self.key!r} input {name!r} has shape "
                                f"{list(np.shape(value))}; the file declares {list(declared)}")
            out[name] = value if t.dtype == "string" else jnp.asarray(
                value, ir.as_numpy_dtype(t.dtype))
        return out


def _refuse_assigns_in_bodies(model: ir.Model, bodies: set[int]) -> None:
    """One line: a variable assigned in a subgraph that control flow runs (a loop body's
    value would not leave the loop)."""
    for k in sorted(bodies):
        if any(op.type == "ASSIGN_VARIABLE" for op in model.subgraphs[k].operators):
            raise UnsupportedOperatorError(f"subgraph {k}, which control flow runs, assigns a "
                                           "variable: not supported (a signature's own "
                                           "subgraph and its init subgraphs may)")


class Program:
    """A model file's signatures and variables (see the module docstring): ``source`` a path,
    the file's bytes or a parsed model; a malformed graph is refused here in one line."""

    def __init__(self, source: str | os.PathLike | bytes | ir.Model,
                 lowering: str | LoweringOptions | None = None) -> None:
        if isinstance(source, ir.Model):
            model = source
        else:
            model = parse_model(*read_bytes(source))
        refusals = check_graph(model)
        if refusals:
            raise CircleFormatError(f"{len(refusals)} invalid graph element(s): "
                                    + "; ".join(refusals)[:1000])
        self.model = model
        self.lowering = lowering
        self._signatures: dict[str, Signature] = {}
        self._inits: dict[int, Lowered] = {}

    @property
    def signature_defs(self) -> dict[str, ir.SignatureDef]:
        """The file's signature defs by key, in file order."""
        return {s.key: s for s in self.model.signature_defs}

    @property
    def variables(self) -> dict[str, Variable]:
        """The file's variables by shared_name (`circle_jax.graph.variables.Variable`)."""
        return variables(self.model)

    def flex_operators(self, within: set[int] | None = None) -> dict[str, int]:
        """TF op name -> how many Flex operators run it (in subgraphs ``within``; default
        all)."""
        return dict(Counter(name for sg in self.model.subgraphs
                            if within is None or sg.index in within
                            for op in sg.operators if (name := flex_op(op)) is not None))

    def signature(self, key: str) -> Signature:
        """Signature ``key`` lowered (once); one-line errors for a key the file lacks and
        for Flex operators without a kernel (each named)."""
        if key not in self._signatures:
            sig = self.signature_defs.get(key)
            if sig is None:
                raise DataError(f"the model has no signature {key!r} (signatures: "
                                f"{_names(self.signature_defs)})")
            within = reachable(self.model, sig.subgraph_index)
            self._refuse_flex(f"signature {key!r}", within)
            init = tuple(init_subgraphs(self.model, within))
            _refuse_assigns_in_bodies(self.model, within - {sig.subgraph_index, *init})
            model = run(self.model, [partial(select_signature, key=key), keep_reachable])
            self._signatures[key] = Signature(key, model, init, self.lowering)
        return self._signatures[key]

    def _refuse_flex(self, what: str, within: set[int]) -> None:
        """One-line errors: a Flex operator whose custom options do not decode, and every
        TF op of ``within`` that no registered kernel runs."""
        for sg in self.model.subgraphs:
            for op in sg.operators:
                if sg.index in within and flex_op(op) is not None:
                    flex_options(op.custom_options, f"subgraph {sg.index} operator {op.index} "
                                 f"({op.custom_code})")
        unknown = {name: n for name, n in self.flex_operators(within).items()
                   if definition(f"CUSTOM:Flex{name}") is None}
        if unknown:
            raise UnsupportedOperatorError(
                f"{what} runs {len(unknown)} Flex operator(s) circle-jax has no kernel for: "
                + ", ".join(f"Flex{name} (TF op {name}, {n} use{'s' * (n > 1)})"
                            for name, n in unknown.items())
                + " (see circle_jax.supported_operators())")

    def initialise(self, k: int, variables: Mapping[str, Any]) -> dict[str, Any]:
        """``variables`` after init subgraph ``k`` (an index in the file) ran on them."""
        if k not in self._inits:
            if not 0 <= k < len(self.model.subgraphs):
                raise CircleFormatError(f"init subgraph {k} is out of range (the model has "
                                        f"{len(self.model.subgraphs)} subgraphs)")
            self._refuse_flex(f"init subgraph {k}", reachable(self.model, k))
            model = run(self.model, [partial(select_subgraph, k=k), keep_reachable])
            self._inits[k] = Lowered(model, self.lowering)
        lowered = self._inits[k]
        params = {name: lowered.model.subgraphs[j].tensors[i].data
                  for name, (j, i) in lowered.params.items()}
        store = dict(variables)
        lowered.run(0, params, [], keep=False, variables=store)
        return store

    def initial_variables(self) -> dict[str, Any]:
        """The variables after every init subgraph of the file ran once, in the order
        CALL_ONCE operators first name them (those no init subgraph assigns are absent)."""
        store: dict[str, Any] = {}
        for k in init_subgraphs(self.model):
            store = self.initialise(k, store)
        return store
