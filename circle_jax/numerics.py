"""Numerics profiles: named bundles of the choices that make training match one runtime.

A profile fixes, for a converted model, what the params are and how the loss and Adam are
computed. Pass it to ``circle_jax.load(..., numerics=...)`` (the model keeps it and training
uses it) or to training (``TrainConfig(numerics=...)``, for the loss and optimizer fields).
Explicit settings (``tie_shared_weights=``, ``add_missing_bias=``, ``clip=``,
``from_logits=``, ``optimizer_kwargs={"eps_placement": ...}``) override the profile's.
``add_missing_bias`` is "all", "none" or the operators that get a zero bias
(`circle_jax.passes.bias_selection`: ``"op3,op5"``).

=================== ========== ============ =============== ===========
field               ``onert``  ``keras``    ``onert-micro`` ``torch``
=================== ========== ============ =============== ===========
tie_shared_weights  False      False        True            False
add_missing_bias    none       all          none            all
trainable_policy    weights    weights      fc_conv         weights
cce_clip            onert      keras        onert           onert
softmax_cce         clip       logits       clip            logits
other_cce           logits     clip         clip            logits
adam_eps            tf         tf           onert_micro     optax
optimizers          keras      keras        keras           torch
reduction           sum_over_batch_size (all four)
gradients           batch_mean batch_mean   per_sample_sum  batch_mean
embedding_adam      dense      sparse       dense           dense
=================== ========== ============ =============== ===========

CCE reads the trained output in one of two ways: ``softmax_cce`` when the operator producing
it is a SOFTMAX (``clip``: the probabilities, clipped by ``cce_clip``; ``logits``: the
SOFTMAX's input, through a stable log-softmax), ``other_cce`` for any other output (``clip``:
the output taken as probabilities; ``logits``: the output taken as logits). An explicit
``from_logits=True`` reads the output as logits whatever produces it.

- ``onert`` (the default): what the onert 0.1.0 train backend does, measured against the
  wheel (tests/oracle/test_onert_cce.py). Shared constants untied (each reading operator
  trains its own copy), no bias added; CCE on a SOFTMAX output is ``-sum t log max(p,
  1e-20)`` of its probabilities, on any other output (logits, or a SOFTMAX followed by a
  RESHAPE) the softmax cross-entropy of that output; Adam ``alpha * m / (sqrt(v) + eps)``.
- ``keras``: reproduces ``model.fit`` on the source Keras model: untied, zero biases the
  converter dropped added back, CCE on a SOFTMAX output computed from the softmax's input
  logits (Keras keeps them on its softmax output), otherwise on probabilities clipped to
  [1e-7, 1 - 1e-7]; Keras's Adam (the same as onert's). A ``Dense(use_bias=False)`` converts
  to the same file as a dropped zero bias: train such a model with ``add_missing_bias`` naming
  only the operators that had one (or "none"). ``embedding_adam = sparse``: on an embedding
  table (a param read only as the table of GATHER / GATHER_ND / EMBEDDING_LOOKUP), Adam's
  second moment takes, per row, the sum over the batch's occurrences of the squared row
  gradients, where dense Adam takes the square of their sum (Keras's Adam on the table's
  IndexedSlices gradient; `circle_jax.optim.adam_tf`). It applies to ``adam`` and ``adamw``
  with eps placement ``tf`` and no loss scaling or gradient accumulation.
- ``onert-micro``: derived from ONE's onert-micro sources (../shared/docs/formats.md names
  the files), never run against a peer: none runs here. One tensor per weight (shared
  constants tied: its .wof holds one buffer per tensor), Adam ``m_hat / sqrt(v_hat + eps)``,
  CCE ``-sum t log(p)`` on the probabilities (its gradient ``-t / (p + 1e-31)``; clipped here
  at 1e-20), MSE ``mean (p - t)**2`` per sample. It sums per-sample gradients: SGD divides
  the sum by the batch size (the gradient of the mean loss, computed batched here), the
  newest Adam (train_optimizers/Adam.cpp) feeds the SUM to its moments, so Adam here sees
  the batch size times the mean gradient (``gradients = per_sample_sum``; older onert-micro
  versions divided first, which is ``eps`` smaller by the batch size squared). Only
  FULLY_CONNECTED and CONV_2D weights and biases train (``trainable_policy = fc_conv``).
- ``torch``: reproduces a PyTorch training loop on the source model of a litert-torch
  conversion: untied, zero biases the converter dropped added back (torch initialises
  ``nn.MultiheadAttention``'s projection biases to zero, and trains them; a bias-free
  ``nn.Linear`` converts to the same file: name the operators that had a bias with
  ``add_missing_bias``, or "none"),
  ``nn.CrossEntropyLoss`` (from logits, mean over the batch; on a SOFTMAX output
  the SOFTMAX's input logits), ``nn.MSELoss`` (mean over all elements) and torch.optim's
  optimizers (`circle_jax.optim.TORCH_OPTIMIZERS`: SGD with momentum, dampening, nesterov
  and L2 weight decay; Adam and AdamW with eps added to ``sqrt(v_hat)``, default 1e-8,
  AdamW's decay decoupled, default 0.01; RMSprop, alpha 0.99, eps 1e-8 outside the root).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .graph.params_policy import check_policy

SOFTMAX_CCE = ("clip", "logits")
ADAM_EPS = ("tf", "optax", "onert_micro")
OPTIMIZER_FAMILIES = ("keras", "torch")
GRADIENTS = ("batch_mean", "per_sample_sum")
EMBEDDING_ADAM = ("dense", "sparse")


@dataclass(frozen=True)
class Numerics:
    """One numerics profile (see the module docstring for the meaning of each field)."""

    name: str
    tie_shared_weights: bool = False
    add_missing_bias: str = "none"
    trainable_policy: str = "weights"
    cce_clip: str = "onert"
    softmax_cce: str = "clip"
    other_cce: str = "logits"
    adam_eps: str = "tf"
    optimizers: str = "keras"
    reduction: str = "sum_over_batch_size"
    gradients: str = "batch_mean"
    embedding_adam: str = "dense"

    def __post_init__(self) -> None:
        check_policy(self.trainable_policy)
        for name in ("softmax_cce", "other_cce"):
            if getattr(self, name) not in SOFTMAX_CCE:
                raise ValueError(f"{name} must be one of {SOFTMAX_CCE}, got "
                                 f"{getattr(self, name)!r}")
        if self.optimizers not in OPTIMIZER_FAMILIES:
            raise ValueError(f"optimizers must be one of {OPTIMIZER_FAMILIES}, got "
                             f"{self.optimizers!r}")
        if self.gradients not in GRADIENTS:
            raise ValueError(f"gradients must be one of {GRADIENTS}, got {self.gradients!r}")
        if self.embedding_adam not in EMBEDDING_ADAM:
            raise ValueError(f"embedding_adam must be one of {EMBEDDING_ADAM}, got "
                             f"{self.embedding_adam!r}")
        if self.adam_eps not in ADAM_EPS:
            raise ValueError(f"adam_eps must be one of {ADAM_EPS}, got {self.adam_eps!r}")

    def with_overrides(self, **overrides: Any) -> Numerics:
        """This profile with the fields given (not None) replaced; the name notes the change."""
        changed = {k: v for k, v in overrides.items() if v is not None and getattr(self, k) != v}
        if not changed:
            return self
        note = ",".join(f"{k}={v}" for k, v in changed.items())
        return replace(self, name=f"{self.name.split('+')[0]}+{note}", **changed)

    def as_dict(self) -> dict[str, str]:
        """``numerics`` (the name) and ``numerics.<field>`` -> value, as text."""
        return {"numerics": self.name, **{f"numerics.{f.name}": str(getattr(self, f.name))
                                          for f in fields(self) if f.name != "name"}}

    def describe(self) -> list[str]:
        """``field = value`` lines for the parameter block, the profile's name first."""
        return [f"numerics = {self.name}"] + [
            f"  {f.name} = {getattr(self, f.name)}" for f in fields(self) if f.name != "name"
        ]


PROFILES: dict[str, Numerics] = {
    "onert": Numerics("onert"),
    "keras": Numerics("keras", add_missing_bias="all", cce_clip="keras", softmax_cce="logits",
                      other_cce="clip", embedding_adam="sparse"),
    "onert-micro": Numerics("onert-micro", tie_shared_weights=True, trainable_policy="fc_conv",
                            adam_eps="onert_micro", other_cce="clip",
                            gradients="per_sample_sum"),
    "torch": Numerics("torch", add_missing_bias="all", softmax_cce="logits", adam_eps="optax",
                      optimizers="torch"),
}
DEFAULT = "onert"


def get_numerics(spec: str | Numerics | None) -> Numerics:
    """A profile by name (``onert``, ``keras``, ``onert-micro``, ``torch``; None: onert) or as
    given."""
    if spec is None:
        return PROFILES[DEFAULT]
    if isinstance(spec, Numerics):
        return spec
    key = str(spec).lower().replace("_", "-")
    if key in PROFILES:
        return PROFILES[key]
    raise ValueError(f"unknown numerics profile {spec!r}: use one of {', '.join(PROFILES)}")
