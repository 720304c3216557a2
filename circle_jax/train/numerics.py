"""How a numerics profile shapes a training run: the loss's clip and input, the optimizer
family, Adam's epsilon.

The profile is ``TrainConfig.numerics`` when set, else the one the model was loaded with. Its
load-time fields (untying, added biases, trainable policy) already shaped the model; here
only the training fields apply, and only where the configuration leaves them unset.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..graph.params_policy import embedding_tables
from ..model import Model
from ..numerics import Numerics, get_numerics

_CCE = ("categorical_crossentropy", "sparse_categorical_crossentropy")
_ADAMS = ("adam", "adamw")
_ALL_ADAMS = (*_ADAMS, "adam_optax", "adam_onert_micro")


@dataclass(frozen=True)
class TrainingNumerics:
    """What the profile decided for one run.

    Attributes:
      numerics: the profile.
      apply: the forward used for the loss (the model's, or one that returns the softmax's
        input logits when CCE is computed from them).
      apply_in_loop: the same lowered for loop bodies (``in_loop=True``: an epoch's scan).
      from_logits: the loss reads logits.
      logits_of: (tensor index, beta) of the SOFTMAX input the loss reads instead of the
        trained output, or None when it reads that output.
      clip: the probability clip for CCE on probabilities ("onert" or "keras").
      optimizer_kwargs: the optimizer's keywords, with Adam's ``eps_placement`` filled in
        (Keras-family optimizers only).
      optimizers: the optimizer family, ``keras`` or ``torch`` (`circle_jax.optim`).
      sum_gradients: Adam's moments take the batch's SUM of per-sample gradients (the
        profile's ``gradients = per_sample_sum``: onert-micro's Adam); the trainer scales the
        mean loss's gradient by the batch size.
      row_squares: the embedding tables whose Adam second moment takes the per-occurrence
        sum of squared row gradients (``embedding_adam = sparse`` with ``adam`` / ``adamw``
        at the ``tf`` eps placement; `circle_jax.lowering.interpreter.RowSquares`).
    """

    numerics: Numerics
    apply: Callable[..., tuple[Any, ...]]
    apply_in_loop: Callable[..., tuple[Any, ...]]
    from_logits: bool
    clip: Any
    optimizer_kwargs: dict[str, Any]
    logits_of: tuple[int, float] | None = None
    optimizers: str = "keras"
    sum_gradients: bool = False
    row_squares: frozenset[str] = frozenset()


def softmax_input(model: Model, output: int = 0) -> tuple[int, float] | None:
    """(tensor index, beta) of the input of the SOFTMAX producing model output ``output``,
    or None when that output is not a SOFTMAX's output."""
    sg = model.ir.main
    out = sg.outputs[output]
    op = next((o for o in sg.operators if out in o.outputs), None)
    if op is None or op.type != "SOFTMAX":
        return None
    return op.inputs[0], float(op.options.beta or 1.0)


def softmax_logits_apply(model: Model, output: int = 0, **changes: Any
                         ) -> Callable[..., tuple[Any, ...]] | None:
    """``apply`` whose output ``output`` is the logits of the SOFTMAX producing it (times
    its beta), or None when that output is not a SOFTMAX's output; ``changes`` go to the
    lowering options (``in_loop=True``). A view of the model's lowering (`Model.view`):
    nothing is lowered again."""
    source = softmax_input(model, output)
    if source is None:
        return None
    logits, beta = source
    outputs = list(model.ir.main.outputs)
    outputs[output] = logits
    lowered = model.view(outputs, **changes)  # the model's one lowering, other outputs

    def apply(params: Any, *inputs: Any, **observed: Any) -> tuple[Any, ...]:
        outs = list(lowered.apply(params, *inputs, **observed))
        if beta != 1.0:
            outs[output] = outs[output] * beta
        return tuple(outs)

    return apply


def training_numerics(model: Model, loss: str, optimizer: str, spec: Any, from_logits: Any,
                      clip: Any, optimizer_kwargs: dict[str, Any],
                      lowering: Mapping[str, Any] | None = None, output: int = 0
                      ) -> TrainingNumerics:
    """The profile's choices for ``loss`` / ``optimizer`` on model output ``output``,
    explicit settings taking priority; the forwards lowered with the ``lowering`` changes to
    the model's options (``backend``: the devices training runs on)."""
    prof = model.numerics if spec is None else get_numerics(spec)
    kwargs = dict(optimizer_kwargs)
    if optimizer in _ADAMS and prof.optimizers == "keras":
        kwargs.setdefault("eps_placement", prof.adam_eps)
    changes = dict(lowering or {})
    apply = model.lowered(**changes) if changes else model.apply
    in_loop = model.lowered(in_loop=True, **changes)
    logits_of = None
    if loss in _CCE and not from_logits:
        if softmax_input(model, output) is None:
            from_logits = prof.other_cce == "logits"
        elif prof.softmax_cce == "logits":
            apply = softmax_logits_apply(model, output, **changes)
            in_loop = softmax_logits_apply(model, output, in_loop=True, **changes)
            from_logits, logits_of = True, softmax_input(model, output)
    sparse = prof.embedding_adam == "sparse" and optimizer in _ADAMS and \
        prof.optimizers == "keras" and kwargs.get("eps_placement") == "tf"
    return TrainingNumerics(prof, apply, in_loop, bool(from_logits),
                            prof.cce_clip if clip is None else clip, kwargs, logits_of,
                            prof.optimizers,
                            prof.gradients == "per_sample_sum" and optimizer in _ALL_ADAMS,
                            embedding_tables(model.ir, model.param_keys) if sparse
                            else frozenset())
