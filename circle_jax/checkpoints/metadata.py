"""circle+ training metadata (``CIRCLE_TRAINING``) from a trainer's configuration.
"""

from __future__ import annotations

from ..formats.traininfo import METADATA_NAME, TrainInfo, encode_traininfo
from ..train import Trainer
from ..train.config import asks_none


def traininfo_of(trainer: Trainer) -> TrainInfo:
    """The circle+ :class:`~circle_jax.formats.traininfo.TrainInfo` of a trainer's configuration.

    circle+ (and onert) express SGD or TF-style Adam with a constant learning rate, and
    trainable operators as "the last N": anything else raises ``ValueError``.
    """
    from ..formats.traininfo import LOSSES
    from ..losses import get_reduction, loss_name
    from ..optim import optimizer_name

    cfg = trainer.config
    opt = optimizer_name(cfg.optimizer)
    kw = dict(cfg.optimizer_kwargs)
    adam_args = {"b1": "beta_1", "b2": "beta_2", "eps": "epsilon"}
    allowed = set(adam_args) if opt == "adam" else set()
    extra = sorted(set(kw) - allowed)
    if opt == "adam" and kw.get("eps_placement", "tf") == "tf":
        extra = [k for k in extra if k != "eps_placement"]
    if opt not in ("sgd", "adam") or extra:
        what = f"{opt!r}" + (f" with {extra}" if extra else "")
        raise ValueError(f"circle+ stores only plain sgd or adam (onert's); optimizer {what} "
                         "cannot be written")
    if callable(cfg.learning_rate):
        raise ValueError("circle+ stores a constant learning rate, not a schedule")
    loss = loss_name(cfg.loss)
    if loss not in LOSSES:
        raise ValueError(f"circle+ cannot store the loss {loss!r}; it knows {', '.join(LOSSES)}")
    return TrainInfo(
        optimizer=opt, learning_rate=float(cfg.learning_rate),
        **{adam_args[k]: float(v) for k, v in kw.items() if k in adam_args},
        loss=loss, from_logits=bool(cfg.from_logits),
        reduction=get_reduction(cfg.reduction).value, epochs=int(cfg.epochs),
        batch_size=int(cfg.batch_size), trainable_ops=_trainable_tail(trainer),
    )


def _trainable_tail(trainer: Trainer) -> tuple[int, ...]:
    """The trainer's trainable ops as the last N operators (onert accepts nothing else)."""
    n = len(trainer.model.operators)
    spec = trainer.config.trainable
    if spec is None or spec == "all" or (isinstance(spec, int) and spec < 0):
        return tuple(range(n))
    if asks_none(spec):
        return ()
    if isinstance(spec, int) and not isinstance(spec, bool):
        return tuple(range(n - min(spec, n), n))
    readers = trainer.model.param_operators()
    want = set(trainer.trainable)
    for count in range(n + 1):
        first = n - count
        got = {name for name, ops in readers.items() if any(i >= first for i in ops)}
        if got == want:
            return tuple(range(first, n))
    adapters = sorted(trainer.model.adapters.values()) if trainer.model.adapters else []
    what = (f"LoRA adapters (of {len(set(adapters))} weights, e.g. {adapters[0]!r})" if adapters
            else f"{len(want)} trainable weights (e.g. {sorted(want)[0]!r})")
    raise ValueError(f"{what} are not the weights of the last N operators, the only trainable "
                     "set circle+ (onert) can store; export without circle+ training metadata")


def circleplus_metadata(trainer: Trainer) -> dict[str, bytes]:
    """``{"CIRCLE_TRAINING": bytes}`` for ``Model.export(metadata=...)``; see `traininfo_of`."""
    return {METADATA_NAME: encode_traininfo(traininfo_of(trainer))}
