"""``circle_jax.load``: a model file becomes a pure ``apply`` plus a params pytree."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import ir
from .aliases import param_aliases, resolve_param_names
from .formats.reader import read_model
from .formats.writer import export_model
from .lower import Lowered, ParamKey
from .lowering import LoweringOptions


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a model input or output."""

    name: str
    shape: tuple[int, ...]
    dtype: str


class Model:
    """A loaded model: ``apply(params, *inputs) -> tuple`` and its float weights ``params``.

    ``apply`` is pure: it reads weights only from the ``params`` argument, so it can be
    differentiated, jitted and vmapped. ``params`` maps unique tensor names to arrays.
    ``lowering`` chooses the operators' implementations (see :func:`load`).
    """

    def __init__(self, model: ir.Model, lowering: str | LoweringOptions | None = None) -> None:
        self.ir = model
        self._lowered = Lowered(model, lowering)
        self._variants: dict[tuple, Lowered] = {}
        self.param_keys: dict[str, ParamKey] = dict(self._lowered.params)
        self.params: dict[str, jax.Array] = {
            name: jnp.asarray(model.subgraphs[k].tensors[i].data)
            for name, (k, i) in self.param_keys.items()
        }
        sg = model.main
        self.inputs = tuple(_spec(sg.tensors[i]) for i in sg.inputs)
        self.outputs = tuple(_spec(sg.tensors[i]) for i in sg.outputs)

    def apply(self, params: Mapping[str, Any], *inputs: Any) -> tuple[jax.Array, ...]:
        """The model's outputs for ``inputs``, in the model's output order."""
        return self._lowered.apply(params, *(jnp.asarray(x) for x in inputs))

    @property
    def lowering(self) -> LoweringOptions:
        """The options the operators were lowered with."""
        return self._lowered.options

    def lowered(self, **changes: Any) -> Callable[..., tuple[jax.Array, ...]]:
        """``apply`` lowered with ``changes`` to :attr:`lowering`, e.g. ``in_loop=True`` for a
        model traced inside a compiled loop body (a ``lax.scan`` over batches)."""
        key = tuple(sorted(changes.items()))
        if key not in self._variants:
            self._variants[key] = self._lowered.with_options(**changes)
        variant = self._variants[key]

        def apply(params: Mapping[str, Any], *inputs: Any) -> tuple[jax.Array, ...]:
            return variant.apply(params, *(jnp.asarray(x) for x in inputs))

        return apply

    def intermediates(self, params: Mapping[str, Any], *inputs: Any) -> dict[str, jax.Array]:
        """Every tensor of the main subgraph, keyed by tensor name (for oracle dumps)."""
        return self._lowered.intermediates(params, *(jnp.asarray(x) for x in inputs))

    def __call__(self, *inputs: Any) -> tuple[jax.Array, ...]:
        """``apply`` with the model's own weights."""
        return self.apply(self.params, *inputs)

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
        """Param name -> short readable alias (``op3.bias``; see `circle_jax.aliases`)."""
        return param_aliases(self.ir, self.param_keys)

    def resolve_params(self, names: Iterable[str]) -> frozenset[str]:
        """The param names meant by ``names``, each a param name or an alias."""
        return resolve_param_names(self.ir, self.param_keys, names)

    def export(
        self,
        params: Mapping[str, Any] | None = None,
        file_format: str | None = None,
        metadata: Mapping[str, bytes | None] | None = None,
    ) -> bytes:
        """The model file's bytes with ``params`` written in (default: the model's own).

        Everything else (operators, tensors, names, metadata, signature defs) is preserved.
        ``file_format`` is "circle" or "tflite" (TFL3, version 3: LiteRT runs it).
        """
        params = self.params if params is None else params
        unknown = sorted(set(params) - set(self.param_keys))
        if unknown:
            raise ValueError(f"unknown param name(s) {unknown}")
        weights = {}
        for name, value in params.items():
            k, i = self.param_keys[name]
            old, new = self.ir.subgraphs[k].tensors[i].data, np.asarray(value).astype(
                self.ir.subgraphs[k].tensors[i].data.dtype)
            if old.tobytes() != new.tobytes():  # unchanged weights keep shared buffers shared
                weights[(k, i)] = new
        return export_model(self.ir, weights, file_format=file_format, metadata=metadata)

    def summary(self) -> str:
        """A printable table of operators, tensors and parameter counts."""
        return summarize(self.ir, self.param_keys)

    def __repr__(self) -> str:
        n = sum(int(np.prod(p.shape)) for p in self.params.values())
        return (
            f"Model({self.ir.format}, {len(self.operators)} operators, "
            f"{len(self.params)} params / {n} weights, inputs={[s.shape for s in self.inputs]})"
        )


def _spec(t: ir.Tensor) -> TensorSpec:
    return TensorSpec(t.name, t.shape, t.dtype)


def load(source: str | os.PathLike | bytes,
         lowering: str | LoweringOptions | None = None) -> Model:
    """Load a .circle or .tflite model (a path or the file's bytes).

    ``lowering``: "fast" (the kernels of ``circle_jax.lowering``), "reference" (the plain
    definitions of ``circle_jax.ops``), a :class:`~circle_jax.lowering.LoweringOptions`, or
    None: fast on CPU, reference on other backends. Every operator's options are checked
    here: one error lists every refusal.
    """
    return Model(read_model(source), lowering)


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
