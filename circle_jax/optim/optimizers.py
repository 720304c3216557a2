"""Optimizers as `optax.GradientTransformation`s, with TF/Keras/onert numerics where they differ,
and torch.optim's (`TORCH_OPTIMIZERS`, the ``torch`` numerics profile's family).

Every ``learning_rate`` is a float or an optax schedule ``step -> lr`` (``step`` counts real
updates made so far, starting at 0, as in Keras and optax).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from circle_jax.codes import CodeTable, normalize_name
from circle_jax.errors import ConfigError
from circle_jax.optim.sparse_adam import adam_tf_moments, keras_sparse_adam

ScalarOrSchedule = float | jax.Array | Callable[[jax.Array], jax.Array]

EPS_PLACEMENTS = ("tf", "optax", "onert_micro")


def _lr_at(learning_rate: ScalarOrSchedule, count: jax.Array) -> jax.Array:
    return jnp.asarray(learning_rate(count) if callable(learning_rate) else learning_rate)


# --------------------------------------------------------------------------- Adam (TF)


class AdamTFState(NamedTuple):
    """State of `adam_tf`.

    Attributes:
      count: int32 number of updates made so far (``t - 1`` in the Adam paper).
      mu: first moment ``m`` per parameter, in the parameter dtype.
      nu: second moment ``v`` per parameter, in the parameter dtype.
    """

    count: jax.Array
    mu: optax.Updates
    nu: optax.Updates


def adam_tf(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-7,
) -> optax.GradientTransformation:
    """Adam exactly as TF's ``ApplyAdam``, Keras and onert's train backend compute it.

    With ``t = count + 1``, in the parameter dtype and in this operation order::

        alpha = lr * sqrt(1 - b2**t) / (1 - b1**t)
        m += (g - m) * (1 - b1)
        v += (g*g - v) * (1 - b2)
        w -= alpha * m / (sqrt(v) + eps)

    The emitted update is ``-(alpha * m / (sqrt(v) + eps))``; ``optax.apply_updates`` then
    gives the same bits as ``w -= ...``. Differs from `optax.adam`, whose eps is effectively
    ``eps * sqrt(1 - b2**t)``. Constants such as ``1 - b1`` are computed in the parameter
    dtype, as TF's kernel does (Keras 3 rounds the float64 ``1 - b1`` instead: a few ulps).
    Keras's Adam on sparse gradients (embedding tables) is
    `circle_jax.optim.sparse_adam.keras_sparse_adam`.
    """

    def init_fn(params: optax.Params) -> AdamTFState:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return AdamTFState(count=jnp.zeros([], jnp.int32), mu=zeros, nu=zeros)

    def update_fn(updates, state: AdamTFState, params=None):
        del params
        u, t, m, v = adam_tf_moments(learning_rate, b1, b2, eps, updates, state.count,
                                     state.mu, state.nu)
        return u, AdamTFState(count=t, mu=m, nu=v)

    return optax.GradientTransformation(init_fn, update_fn)


class DecoupledWeightDecayState(NamedTuple):
    """State of `decoupled_weight_decay`.

    Attributes:
      count: int32 number of updates made so far (feeds a learning-rate schedule).
    """

    count: jax.Array


def decoupled_weight_decay(
    learning_rate: ScalarOrSchedule, weight_decay: float
) -> optax.GradientTransformation:
    """Add ``-(w * weight_decay * lr)`` to the updates (Keras AdamW's decoupled decay)."""

    def init_fn(params) -> DecoupledWeightDecayState:
        del params
        return DecoupledWeightDecayState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state: DecoupledWeightDecayState, params=None):
        if params is None:
            raise ValueError("decoupled_weight_decay needs params: call update(g, state, params)")
        lr = _lr_at(learning_rate, state.count)
        updates = jax.tree.map(
            lambda u, p: u - (p * jnp.asarray(weight_decay, p.dtype) * lr.astype(p.dtype)),
            updates,
            params,
        )
        return updates, DecoupledWeightDecayState(count=optax.safe_int32_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)


# --------------------------------------------------------------------------- public factories


def _check_placement(eps_placement: str) -> str:
    if eps_placement not in EPS_PLACEMENTS:
        raise ConfigError(
            f"unknown eps_placement {eps_placement!r}: use one of {', '.join(EPS_PLACEMENTS)}"
        )
    return eps_placement


def _check_sparse(sparse_rows: bool, placement: str) -> None:
    if sparse_rows and placement != "tf":
        raise ConfigError(f"Keras's sparse-gradient Adam takes eps_placement 'tf', not "
                          f"{placement!r}")


def sgd(
    learning_rate: ScalarOrSchedule, momentum: float = 0.0, nesterov: bool = False
) -> optax.GradientTransformation:
    """SGD ``w -= lr * g`` (onert's), with optional (Nesterov) momentum — `optax.sgd`.

    optax's momentum keeps ``m = g + momentum * m`` and steps ``-lr * m``; Keras keeps
    ``v = momentum * v - lr * g``: the same for a constant learning rate.
    """
    if nesterov and not momentum:
        raise ConfigError("nesterov=True needs a non-zero momentum")
    return optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov)


def adam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-7,
    eps_placement: str = "tf",
    sparse_rows: bool = False,
) -> optax.GradientTransformation:
    """Adam with a choice of where ``eps`` goes (``m_hat``, ``v_hat``: bias-corrected moments).

    - ``"tf"`` (TF, Keras, onert train backend): `adam_tf`, ``alpha * m / (sqrt(v) + eps)``.
    - ``"optax"``: `optax.adam`, ``m_hat / (sqrt(v_hat) + eps)``.
    - ``"onert_micro"``: ``m_hat / sqrt(v_hat + eps)``, i.e. ``optax.adam(eps=0, eps_root=eps)``.

    ``eps`` defaults to Keras'/onert's 1e-7 for every placement (optax's own default is 1e-8).
    ``sparse_rows`` (``"tf"`` only): Keras's Adam on sparse gradients,
    `circle_jax.optim.sparse_adam.keras_sparse_adam`.
    """
    placement = _check_placement(eps_placement)
    _check_sparse(sparse_rows, placement)
    if sparse_rows:
        return keras_sparse_adam(learning_rate, b1, b2, eps)
    if placement == "tf":
        return adam_tf(learning_rate, b1, b2, eps)
    if placement == "optax":
        return optax.adam(learning_rate, b1, b2, eps)
    return optax.adam(learning_rate, b1, b2, eps=0.0, eps_root=eps)


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-7,
    weight_decay: float = 0.004,
    eps_placement: str = "tf",
    mask: Any = None,
    sparse_rows: bool = False,
) -> optax.GradientTransformation:
    """Adam with decoupled weight decay ``w -= lr * weight_decay * w``; defaults as Keras AdamW.

    ``eps_placement`` as in `adam`; ``"optax"`` is exactly `optax.adamw`. ``mask`` (a pytree of
    bools or a function of params) selects the decayed leaves. Keras decays before the Adam
    step, here both are summed into one update: equal up to float rounding. ``sparse_rows`` as
    in `adam`.
    """
    placement = _check_placement(eps_placement)
    _check_sparse(sparse_rows, placement)
    if placement == "optax":
        return optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay, mask=mask)
    if placement == "onert_micro":
        return optax.adamw(
            learning_rate, b1, b2, eps=0.0, eps_root=eps, weight_decay=weight_decay, mask=mask
        )
    decay = decoupled_weight_decay(learning_rate, weight_decay)
    if mask is not None:
        decay = optax.masked(decay, mask)
    return optax.chain(adam(learning_rate, b1, b2, eps, sparse_rows=sparse_rows), decay)


def rmsprop(
    learning_rate: ScalarOrSchedule = 0.001,
    rho: float = 0.9,
    eps: float = 1e-7,
    momentum: float = 0.0,
    centered: bool = False,
) -> optax.GradientTransformation:
    """RMSprop with Keras' defaults and formula — `optax.rmsprop` configured to match.

    ``v = rho * v + (1 - rho) * g**2`` (from 0), ``w -= lr * g / sqrt(v + eps)``; centered
    subtracts the squared running mean of ``g`` inside the root; momentum as in `sgd`.
    """
    return optax.rmsprop(
        learning_rate,
        decay=rho,
        eps=eps,
        initial_scale=0.0,
        eps_in_sqrt=True,
        centered=centered,
        momentum=momentum or None,
    )


# --------------------------------------------------------------------------- torch.optim


def torch_sgd(learning_rate: ScalarOrSchedule, momentum: float = 0.0, dampening: float = 0.0,
              nesterov: bool = False, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """torch.optim.SGD: ``g += weight_decay * w``; with momentum ``buf = momentum * buf +
    (1 - dampening) * g`` (``buf = g`` at the first step), nesterov steps along ``g +
    momentum * buf``; ``w -= lr * buf``. optax's ``add_decayed_weights`` and ``trace``; the
    dampening is ``scale_by_schedule`` (1 at the first step, ``1 - dampening`` after)."""
    if nesterov and (not momentum or dampening):
        raise ConfigError("nesterov=True needs a non-zero momentum and zero dampening (torch's "
                          "rule)")
    parts = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    if momentum:
        if dampening:
            parts.append(optax.scale_by_schedule(
                lambda count: jnp.where(count == 0, 1.0, 1.0 - dampening)))
        parts.append(optax.trace(decay=momentum, nesterov=nesterov))
    return optax.chain(*parts, optax.scale_by_learning_rate(learning_rate))


def torch_adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
               eps: float = 1e-8, weight_decay: float = 0.0) -> optax.GradientTransformation:
    """torch.optim.Adam: ``w -= lr * m_hat / (sqrt(v_hat) + eps)`` (`optax.scale_by_adam`),
    eps 1e-8; ``weight_decay`` adds ``weight_decay * w`` to the gradient (L2, not decoupled)."""
    parts = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    return optax.chain(*parts, optax.scale_by_adam(b1, b2, eps),
                       optax.scale_by_learning_rate(learning_rate))


def torch_adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999,
                eps: float = 1e-8, weight_decay: float = 0.01) -> optax.GradientTransformation:
    """torch.optim.AdamW: ``w *= 1 - lr * weight_decay`` then torch's Adam step; defaults
    eps 1e-8, weight_decay 0.01 — `optax.adamw` (the two terms summed into one update: equal
    up to float rounding)."""
    return optax.adamw(learning_rate, b1, b2, eps, weight_decay=weight_decay)


def torch_rmsprop(learning_rate: ScalarOrSchedule, alpha: float = 0.99, eps: float = 1e-8,
                  weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False
                  ) -> optax.GradientTransformation:
    """torch.optim.RMSprop: ``v = alpha * v + (1 - alpha) * g**2`` (from 0), ``w -= lr * g /
    (sqrt(v) + eps)`` (eps OUTSIDE the root, unlike Keras's), centered subtracts the squared
    running mean of ``g`` under the root, momentum ``buf = momentum * buf + g / avg``;
    ``weight_decay`` is L2 on the gradient — `optax.rmsprop` configured to match."""
    parts = [optax.add_decayed_weights(weight_decay)] if weight_decay else []
    return optax.chain(*parts, optax.rmsprop(
        learning_rate, decay=alpha, eps=eps, initial_scale=0.0, eps_in_sqrt=False,
        centered=centered, momentum=momentum or None))


# --------------------------------------------------------------------------- schedules

SCHEDULES: dict[str, Callable[..., optax.Schedule]] = {
    "constant": optax.constant_schedule,
    "exponential": optax.exponential_decay,
    "cosine": optax.cosine_decay_schedule,
    "warmup_cosine": optax.warmup_cosine_decay_schedule,
    "linear": optax.linear_schedule,
    "polynomial": optax.polynomial_schedule,
    "piecewise": optax.piecewise_constant_schedule,
}


def schedule(name: str, **kwargs) -> optax.Schedule:
    """An optax learning-rate schedule by short name; ``kwargs`` go to the optax function.

    Names: constant (value), exponential (init_value, transition_steps, decay_rate, ...),
    cosine (init_value, decay_steps, ...), warmup_cosine (init_value, peak_value,
    warmup_steps, decay_steps, ...), linear / polynomial (init_value, end_value, ...),
    piecewise (init_value, boundaries_and_scales).
    """
    key = normalize_name(name)
    if key not in SCHEDULES:
        raise ConfigError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}")
    try:
        return SCHEDULES[key](**kwargs)
    except TypeError as e:
        raise ConfigError(f"bad arguments for schedule {name!r}: {e}") from None


# --------------------------------------------------------------------------- registry

OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    "sgd": sgd,
    "momentum": lambda lr, momentum=0.9, nesterov=False: sgd(lr, momentum, nesterov),
    "nesterov": lambda lr, momentum=0.9: sgd(lr, momentum, nesterov=True),
    "adam": adam,
    "adam_optax": lambda lr, b1=0.9, b2=0.999, eps=1e-7: adam(lr, b1, b2, eps, "optax"),
    "adam_onert_micro": lambda lr, b1=0.9, b2=0.999, eps=1e-7: adam(lr, b1, b2, eps, "onert_micro"),
    "adamw": adamw,
    "rmsprop": rmsprop,
}

#: torch.optim's numerics under the same names (the ``torch`` profile); ``adam_optax`` and
#: ``adam_onert_micro`` name one placement whatever the family.
TORCH_OPTIMIZERS: dict[str, Callable[..., optax.GradientTransformation]] = {
    **OPTIMIZERS,
    "sgd": torch_sgd,
    "momentum": lambda lr, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=0.0:
        torch_sgd(lr, momentum, dampening, nesterov, weight_decay),
    "nesterov": lambda lr, momentum=0.9, weight_decay=0.0:
        torch_sgd(lr, momentum, nesterov=True, weight_decay=weight_decay),
    "adam": torch_adam,
    "adamw": torch_adamw,
    "rmsprop": torch_rmsprop,
}
FAMILIES = {"keras": OPTIMIZERS, "torch": TORCH_OPTIMIZERS}

#: The optimizer hyper-parameters the command line takes for every profile: flag -> keyword.
HYPERPARAMETERS = {"beta1": "b1", "beta2": "b2", "epsilon": "eps",
                   "weight_decay": "weight_decay", "momentum": "momentum"}
#: the command-line flag of each factory keyword of `HYPERPARAMETERS`
_FLAG_OF = {k: f for f, k in HYPERPARAMETERS.items()}

# onert_train's --optimizer codes. (circle+'s Optimizer enum differs: SGD=0, ADAM=1; map it
# to a name before calling `get_optimizer`.)
OPTIMIZER_TABLE = CodeTable("optimizer", names=tuple(OPTIMIZERS), codes={1: "sgd", 2: "adam"})
ONERT_OPTIMIZER_CODES: dict[int, str] = dict(OPTIMIZER_TABLE.codes)


def optimizer_name(spec: str | int) -> str:
    """Canonical name (a key of `OPTIMIZERS`) of a name or onert_train code (1=sgd, 2=adam)."""
    return OPTIMIZER_TABLE.resolve(spec)


def _factory(spec: str | int, family: str) -> tuple[str, Callable[..., Any]]:
    if family not in FAMILIES:
        raise ConfigError(f"unknown optimizer family {family!r}: use one of {', '.join(FAMILIES)}")
    name = optimizer_name(spec)
    return name, FAMILIES[family][name]


def hyperparameters(spec: str | int, family: str = "keras", **kwargs: Any) -> dict[str, Any]:
    """The `HYPERPARAMETERS` the optimizer takes (by flag name), with their values: ``kwargs``
    (factory keywords: ``b1``, ``eps``, ...) where given, else the factory's defaults. A
    keyword the factory does not take raises ValueError naming the flags it takes."""
    name, factory = _factory(spec, family)
    _check_keywords(name, family, factory, kwargs)
    sig = inspect.signature(factory).parameters
    return {flag: kwargs.get(k, sig[k].default) for flag, k in HYPERPARAMETERS.items()
            if k in sig}


def _check_keywords(name: str, family: str, factory: Callable[..., Any],
                    kwargs: Mapping[str, Any]) -> None:
    """Refuse, in one line, keywords optimizer ``name``'s factory does not take: each named
    by its flag (``--beta1``, not ``b1``) with the optimizers of ``family`` that take it,
    then the flags this one takes."""
    sig = inspect.signature(factory).parameters
    unknown = sorted(set(kwargs) - set(sig))
    if not unknown:
        return
    named = []
    for k in unknown:
        users = [n for n, f in FAMILIES[family].items() if k in inspect.signature(f).parameters]
        named.append((f"--{_FLAG_OF[k]}" if k in _FLAG_OF else repr(k))
                     + (f" (only {', '.join(users)} take it)" if users else ""))
    takes = [f"--{f}" for f, k in HYPERPARAMETERS.items() if k in sig]
    raise ConfigError(f"optimizer {name!r} ({family} numerics) does not take "
                      f"{', '.join(named)}; it takes "
                      f"{', '.join(takes) or 'none of the hyper-parameter flags'}")


def get_optimizer(
    spec: str | int, learning_rate: ScalarOrSchedule, family: str = "keras", **kwargs
) -> optax.GradientTransformation:
    """An optimizer by name or onert_train code; ``kwargs`` go to its factory.

    Names: sgd, momentum (sgd, momentum 0.9), nesterov, adam (TF eps placement), adam_optax,
    adam_onert_micro, adamw, rmsprop. Codes: 1 = sgd, 2 = adam (TF placement, as onert).
    ``family`` "torch" takes torch.optim's numerics and defaults (`TORCH_OPTIMIZERS`).
    """
    name, factory = _factory(spec, family)
    _check_keywords(name, family, factory, kwargs)
    try:
        inspect.signature(factory).bind(learning_rate, **kwargs)
        for key, value in {"learning_rate": learning_rate, **kwargs}.items():
            _check_range(key, value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bad options for optimizer {name!r}: {e}") from None
    return factory(learning_rate, **kwargs)


#: options whose numbers have a narrower range than "finite and >= 0", with the reason:
#: a decay rate of 1 stops its average's update (Adam's betas divide by zero in the bias
#: correction; RMSprop's average stays 0); a momentum or dampening above 1 grows without
#: bound; an epsilon of 0 divides 0 by 0 for a weight whose gradients are all 0 so far
_RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    **dict.fromkeys(("b1", "b2", "rho", "alpha"), ("in [0, 1)", lambda v: 0 <= v < 1)),
    **dict.fromkeys(("momentum", "dampening"), ("in [0, 1]", lambda v: 0 <= v <= 1)),
    "eps": ("a finite number > 0", lambda v: 0 < v < math.inf),
}


def _check_range(key: str, value: Any) -> None:
    """ValueError unless the number ``value`` of option ``key`` is finite and >= 0, and
    within its `_RANGES` entry; schedules, arrays and other values pass."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return
    flag = _FLAG_OF.get(key, key)
    named = key if flag == key else f"{key} (--{flag})"
    what, ok = _RANGES.get(key, ("a finite number >= 0", lambda v: 0 <= v < math.inf))
    if not ok(value):
        raise ConfigError(f"{named} must be {what}, got {value}")
