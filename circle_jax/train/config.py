"""What a training run is: `TrainConfig` (resolved once against the model's circle+ values
and the defaults) and `select_trainable` (which params a trainable spec names)."""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import optax

from ..errors import ConfigError
from ..losses import LossFn, Reduction, get_loss, get_reduction, loss_name
from ..model import Model
from ..optim import accumulate, get_optimizer
from ..optim.loss_scale import DynamicLossScale, loss_scale_from_spec
from ..passes import lora_frozen


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; fields left ``None`` take the model's circle+
    values (epochs included), then built-in defaults (5 epochs, batch 32, lr 0.001, mse, sgd).

    ``loss``/``optimizer``/``reduction`` accept names or onert_train's numeric codes.
    ``trainable``: "all", "none", an int N (the last N operators in Circle order, onert's
    ``num_of_trainable_ops``: -1 = all, 0 = none) or an iterable of param names.
    ``accumulate``: k micro-batches per update; ``accumulate_mode`` "stream" (each step is
    one micro-batch of ``batch_size``, the update on every k-th step, counted across
    epochs: a fresh run of fewer than k steps is refused, `loop.check_updates`) or
    "in_step" (each
    step's batch of ``batch_size`` is split into k micro-batches inside the step).
    ``numerics``: a profile name or `circle_jax.numerics.Numerics` for the loss and optimizer
    choices (default: the profile the model was loaded with); explicit ``clip``,
    ``from_logits`` and ``optimizer_kwargs["eps_placement"]`` override it.
    ``loss_output``: the model output the loss is computed on, by index, tensor name or
    signature output name (a multi-output model, e.g. logits beside a KV cache).
    ``ignore_index``: with ``sparse_categorical_crossentropy``, the label of positions
    that do not count (a sequence's padding): the loss is the mean over the other tokens
    (`circle_jax.losses.reduce_positions`), and accuracy leaves them out.
    ``shuffle``: epoch e takes the samples in the order ``jax.random.permutation(
    fold_in(key(seed), e), n)``, drawn on the device inside the compiled epoch.
    ``trainable`` "all" / N selects among the params the model's trainable policy trains
    (`circle_jax.graph.params_policy`); names and aliases select exactly those params. On a
    personalized model (`Model.personalize`) the new head and adapters train by default
    and any spec but "none" / 0 adds to them; the weights LoRA adapts never train.
    """

    epochs: int | None = None
    batch_size: int | None = None
    learning_rate: float | None = None
    loss: str | int | None = None
    reduction: str | int | None = None
    from_logits: bool | None = None
    clip: str | tuple[float, float] | None = None
    optimizer: str | int | None = None
    optimizer_kwargs: Mapping[str, Any] = field(default_factory=dict)
    trainable: Any = None
    validation_split: float = 0.0
    shuffle: bool = False
    seed: int = 0
    drop_remainder: bool = True
    accumulate: int = 1
    accumulate_mode: str = "stream"
    precision: Any = None
    loss_scale: Any = "none"
    on_overflow: str = "skip"
    numerics: Any = None
    loss_output: int | str = 0
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        """ConfigError (one line naming the field) for a count, rate, seed or switch that
        cannot train: checked when the configuration is made, before anything compiles."""
        for name, low, high in (("epochs", 0, None), ("batch_size", 1, None),
                                ("accumulate", 1, None), ("seed", -(1 << 63), (1 << 63) - 1)):
            check_integer(f"TrainConfig.{name}", getattr(self, name), low, high)
        lr = self.learning_rate
        if lr is not None and not callable(lr) and (
                isinstance(lr, bool) or not isinstance(lr, numbers.Real)):
            raise ConfigError(f"TrainConfig.learning_rate must be a number or an optax "
                              f"schedule, got {lr!r}")
        for name in ("shuffle", "drop_remainder"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ConfigError(f"TrainConfig.{name} must be a bool, got "
                                  f"{getattr(self, name)!r}")
        check_trainable(self.trainable)
        self._check_combinations()

    def _check_combinations(self) -> None:
        """ConfigError (one line) for fields that do not go together, named as the
        library's keywords and the command line's flags: in-step micro-batches that do not
        split the batch (or an unknown accumulate_mode), a loss scale that is not one, a
        retry without a dynamic scale."""
        k, b = self.accumulate, self.batch_size
        if self.accumulate_mode not in ("stream", "in_step"):
            raise ConfigError(f"accumulate_mode must be 'stream' or 'in_step', got "
                              f"{self.accumulate_mode!r}")
        if self.accumulate_mode == "in_step" and b is not None and b % k:
            raise ConfigError(f"batch size {b} is not divisible into {k} equal micro-batches "
                              f"(accumulate_mode 'in_step'); use a multiple of {k}")
        scale = loss_scale_from_spec(self.loss_scale)  # refuses what is no loss scale
        if self.on_overflow == "retry" and not isinstance(scale, DynamicLossScale):
            raise ConfigError(f"on_overflow 'retry' backs a dynamic loss scale off and retries "
                              f"the step; loss_scale {self.loss_scale!r} is not one: use "
                              "loss_scale='dynamic' (--loss_scale dynamic)")

    def with_defaults(self, model: Model) -> TrainConfig:
        """Fill unset fields from the model's circle+ metadata, then from built-in defaults."""
        from ..formats.traininfo import decode_traininfo

        info = None
        if "CIRCLE_TRAINING" in model.ir.metadata:
            info = decode_traininfo(model.ir.metadata["CIRCLE_TRAINING"])
        n_ops = len(model.operators)
        defaults: dict[str, Any] = {"epochs": 5, "batch_size": 32, "learning_rate": 0.001,
                                    "loss": "mse", "reduction": "sum_over_batch_size",
                                    "from_logits": False, "optimizer": "sgd", "trainable": "all"}
        if info is not None:
            ops = tuple(info.trainable_ops)
            if info.epochs < 0:
                raise ConfigError(f"the model's circle+ metadata says {info.epochs} epochs; "
                                  "expected >= 0 (0: not set); give --epoch / epochs=")
            if info.epochs > 0:
                defaults["epochs"] = info.epochs
            defaults.update(
                batch_size=info.batch_size, learning_rate=info.learning_rate, loss=info.loss,
                reduction=info.reduction, from_logits=info.from_logits,
                optimizer=info.optimizer,
                trainable=_tail_count(ops, n_ops) if _is_tail(ops, n_ops) else ops,
            )
        if model.personal_params:  # a new head / adapters: they alone train by default
            defaults["trainable"] = tuple(sorted(model.personal_params))
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


#: other frameworks' (and onert_train's) names of TrainConfig fields, for suggestions
_ALIASES = {"lr": "learning_rate", "num_of_trainable_ops": "trainable",
            "loss_reduction_type": "reduction", "keep_remainder": "drop_remainder",
            "loss_fn": "loss", "optim": "optimizer"}


def check_overrides(overrides: Mapping[str, Any], also: Sequence[str] = ()) -> None:
    """ConfigError (one line) for a keyword that is not a TrainConfig field (nor one of
    ``also``, the caller's own keywords), naming the closest valid one (difflib, or the
    field another framework's name means: ``lr`` is ``learning_rate``)."""
    valid = sorted({f.name for f in fields(TrainConfig)} | set(also))
    for name in overrides:
        if name in valid:
            continue
        close = [_ALIASES[name]] if name in _ALIASES else \
            difflib.get_close_matches(name, valid, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "expected a TrainConfig field"
        raise ConfigError(f"unknown training keyword {name!r}: {hint} (see TrainConfig)")


def check_integer(what: str, value: Any, low: int, high: int | None = None) -> None:
    """ConfigError naming ``what`` unless ``value`` (None: not given) is an integer (not a
    bool) of at least ``low`` (and at most ``high``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{what} must be an integer {bound}, got {value!r}")


def _is_tail(ops: Sequence[int], n: int) -> bool:
    return tuple(sorted(ops)) == tuple(range(n - len(ops), n))


def _tail_count(ops: Sequence[int], n: int) -> int:
    return -1 if len(ops) == n else len(ops)


def check_trainable(spec: Any, n_ops: int | None = None) -> None:
    """ConfigError (one line) unless ``spec`` is a trainable spec: None, "all", "none", an
    integer from -1 (all; onert's num_of_trainable_ops) to ``n_ops`` (the model's
    operators, when given), or a name, or an iterable of param names, aliases or operator
    indices. Bools, floats and other integers are refused: they name no operators."""
    expected = ("expected 'all', 'none', N (the last N operators; -1 all) or param names")
    if isinstance(spec, (str, type(None))):
        return
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        if spec < -1 or (n_ops is not None and spec > n_ops):
            bound = "" if n_ops is None else f" (the model has {n_ops} operators)"
            raise ConfigError(f"trainable={spec} names no last N operators{bound}; {expected}")
        return
    items = list(spec) if isinstance(spec, (Sequence, set, frozenset, np.ndarray)) else None
    if items is None or any(isinstance(s, bool) or not isinstance(s, (str, numbers.Integral))
                            for s in items):
        raise ConfigError(f"trainable={spec!r} ({type(spec).__name__}) is not a trainable "
                          f"spec; {expected}")


def select_trainable(model: Model, spec: Any) -> frozenset[str]:
    """The names of trainable params for a trainable spec (see ``TrainConfig.trainable``,
    checked by `check_trainable`; names may be aliases such as ``op3.bias``, see
    `circle_jax.graph.aliases`)."""
    check_trainable(spec, len(model.operators))
    if asks_none(spec):
        return frozenset()
    return (_selected(model, spec) | model.personal_params) - lora_frozen(model.ir)


def asks_none(spec: Any) -> bool:
    """Whether a trainable spec asks for no trainable param: "none", or 0 (onert_train's
    ``--num_of_trainable_ops 0``)."""
    return (isinstance(spec, str) and spec == "none") or (
        isinstance(spec, numbers.Integral) and not isinstance(spec, bool) and spec == 0)


def _selected(model: Model, spec: Any) -> frozenset[str]:
    names = set(model.trainable_params)
    if spec is None or spec == "all" or (isinstance(spec, numbers.Integral) and spec < 0):
        return frozenset(names)
    if isinstance(spec, numbers.Integral):
        first = len(model.operators) - int(spec)
        readers = model.param_operators()
        return frozenset(n for n, ops in readers.items()
                         if n in names and any(i >= first for i in ops))
    if isinstance(spec, str):
        spec = [spec]
    chosen = set(spec)
    if all(isinstance(s, (int, np.integer)) for s in chosen):  # operator indices (circle+)
        readers = model.param_operators()
        return frozenset(n for n, ops in readers.items()
                         if n in names and chosen.intersection(ops))
    return model.resolve_params(chosen)  # names or aliases (op3.bias)


def output_index(model: Model, spec: int | str) -> int:
    """The index of model output ``spec``: an index, a tensor name, or an output name of the
    signature of the main subgraph."""
    names = [o.name for o in model.outputs]
    if isinstance(spec, str) and spec in names:
        return names.index(spec)
    main = model.ir.main
    for sig in model.ir.signature_defs:
        if sig.subgraph_index == 0 and spec in sig.outputs:
            return list(main.outputs).index(sig.outputs[spec])
    if isinstance(spec, str) and spec.lstrip("-").isdigit():
        spec = int(spec)
    if isinstance(spec, int) and not isinstance(spec, bool) and 0 <= spec < len(names):
        return spec
    raise ConfigError(f"no model output {spec!r}: the outputs are "
                      + ", ".join(f"{k} {n!r}" for k, n in enumerate(names)))


def check_loss_output(model: Model, config: TrainConfig, output: int) -> None:
    """ConfigError (one line) for a crossentropy model output ``output`` cannot take: fewer
    than 2 classes on its last axis (one unit: the loss is 0 and nothing trains), or
    ``from_logits=True`` where a SOFTMAX produces it (probabilities already: the loss would
    take a second softmax; left unset, the numerics profile may read the SOFTMAX's input
    logits itself, `circle_jax.train.numerics`)."""
    from .numerics import softmax_input

    name = loss_name(config.loss)
    if name == "mean_squared_error":
        return
    spec = model.outputs[output]
    if spec.shape and 0 <= spec.shape[-1] < 2:
        raise ConfigError(f"loss {name} needs at least 2 classes on the last axis of output "
                          f"{spec.name!r}, which has shape {list(spec.shape)}; expected a "
                          "classifier's output (or loss='mse' for one unit)")
    if config.from_logits and softmax_input(model, output) is not None:
        raise ConfigError(f"from_logits=True, but output {spec.name!r} is a SOFTMAX's: "
                          "probabilities already; expected from_logits=False (or unset)")


def training_reduction(spec: str | int | Reduction) -> Reduction:
    """The reduction a training step's loss takes: "sum_over_batch_size" or "sum". "none"
    (per-sample losses, for code that weights them itself, `circle_jax.losses`) leaves no
    scalar to differentiate and is refused in one line."""
    reduction = get_reduction(spec)
    if reduction is Reduction.NONE:
        raise ConfigError("reduction 'none' gives per-sample losses, not the scalar a training "
                          "step differentiates; expected 'sum_over_batch_size' or 'sum'")
    return reduction


def loss_function(config: TrainConfig, reduction: Reduction, from_logits: bool, clip: Any
                  ) -> LossFn:
    """The configuration's loss with ``reduction``; a crossentropy also reads the output as
    ``from_logits`` says and clips as ``clip`` says (the numerics profile's choices);
    ``ignore_index`` applies to sparse CCE alone."""
    name = loss_name(config.loss)
    kwargs: dict[str, Any] = {"reduction": reduction}
    if name != "mean_squared_error":
        kwargs.update(from_logits=from_logits, clip=clip)
    if config.ignore_index is not None:
        if name != "sparse_categorical_crossentropy":
            raise ConfigError(f"ignore_index applies to sparse_categorical_crossentropy "
                              f"(integer labels); the loss is {name}")
        kwargs["ignore_index"] = int(config.ignore_index)
    return get_loss(config.loss, **kwargs)


def optimizer(config: TrainConfig, numerics: Any, reduction: Reduction,
              sparse_rows: bool = False) -> optax.GradientTransformation:
    """The configuration's optimizer in the numerics profile's family and options
    (`circle_jax.train.numerics`): scaled by the batch size where the profile sums the
    batch's gradients under a mean loss, and accumulating ``accumulate`` steps' gradients
    per update in "stream" mode. ``sparse_rows``: Keras's sparse-gradient Adam
    (`circle_jax.optim.keras_sparse_adam`), for embedding tables that train."""
    tx = get_optimizer(config.optimizer, config.learning_rate, numerics.optimizers,
                       **numerics.optimizer_kwargs, **({"sparse_rows": True} if sparse_rows
                                                       else {}))
    if numerics.sum_gradients and reduction is Reduction.SUM_OVER_BATCH_SIZE:
        tx = optax.chain(optax.scale(float(config.batch_size)), tx)
    if config.accumulate_mode == "stream" and config.accumulate > 1:
        tx = accumulate(tx, config.accumulate, "sum" if reduction.value == "sum" else "mean")
    return tx
