"""Numerics profiles: named bundles of the choices that make training match one runtime.

A profile fixes, for a converted model, what the params are and how the loss and Adam are
computed. Pass it to ``circle_jax.load(..., numerics=...)`` (the model keeps it and training
uses it) or to training (``TrainConfig(numerics=...)``, for the loss and optimizer fields).
Explicit settings (``tie_shared_weights=``, ``add_missing_bias=``, ``clip=``,
``from_logits=``, ``optimizer_kwargs={"eps_placement": ...}``) override the profile's.

=================== ========== ============ ===================
field               ``onert``  ``keras``    ``onert-micro``
=================== ========== ============ ===================
tie_shared_weights  False      False        True
add_missing_bias    False      True         False
trainable_policy    weights    weights      weights
cce_clip            onert      keras        onert
softmax_cce         clip       logits       clip
adam_eps            tf         tf           onert_micro
reduction           sum_over_batch_size (all three)
gradients           batch_mean batch_mean   per_sample_sum
=================== ========== ============ ===================

- ``onert`` (the default): what the onert train backend does. Shared constants untied (each
  reading operator trains its own copy), no bias added, CCE on probabilities
  ``-sum t log max(p, 1e-20)``, Adam ``alpha * m / (sqrt(v) + eps)``.
- ``keras``: reproduces ``model.fit`` on the source Keras model: untied, zero biases the
  converter dropped added back, CCE on a SOFTMAX output computed from the softmax's input
  logits (Keras keeps them on its softmax output), otherwise on probabilities clipped to
  [1e-7, 1 - 1e-7]; Keras's Adam (the same as onert's). A ``Dense(use_bias=False)`` converts
  to the same file as a dropped zero bias: train such a model with ``add_missing_bias=False``.
- ``onert-micro``: one tensor per weight (shared constants tied: its .wof holds one buffer per
  tensor), Adam ``m_hat / sqrt(v_hat + eps)``; it sums per-sample gradients and divides by the
  batch size, which is the gradient of the mean loss (the same function, computed batched).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from .graph.params_policy import check_policy

SOFTMAX_CCE = ("clip", "logits")
ADAM_EPS = ("tf", "optax", "onert_micro")


@dataclass(frozen=True)
class Numerics:
    """One numerics profile (see the module docstring for the meaning of each field)."""

    name: str
    tie_shared_weights: bool = False
    add_missing_bias: bool = False
    trainable_policy: str = "weights"
    cce_clip: str = "onert"
    softmax_cce: str = "clip"
    adam_eps: str = "tf"
    reduction: str = "sum_over_batch_size"
    gradients: str = "batch_mean"

    def __post_init__(self) -> None:
        check_policy(self.trainable_policy)
        if self.softmax_cce not in SOFTMAX_CCE:
            raise ValueError(f"softmax_cce must be one of {SOFTMAX_CCE}, got {self.softmax_cce!r}")
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
    "keras": Numerics("keras", add_missing_bias=True, cce_clip="keras", softmax_cce="logits"),
    "onert-micro": Numerics("onert-micro", tie_shared_weights=True, adam_eps="onert_micro",
                            gradients="per_sample_sum"),
}
DEFAULT = "onert"


def get_numerics(spec: str | Numerics | None) -> Numerics:
    """A profile by name (``onert``, ``keras``, ``onert-micro``; None: onert) or as given."""
    if spec is None:
        return PROFILES[DEFAULT]
    if isinstance(spec, Numerics):
        return spec
    key = str(spec).lower().replace("_", "-")
    if key in PROFILES:
        return PROFILES[key]
    raise ValueError(f"unknown numerics profile {spec!r}: use one of {', '.join(PROFILES)}")
