"""Graph passes: pure rewrites of the IR, each one rule, run in an explicit pipeline.

A pass is a function ``ir.Model -> ir.Model`` that returns a new model and appends a
:class:`~circle_jax.graph.ir.PassRecord` of what it changed to ``model.passes``; it never reads
or writes bytes (the reader parsed the file once; `circle_jax.formats.writer.write_model`
writes any pass's output). `circle_jax.load` builds its whole pipeline once from its options
(:func:`pipeline_stages`, `.stages`) and runs it once (:func:`run_stages`); every pass is
also usable alone:

    model = read_model("m.tflite")
    model = run(model, [partial(select_signature, key="decode"), untie_shared_constants])
    data = write_model(model, "tflite")

Passes: :func:`fill_conversion_shapes` (`.shapes`) and :func:`fake_quantize_pairs` (`.qdq`),
always first, :func:`select_signature`
and :func:`keep_reachable` (`.signature`),
:func:`dequantize_model` and its inverse for weight-only quantized models
:func:`requantize_weights` (`.dequantize`),
:func:`fake_quantize` (`.fake_quant`: a fully quantized model as the float model that
simulates it, for quantization-aware training),
:func:`untie_shared_constants` (`.untie`), :func:`add_missing_biases` (`.bias`),
:func:`inline_composites` (`.composite`: STABLEHLO_COMPOSITE as its decomposition, for the
exported training step), :func:`unroll_lstms` (`.recurrent`: a plain LSTM layer as its
time steps' builtin operators, for the same), :func:`unroll_static_whiles` (`.loops`: a
WHILE of a static trip count as copies of its body, for the same),
:func:`read_variables_as_constants` (`.variables`: an on-device training file's signature
as an ordinary model);
personalizing ones (:func:`personalize`): :func:`replace_head` (`.head`), :func:`add_lora`
and its inverse :func:`merge_lora` (`.lora`). New passes build on the helpers of
`.edit` (``add_tensor``, ``add_constant``, ``add_operator``, ``set_outputs``, ``record``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable
from functools import partial

from ..errors import ConfigError
from ..graph import ir
from .bias import add_missing_biases, bias_operators, bias_selection
from .composite import inline_composites
from .dequantize import dequantize_model, requantize_weights, weight_only
from .edit import (
    add_constant,
    add_operator,
    add_tensor,
    record,
    replace_inputs,
    replace_subgraph,
    set_inputs,
    set_outputs,
)
from .fake_quant import FakeQuantPlan, fake_quant_plan, fake_quantize
from .head import replace_head
from .loops import unroll_static_whiles
from .lora import adapter_names, add_lora, lora_frozen, lora_targets, merge_lora
from .qdq import fake_quantize_pairs
from .recurrent import unroll_lstms
from .shapes import fill_conversion_shapes
from .signature import (
    keep_reachable,
    reachable,
    select_signature,
    select_subgraph,
    signature_keys,
)
from .stages import Stage, When, pipeline_stages, ran, run_stages
from .untie import untie_shared_constants
from .variables import read_variables_as_constants, uses_variables

Pass = Callable[[ir.Model], ir.Model]


def run(model: ir.Model, passes: Iterable[Pass]) -> ir.Model:
    """``model`` rewritten by each pass in turn."""
    for p in passes:
        model = p(model)
    return model


def pipeline(*, signature: str | None = None, dequantize: bool = False,
             keep_hybrid: bool = False, untie: bool = False, add_bias: bool | str = False,
             policy: str = "weights") -> list[Pass]:
    """The passes of a load's options, in order (`circle_jax.load` runs them as stages of
    :func:`pipeline_stages`, which adds those that depend on the model): shapeless conversion
    outputs shaped (`fill_conversion_shapes`), QDQ pairs as fake quantizations
    (`fake_quantize_pairs`), the signature's
    subgraph made the main one, then every quantized tensor made float32 (``keep_hybrid``:
    hybrid operators' weights keep their grid, `dequantize_model`), then shared
    trainable constants untied (under the trainable ``policy``), then missing biases added
    (``add_bias``: True or "all", False or "none", or a selection of operators,
    `bias_selection`)."""
    passes: list[Pass] = [fill_conversion_shapes, fake_quantize_pairs]
    if signature is not None:
        passes.append(partial(select_signature, key=signature))
    if dequantize:
        passes.append(partial(dequantize_model, keep_hybrid=keep_hybrid))
    if untie:
        passes.append(partial(untie_shared_constants, policy=policy))
    selection = bias_selection(add_bias)
    if selection != "none":
        passes.append(partial(add_missing_biases, selection=selection))
    return passes


def check_lora_options(lora: int | None, lora_alpha: float | None,
                       lora_targets: str | Iterable[str]) -> None:
    """ConfigError (one line) for ``lora_alpha`` or ``lora_targets`` (other than "all", the
    default) given without ``lora``: they shape adapters that would not be made."""
    if lora is None and (lora_alpha is not None or not (
            isinstance(lora_targets, str) and lora_targets == "all")):
        given = "lora_alpha" if lora_alpha is not None else "lora_targets"
        raise ConfigError(f"{given} is given without lora: it applies to LoRA adapters, and "
                          "none are made; expected lora=R with it, or neither")


def personalize(*, new_head: int | None = None, seed: int = 0, output: int = 0,
                lora: int | None = None, lora_alpha: float | None = None,
                lora_targets: str | Iterable[str] = "all") -> list[Pass]:
    """The personalizing passes, in order: the head of output ``output`` replaced by a
    ``new_head``-way one, then rank-``lora`` adapters on ``lora_targets`` (never on the new
    head); both seeded by ``seed``. LoRA's options without ``lora`` are refused
    (`check_lora_options`), and so is a ``seed`` that is not an integer."""
    check_lora_options(lora, lora_alpha, lora_targets)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    passes: list[Pass] = []
    if new_head is not None:
        passes.append(partial(replace_head, classes=new_head, seed=seed, output=output))
    if lora is not None:
        passes.append(partial(add_lora, rank=lora, alpha=lora_alpha, targets=lora_targets,
                              seed=seed + 1))
    return passes


def check_personalizable(model: ir.Model, output: int = 0) -> None:
    """ValueError (one line) for a new head or adapters on a QAT model (`fake_quantize`
    rewrote it); ConfigError for an output index the model lacks."""
    if ran(model, "fake_quantize"):
        raise ValueError("a new head or LoRA adapters on a quantization-aware training "
                         "model are not supported; load it with qat=False (--qat off: the "
                         "dequantized float model)")
    if not 0 <= output < len(model.main.outputs):
        names = [model.main.tensors[i].name for i in model.main.outputs]
        raise ConfigError(f"no model output {output!r}; the outputs are {names}")


def personal_params(model: ir.Model) -> frozenset[str]:
    """The params the personalizing passes added (a new head's, the adapters): what trains
    by default."""
    names = {t.name for t in model.main.tensors if t.is_constant}
    return frozenset(n for r in model.passes if r.name in ("replace_head", "add_lora")
                     for n in r.changes if n in names and not n.endswith("_bias"))


__all__ = [
    "Pass", "adapter_names", "add_constant", "add_lora", "add_missing_biases", "add_operator",
    "FakeQuantPlan", "add_tensor", "bias_operators", "bias_selection", "check_lora_options",
    "check_personalizable",
    "dequantize_model", "fake_quantize_pairs", "fill_conversion_shapes",
    "fake_quant_plan", "fake_quantize", "inline_composites", "keep_reachable", "lora_frozen",
    "lora_targets", "merge_lora",
    "personal_params", "personalize", "pipeline", "pipeline_stages", "ran", "reachable",
    "read_variables_as_constants", "record", "replace_head", "replace_inputs",
    "replace_subgraph", "requantize_weights", "run", "run_stages", "Stage", "When",
    "select_signature", "select_subgraph", "set_inputs", "set_outputs", "signature_keys",
    "unroll_lstms", "unroll_static_whiles", "untie_shared_constants", "uses_variables",
    "weight_only",
]
