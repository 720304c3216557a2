"""Precision policy: the dtypes of stored weights, computation, gradients and outputs.

Vocabulary (as jmp and nntrainer): the *param* (variable) dtype is how weights are stored,
the *compute* dtype is what the forward pass runs in, the *grad* dtype is what gradients
are cast to before the optimizer, the *output* dtype is what the model returns to the loss.

Specs `get_policy` accepts:

- a `Policy`, or None (all float32);
- jmp's form ``"p=f32,c=f16,o=f32"`` (long keys ``params=``, ``compute=``, ``output=``,
  ``grad=``/``g=``); a missing ``g`` is the param dtype, anything else missing is float32;
- nntrainer's weight-activation pair ``"fp16-fp16"``, ``"fp32-fp16"``, ``"bf16-bf16"``
  (case-insensitive): param = grad = the first, compute = output = the second;
- one dtype name ``"float32"``/``"f32"``/``"fp16"``/``"bf16"``/...: all four dtypes;
- Keras' ``"mixed_float16"``/``"mixed_bfloat16"``: float32 params, grads and output,
  half compute.

The rule for half compute (Keras' ``mixed_float16``, whose softmax outputs, normalization
statistics and losses are float32): the operators of :data:`FLOAT32_OPERATORS` compute in
float32 (their half inputs are cast up, their outputs back to half, except model outputs,
which reach the loss in float32), and losses always compute in float32. Those operators
are where a half result overflows or loses the loss: a softmax's small probabilities
underflow float16 (its smallest subnormal is 6e-8), and cross-entropy's gradient
``-t / (N p)`` at such a probability exceeds float16's 65504 even at loss scale 1; a sum
or mean over many elements, a pooling window's sum, a norm's sum of squares or variance
exceed 65504, or lose the small addends, in a float16 accumulator.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from circle_jax.errors import ConfigError

_DTYPES: dict[str, np.dtype] = {}
for _names, _dt in (
    (("float32", "f32", "fp32", "float"), jnp.float32),
    (("float16", "f16", "fp16", "half"), jnp.float16),
    (("bfloat16", "bf16"), jnp.bfloat16),
    (("float64", "f64", "fp64", "double"), jnp.float64),
):
    for _n in _names:
        _DTYPES[_n] = np.dtype(_dt)

_MIXED = {"mixed_float16": np.dtype(jnp.float16), "mixed_bfloat16": np.dtype(jnp.bfloat16)}

_KEYS = {
    "p": "param_dtype",
    "param": "param_dtype",
    "params": "param_dtype",
    "param_dtype": "param_dtype",
    "c": "compute_dtype",
    "compute": "compute_dtype",
    "compute_dtype": "compute_dtype",
    "g": "grad_dtype",
    "grad": "grad_dtype",
    "grads": "grad_dtype",
    "gradient": "grad_dtype",
    "grad_dtype": "grad_dtype",
    "o": "output_dtype",
    "output": "output_dtype",
    "output_dtype": "output_dtype",
}

_FORMS = (
    "'p=f32,c=f16,o=f32' (keys p/c/g/o), 'fp32-fp16' (weight-activation), "
    "'float32'/'fp16'/'bf16', 'mixed_float16'/'mixed_bfloat16' or a Policy"
)


FLOAT32_OPERATORS: frozenset[str] = frozenset({
    "SOFTMAX", "LOG_SOFTMAX",  # probabilities below float16's range; the loss's log
    "MEAN", "SUM", "REDUCE_PROD", "CUMSUM",  # reductions: float32 accumulators
    "AVERAGE_POOL_2D", "L2_POOL_2D",  # window sums
    "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION", "INSTANCE_NORM", "RMS_NORM",
})
"""The operators a half-compute `Policy` runs in float32 (see the module docstring)."""


def to_dtype(spec: Any) -> np.dtype:
    """A floating numpy dtype from a name (``"f16"``, ``"bfloat16"``, ...) or a dtype."""
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key in _DTYPES:
            return _DTYPES[key]
        raise ConfigError(
            f"unknown float dtype {spec!r}: use float32/f32/fp32, float16/f16/fp16 or bfloat16/bf16"
        )
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise ConfigError(f"not a dtype: {spec!r}") from None
    if not jnp.issubdtype(dt, jnp.floating):
        raise ConfigError(f"a precision policy needs floating dtypes, got {dt}")
    return dt


def _short(dt: np.dtype) -> str:
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}[dt.name]


def _cast(tree: Any, dtype: np.dtype) -> Any:
    def leaf(x):
        if hasattr(x, "dtype") and x.dtype != dtype and jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        return x

    return jax.tree.map(leaf, tree)


@dataclasses.dataclass(frozen=True)
class Policy:
    """Dtypes for one training run; ``cast_to_*`` cast floating leaves of a pytree only.

    Attributes:
      param_dtype: how weights (variables) are stored and updated.
      compute_dtype: what the forward (and backward) pass computes in.
      grad_dtype: what gradients are cast to before the optimizer sees them (None: the
        param dtype). With float32 weights and gradients and half compute, the weights'
        gradients are computed in float32, not in half and cast up
        (`float32_weight_grads`).
      output_dtype: what model outputs are cast to before the loss.
      float32_ops: the operator keys that compute in float32 when the compute dtype is half
        (None: :data:`FLOAT32_OPERATORS`; empty: none, every operator in half); empty when
        the compute dtype is float32 or wider.
    """

    param_dtype: Any = np.dtype(jnp.float32)
    compute_dtype: Any = np.dtype(jnp.float32)
    grad_dtype: Any = None
    output_dtype: Any = np.dtype(jnp.float32)
    float32_ops: Any = None

    def __post_init__(self):
        if self.grad_dtype is None:
            object.__setattr__(self, "grad_dtype", self.param_dtype)
        for name in ("param_dtype", "compute_dtype", "grad_dtype", "output_dtype"):
            object.__setattr__(self, name, to_dtype(getattr(self, name)))
        ops = FLOAT32_OPERATORS if self.float32_ops is None else self.float32_ops
        if isinstance(ops, str) or not all(isinstance(k, str) for k in ops):
            raise ConfigError(f"float32_ops must be a collection of operator names, got {ops!r}")
        half = np.dtype(self.compute_dtype).itemsize < 4
        object.__setattr__(self, "float32_ops", frozenset(ops) if half else frozenset())

    def cast_to_param(self, tree: Any) -> Any:
        return _cast(tree, self.param_dtype)

    def cast_to_compute(self, tree: Any) -> Any:
        return _cast(tree, self.compute_dtype)

    def cast_to_grad(self, tree: Any) -> Any:
        return _cast(tree, self.grad_dtype)

    def cast_to_output(self, tree: Any) -> Any:
        return _cast(tree, self.output_dtype)

    def __str__(self) -> str:
        text = (f"p={_short(self.param_dtype)},c={_short(self.compute_dtype)},"
                f"g={_short(self.grad_dtype)},o={_short(self.output_dtype)}")
        if self.float32_ops and self.float32_ops != FLOAT32_OPERATORS:
            text += f" (float32: {','.join(sorted(self.float32_ops))})"
        elif not self.float32_ops and np.dtype(self.compute_dtype).itemsize < 4:
            text += " (every operator in half)"
        return text


def _parse_jmp(spec: str) -> Policy:
    fields: dict[str, np.dtype] = {}
    for part in spec.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in _KEYS:
            bad = part.strip()
            raise ConfigError(f"bad part {bad!r} of precision policy {spec!r}: use {_FORMS}")
        fields[_KEYS[key]] = to_dtype(value)
    fields.setdefault("param_dtype", np.dtype(jnp.float32))
    fields.setdefault("grad_dtype", fields["param_dtype"])
    return Policy(**fields)


def get_policy(spec: Any = None) -> Policy:
    """Resolve a precision policy spec (see the module docstring for the accepted forms)."""
    if isinstance(spec, Policy):
        return spec
    if spec is None:
        return Policy()
    if not isinstance(spec, str):
        raise ConfigError(f"unknown precision policy {spec!r}: use {_FORMS}")
    s = spec.strip().lower()
    if "=" in s:
        return _parse_jmp(s)
    if s in _MIXED:
        return Policy(compute_dtype=_MIXED[s])
    if s in _DTYPES:
        dt = _DTYPES[s]
        return Policy(dt, dt, dt, dt)
    weight, sep, activation = s.partition("-")
    if sep and weight in _DTYPES and activation in _DTYPES:
        w, a = _DTYPES[weight], _DTYPES[activation]
        return Policy(param_dtype=w, compute_dtype=a, grad_dtype=w, output_dtype=a)
    raise ConfigError(f"unknown precision policy {spec!r}: use {_FORMS}")


def master_weights_needed(policy: Policy) -> bool:
    """True when weights are stored in a half dtype, so training keeps float32 master weights.

    Design: the optimizer state and the update act on a float32 master copy of every
    weight; the half copy (``policy.cast_to_param(master)``) is derived from it after each
    update and only feeds the forward pass. Updates smaller than a half ulp would otherwise
    be lost (nntrainer keeps FP32 master weights beside FP16 ones for this reason).
    """
    return np.dtype(policy.param_dtype).itemsize < 4


def float32_weight_grads(policy: Policy) -> bool:
    """True when a policy computes in half while its weights and gradients are float32 (or
    wider), as ``mixed_float16`` and ``p=f32,c=f16,o=f32`` do: the weights' gradients are
    then computed in float32 (`LoweringOptions.half_weights`), not in half and cast up.

    Design: a weight's gradient is a sum over the batch and every position the weight is
    applied at, the largest sum of a backward pass; in float16 it passes 65504 at the loss
    scales the dynamic scale starts from (measured on ResNet-8: a CONV_2D weight gradient
    overflows at every scale from 2**15 down to 2**11), and each such step is skipped.
    Kept in float32, only the activations and their gradients are half, which the loss
    scale is for.
    """
    return (np.dtype(policy.compute_dtype).itemsize < 4
            and min(np.dtype(policy.param_dtype).itemsize,
                    np.dtype(policy.grad_dtype).itemsize) >= 4)


def grad_cast(tree: dict, dtype: Any) -> dict:
    """Identity forward; the backward rounds cotangents to ``dtype`` (the gradient dtype).

    A no-op where the masters already have that dtype (float32, or float64 under x64).
    """
    if all(np.dtype(v.dtype) == np.dtype(dtype) for v in jax.tree.leaves(tree)
           if jnp.issubdtype(v.dtype, jnp.floating)):
        return tree
    return _round_cotangent(tree, np.dtype(dtype))


def _round_cotangent(tree: dict, dtype: np.dtype) -> dict:
    @jax.custom_vjp
    def ident(t: dict) -> dict:
        return t

    def fwd(t: dict) -> tuple[dict, None]:
        return t, None

    def bwd(_: None, g: dict) -> tuple[dict]:
        return (jax.tree.map(lambda a: a.astype(dtype).astype(a.dtype), g),)

    ident.defvjp(fwd, bwd)
    return ident(tree)
