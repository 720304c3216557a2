"""`circle_jax.load`'s pass pipeline: built once from the load options, run once over the IR.

Rules:

- :func:`pipeline_stages` builds every pass a load runs before the file is read (refusing
  bad options there); :func:`run_stages` runs them once over the parsed IR, in order.
- The stages, each keeping the model it leaves (what `circle_jax.Model` keeps besides the
  final IR): ``selected`` (the conversion shapes filled and QDQ pairs made fake
  quantizations, always first; the signature's subgraph made the main one; an on-device
  training file's variables read as constants, the subgraphs it no longer reaches
  dropped), ``float`` (quantized tensors made float32 where the load dequantizes),
  ``trained`` (a quantization-aware training load's fake quantization, or else the trainable
  policy's untied copies and added biases) and, when asked, ``personal`` (a new head, LoRA
  adapters).
- Where a pass applies depends on the model as it reaches it (a file with resource
  variables, a weight-only quantized model, quantized activations): :class:`When` decides
  there, once, and which branch ran is read back from the pass records (:func:`ran`).
- A stage's ``check`` refuses (one line) before its passes read what it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CircleFormatError, UnsupportedOperatorError
from ..graph import ir
from ..graph.checks import check_tensor_quantization
from .bias import add_missing_biases, bias_selection
from .dequantize import dequantize_model, weight_only
from .fake_quant import fake_quantize, quantized_activations
from .qdq import fake_quantize_pairs
from .shapes import fill_conversion_shapes
from .signature import keep_reachable, select_signature
from .untie import untie_shared_constants
from .variables import read_variables_as_constants, uses_variables

if TYPE_CHECKING:  # checked settings come from load; .qat reads ops' fake quantization
    from .qat import QatSettings

Pass = Callable[[ir.Model], ir.Model]
Check = Callable[[ir.Model], None]

#: The stage names, in the order they run.
STAGES = ("selected", "float", "trained", "personal")


@dataclass(frozen=True)
class When:
    """A pass: ``passes`` when ``predicate`` holds for the model reaching it, else
    ``otherwise`` (the predicate is read once, before any of them runs)."""

    predicate: Callable[[ir.Model], bool]
    passes: tuple[Pass, ...]
    otherwise: tuple[Pass, ...] = ()

    def __call__(self, model: ir.Model) -> ir.Model:
        for p in self.passes if self.predicate(model) else self.otherwise:
            model = p(model)
        return model


@dataclass(frozen=True)
class Stage:
    """A named run of passes; ``check`` refuses before they run."""

    name: str
    passes: tuple[Pass, ...]
    check: Check | None = None


def run_stages(model: ir.Model, stages: Sequence[Stage]) -> dict[str, ir.Model]:
    """Stage name -> the model as that stage left it, each stage run once, in order."""
    out: dict[str, ir.Model] = {}
    for stage in stages:
        if stage.check is not None:
            stage.check(model)
        for p in stage.passes:
            model = p(model)
        out[stage.name] = model
    return out


def ran(model: ir.Model, name: str) -> bool:
    """Whether pass ``name`` rewrote ``model`` (its record is there, changes or not)."""
    return any(r.name == name for r in model.passes)


def dequantizes(dequantize: bool | None, qat: bool | str | None
                ) -> Callable[[ir.Model], bool]:
    """Whether a load with these options dequantizes a model: ``dequantize`` when given;
    with ``qat=False``, when the model has quantized activations (float training); else
    when it is weight-only quantized."""
    if dequantize is not None:
        return lambda model: dequantize
    if qat is False:
        return quantized_activations
    return weight_only


def dequantized_in_layout(dequantize: bool | None, qat: bool | str | None) -> bool:
    """Whether a dequantized model keeps its file's layout (export requantizes it, hybrid
    operators keep their grid): a dequantization neither asked for nor implied by
    ``qat=False``."""
    return dequantize is None and qat is not False


def _quantization_check(decide: Callable[[ir.Model], bool]) -> Check:
    def check(model: ir.Model) -> None:
        """The dequantize pass reads the quantization parameters: refuse bad ones as
        lowering would, in one line."""
        if not decide(model):
            return
        malformed, unsupported = check_tensor_quantization(model)
        if malformed or unsupported:
            error = CircleFormatError if malformed else UnsupportedOperatorError
            raise error(f"{len(malformed + unsupported)} invalid tensor quantization(s): "
                        + "; ".join(malformed + unsupported)[:1000])
    return check


def pipeline_stages(*, signature: str | None = None, dequantize: bool | None = None,
                    qat: QatSettings | None = None, untie: bool = False,
                    add_bias: bool | str = False, policy: str = "weights",
                    variables: Mapping[str, np.ndarray] | None = None,
                    personal: Sequence[Pass] = (), personal_check: Check | None = None
                    ) -> tuple[Stage, ...]:
    """Every stage of a load with these options (see the module docstring): ``qat`` the
    checked QAT settings (`QatSettings.of`: its ``check_applies`` runs before the
    ``trained`` stage); ``untie``, ``add_bias``, ``policy`` the trainable policy's rewrites
    of a load that does not simulate; ``variables`` the values an on-device file's variables
    take over its initial ones (a restored checkpoint's); ``personal`` the personalizing passes
    (`circle_jax.passes.personalize`), after ``personal_check``."""
    mode = None if qat is None else qat.qat
    first: list[Pass] = [fill_conversion_shapes, fake_quantize_pairs]
    if signature is not None:
        first.append(partial(select_signature, key=signature))
    reads = partial(read_variables_as_constants, values=variables) if variables \
        else read_variables_as_constants
    first.append(When(uses_variables, (reads, keep_reachable)))
    decide = dequantizes(dequantize, mode)
    keep_hybrid = dequantized_in_layout(dequantize, mode)
    rewrites: list[Pass] = []
    if untie:
        rewrites.append(partial(untie_shared_constants, policy=policy))
    selection = bias_selection(add_bias)
    if selection != "none":
        rewrites.append(partial(add_missing_biases, selection=selection))

    def simulates(model: ir.Model) -> bool:
        return bool(mode) and quantized_activations(model)

    def qat_check(model: ir.Model) -> None:
        if qat is not None:
            qat.check_applies(quantized_activations(model))

    stages = [
        Stage("selected", tuple(first)),
        Stage("float", (When(decide, (partial(dequantize_model, keep_hybrid=keep_hybrid),)),),
              _quantization_check(decide)),
        Stage("trained", (When(simulates, (fake_quantize,), tuple(rewrites)),), qat_check),
    ]
    if personal:
        stages.append(Stage("personal", tuple(personal), personal_check))
    return tuple(stages)
