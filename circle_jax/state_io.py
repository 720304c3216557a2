"""Training state in and out of files: onert checkpoints, ``.wof`` weights and circle+ metadata.

The JAX-aware bridge between :class:`~circle_jax.model.Model` / :class:`~circle_jax.train.Trainer`
/ :class:`~circle_jax.train.TrainState` and the byte-level codecs of ``circle_jax.io`` (which
know nothing of JAX). Every file is written with :func:`~circle_jax.io.atomic.atomic_write`.

onert checkpoints
-----------------
A checkpoint holds one entry per *constant tensor of subgraph 0* (float weights, trainable or
frozen, and integer constants such as Reshape shapes), Adam ``m``/``v`` per entry (zero-size
for tensors without optimizer state), the number of weight updates (``cur_step``) and an
epoch counter.

*Writing*: circle-jax puts the entries in ascending tensor index (:func:`constant_tensors`).
``cur_step`` is the number of optimizer updates (Adam's ``t``), ``cur_epoch`` the number of
completed epochs (onert always writes 0 there and ignores it on import).

*Reading* (:func:`checkpoint_order`): onert writes the entries in its internal hash-map order,
so each entry is matched to a tensor by content:

1. an entry's candidates are the constant tensors with the same byte size (the count of
   entries of each size must equal the count of tensors of that size, or the file is
   refused);
2. within a group of same-size candidates, dtype decides where it can: an entry with Adam
   state belongs to a float tensor, and an integer tensor matches only its own exact bytes;
3. the rest is decided by distance to the model's current weights (mean absolute
   difference; a checkpoint taken after some training is closest to the weights it started
   from), assigning the closest (entry, tensor) pair first (greedy);
4. exact ties go to ascending order: the right answer for circle-jax's own files. Tensors
   whose reference bytes are *identical* (e.g. two zero-initialised biases of one size)
   cannot be told apart by content; in an onert checkpoint they may come out swapped.

Resuming from a checkpoint restores weights, Adam ``m``/``v`` and the update count (and the
count of every other ``count``-carrying optax state, e.g. learning-rate schedules), so the
continued run is bit-identical to an uninterrupted one. Not stored (onert's format has no
place for them): loss-scale state (reset from the config), a partial gradient accumulation
(saving mid-cycle is refused) and optimizer state other than Adam's moments (momentum,
RMSprop: refused). Weights and moments are stored in the tensor's dtype, so a half-precision
model resumes from rounded float32 masters.

.wof
----
onert-micro's weight-only file: buffer ``k`` belongs to tensor ``k`` of subgraph 0; circle-jax
fills the buffers of the trainable float weights and leaves the others empty.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from . import ir
from .errors import CircleFormatError, DataError, TrainingError
from .io.atomic import PathLike, atomic_write
from .io.checkpoint import Checkpoint, as_array, decode_checkpoint, encode_checkpoint
from .io.traininfo import METADATA_NAME, TrainInfo, encode_traininfo
from .io.wof import decode_wof, encode_wof
from .model import Model
from .optim import AccumulateState, AdamTFState
from .train import (
    FitResult,
    History,
    StepMetrics,
    TrainConfig,
    Trainer,
    TrainState,
    _as_inputs,
    _batched,
    split_validation,
)

Source = PathLike | bytes | bytearray | memoryview
"""A file path or the file's bytes."""

_MOMENTS = (AdamTFState, optax.ScaleByAdamState)  # states whose mu/nu are Adam's m and v


# --------------------------------------------------------------------------- helpers


def _read(source: Source, what: str) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), f"<{what} bytes>"
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            return f.read(), path
    except OSError as e:
        raise DataError(f"cannot read {what} file {path!r}: {e.strerror}") from None


def _nbytes(t: ir.Tensor) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * ir.as_numpy_dtype(t.dtype).itemsize


def _describe(t: ir.Tensor) -> str:
    return f"tensor {t.index} {t.name!r} {t.dtype}{list(t.shape)}"


def _main_params(model: Model) -> dict[int, str]:
    """Tensor index -> param name for the params of subgraph 0."""
    return {i: name for name, (k, i) in model.param_keys.items() if k == 0}


def _stream_k(trainer: Trainer) -> int:
    cfg = trainer.config
    return cfg.accumulate if cfg.accumulate_mode == "stream" else 1


def constant_tensors(model: Model) -> tuple[int, ...]:
    """Indices of the constant tensors of subgraph 0, ascending: a checkpoint's entry order."""
    return tuple(t.index for t in model.ir.main.tensors if t.is_constant)


# --------------------------------------------------------------------------- checkpoints


def _moment_nodes(opt_state: Any) -> list[Any]:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, _MOMENTS))
    return [n for n in nodes if isinstance(n, _MOMENTS)]


def _accumulate_nodes(opt_state: Any) -> list[AccumulateState]:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, AccumulateState))
    return [n for n in nodes if isinstance(n, AccumulateState)]


def _unstorable(opt_state: Any) -> list[str]:
    """Array leaves of shape > () outside Adam's moments and accumulators (e.g. momentum)."""
    def strip(n: Any) -> Any:
        if isinstance(n, _MOMENTS):
            return None
        if isinstance(n, AccumulateState):
            return n._replace(acc_grads=None)
        return n

    kinds = (*_MOMENTS, AccumulateState)
    rest = jax.tree.map(strip, opt_state, is_leaf=lambda n: isinstance(n, kinds))
    rest = jax.tree.map(strip, rest, is_leaf=lambda n: isinstance(n, kinds))
    return [jax.tree_util.keystr(p) for p, leaf in jax.tree_util.tree_leaves_with_path(rest)
            if np.ndim(leaf) > 0]


def _updates(trainer: Trainer, state: TrainState) -> int:
    """The number of optimizer updates ``state`` has seen (onert's ``cur_step``)."""
    moments = _moment_nodes(state.opt_state)
    if moments:
        return int(moments[0].count)
    acc = _accumulate_nodes(state.opt_state)
    if acc:
        return int(acc[0].gradient_step)
    return int(state.step) // _stream_k(trainer)


def make_checkpoint(model: Model, trainer: Trainer, state: TrainState,
                    frozen: Mapping[str, Any] | None = None, epoch: int = 0) -> Checkpoint:
    """The :class:`~circle_jax.io.checkpoint.Checkpoint` of a training state.

    Entries follow :func:`constant_tensors` (ascending tensor index): trained weights from
    ``state``, frozen ones from ``frozen`` (default: the model's), other constants as stored.
    ``epoch`` is written as ``cur_epoch`` (completed epochs).
    """
    bad = _unstorable(state.opt_state)
    if bad:
        raise TrainingError(
            f"the optimizer state has {', '.join(bad)}, which an onert checkpoint cannot "
            "hold (it stores SGD or Adam); use --optimizer sgd or adam")
    acc = _accumulate_nodes(state.opt_state)
    if acc and int(acc[0].mini_step):
        raise TrainingError(
            f"cannot checkpoint in the middle of a gradient accumulation cycle "
            f"({int(acc[0].mini_step)} micro-batches accumulated); save after a real update")
    moments = _moment_nodes(state.opt_state)
    if len(moments) > 1:
        raise TrainingError(f"the optimizer state holds {len(moments)} Adam states; an onert "
                            "checkpoint holds one")
    frozen = model.params if frozen is None else frozen
    names = _main_params(model)
    sg = model.ir.main
    tensors, ms, vs = [], [], []
    for i in constant_tensors(model):
        t = sg.tensors[i]
        dt = ir.as_numpy_dtype(t.dtype)
        name = names.get(i)
        if name is not None and name in state.params:
            value = state.params[name]
        elif name is not None and name in frozen:
            value = frozen[name]
        else:
            value = t.data
        tensors.append(np.asarray(value).astype(dt))
        if moments and name is not None and name in state.params:
            ms.append(np.asarray(moments[0].mu[name]).astype(dt))
            vs.append(np.asarray(moments[0].nu[name]).astype(dt))
        else:
            ms.append(b"")
            vs.append(b"")
    return Checkpoint(tensors, ms if moments else None, vs if moments else None,
                      step=_updates(trainer, state), epoch=epoch)


def save_checkpoint(path: PathLike, model: Model, trainer: Trainer, state: TrainState,
                    frozen: Mapping[str, Any] | None = None, *, epoch: int = 0,
                    protect: PathLike | Iterable[PathLike] | None = None) -> None:
    """Write ``state`` as an onert checkpoint (atomically); onert_train imports it.

    Entry order, step and epoch as in :func:`make_checkpoint`. ``protect`` names input files
    that must never be overwritten.
    """
    data = encode_checkpoint(make_checkpoint(model, trainer, state, frozen, epoch))
    atomic_write(path, data, protect=protect)


def read_checkpoint(source: Source, model: Model) -> Checkpoint:
    """Decode a checkpoint file (path or bytes) and check its entry count against ``model``."""
    buf, where = _read(source, "checkpoint")
    try:
        ckpt = decode_checkpoint(buf)
    except CircleFormatError as e:
        raise CircleFormatError(f"{where}: {e}") from None
    n = len(constant_tensors(model))
    if len(ckpt.tensors) != n:
        raise CircleFormatError(
            f"{where}: checkpoint has {len(ckpt.tensors)} tensors, expected {n} (one per "
            "constant tensor of the model's subgraph 0): it belongs to another model")
    return ckpt


def checkpoint_order(model: Model, ckpt: Checkpoint,
                     params: Mapping[str, Any] | None = None) -> tuple[int, ...]:
    """The tensor index of each checkpoint entry, resolved by size and content.

    ``params`` are the reference weights (default: the model's own). The rule is in the module
    docstring: same byte size, then dtype, then the closest reference weights, greedy, ties
    in ascending order. Raises :class:`CircleFormatError` when the sizes do not fit the model.
    """
    sg = model.ir.main
    consts = constant_tensors(model)
    if len(ckpt.tensors) != len(consts):
        raise CircleFormatError(
            f"checkpoint has {len(ckpt.tensors)} tensors, expected {len(consts)} (one per "
            "constant tensor of the model's subgraph 0)")
    params = model.params if params is None else params
    names = _main_params(model)
    by_size: dict[int, list[int]] = {}
    for i in consts:
        by_size.setdefault(_nbytes(sg.tensors[i]), []).append(i)
    entries: dict[int, list[int]] = {}
    for e, raw in enumerate(ckpt.tensors):
        entries.setdefault(int(raw.size), []).append(e)
    for size, es in entries.items():
        if len(by_size.get(size, [])) != len(es):
            sizes = sorted(_nbytes(sg.tensors[i]) for i in consts)
            raise CircleFormatError(
                f"checkpoint entry {es[0]} has {size} bytes, but the model has "
                f"{len(by_size.get(size, []))} constant tensor(s) of that size for "
                f"{len(es)} such entries; expected entry sizes {sizes} (another model?)")
    order = [-1] * len(consts)
    for size, es in entries.items():
        tensors = by_size[size]
        if len(es) == 1:
            order[es[0]] = tensors[0]
            continue
        pairs = []
        for e in es:
            stateful = ckpt.adam_m is not None and ckpt.adam_m[e].size > 0
            for i in tensors:
                t = sg.tensors[i]
                ref = params[names[i]] if i in names and names[i] in params else t.data
                pairs.append((_distance(ckpt.tensors[e], t, ref, stateful), e, i))
        pairs.sort()
        done_e: set[int] = set()
        done_t: set[int] = set()
        for _, e, i in pairs:
            if e not in done_e and i not in done_t:
                order[e] = i
                done_e.add(e)
                done_t.add(i)
    return tuple(order)


def _distance(raw: np.ndarray, t: ir.Tensor, ref: Any, stateful: bool) -> float:
    """How far an entry's bytes are from tensor ``t``'s reference value (inf: impossible)."""
    if not t.is_float:
        if stateful:
            return float("inf")
        return 0.0 if raw.tobytes() == np.ascontiguousarray(t.data).tobytes() else float("inf")
    value = as_array(raw, ir.as_numpy_dtype(t.dtype), t.shape).astype(np.float64)
    ref64 = np.asarray(ref).astype(np.float64)
    with np.errstate(all="ignore"):
        d = float(np.mean(np.abs(value - ref64))) if value.size else 0.0
    return d if np.isfinite(d) else float("inf")


def checkpoint_params(source: Source | Checkpoint, model: Model,
                      params: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
    """All params of ``model`` (model dtypes) with the weights found in a checkpoint.

    ``params`` are the reference weights for :func:`checkpoint_order` and the values of params
    the checkpoint does not cover (other subgraphs); default: the model's own.
    """
    ckpt = source if isinstance(source, Checkpoint) else read_checkpoint(source, model)
    params = dict(model.params if params is None else params)
    order = checkpoint_order(model, ckpt, params)
    names = _main_params(model)
    sg = model.ir.main
    for e, i in enumerate(order):
        if i in names:
            t = sg.tensors[i]
            params[names[i]] = jnp.asarray(as_array(ckpt.tensors[e], ir.as_numpy_dtype(t.dtype),
                                                    t.shape))
    return params


def restore_checkpoint(ckpt: Checkpoint, model: Model, trainer: Trainer,
                       params: Mapping[str, Any] | None = None) -> tuple[TrainState, dict]:
    """``(state, frozen)`` for ``trainer`` from a decoded checkpoint (see `load_checkpoint`)."""
    order = checkpoint_order(model, ckpt, params)
    merged = checkpoint_params(ckpt, model, params)
    state, frozen = trainer.init(merged)
    names = _main_params(model)
    sg = model.ir.main
    mu: dict[str, jax.Array] = {}
    nu: dict[str, jax.Array] = {}
    if ckpt.is_adam:
        for e, i in enumerate(order):
            name = names.get(i)
            if name in state.params and ckpt.adam_m[e].size:
                t = sg.tensors[i]
                dt = ir.as_numpy_dtype(t.dtype)
                master = state.params[name].dtype
                mu[name] = jnp.asarray(as_array(ckpt.adam_m[e], dt, t.shape), master)
                nu[name] = jnp.asarray(as_array(ckpt.adam_v[e], dt, t.shape), master)
    updates = ckpt.step if ckpt.is_adam or not _moment_nodes(state.opt_state) else 0

    def set_moments(n: Any) -> Any:
        if not isinstance(n, _MOMENTS):
            return n
        return n._replace(mu={k: mu.get(k, v) for k, v in n.mu.items()},
                          nu={k: nu.get(k, v) for k, v in n.nu.items()})

    def set_count(n: Any) -> Any:
        if isinstance(n, AccumulateState):
            return n._replace(gradient_step=jnp.asarray(updates, n.gradient_step.dtype))
        if _has_count(n):
            return n._replace(count=jnp.asarray(updates, n.count.dtype))
        return n

    opt = jax.tree.map(set_moments, state.opt_state, is_leaf=lambda n: isinstance(n, _MOMENTS))
    opt = jax.tree.map(set_count, opt, is_leaf=lambda n: isinstance(n, AccumulateState))
    opt = jax.tree.map(set_count, opt, is_leaf=_has_count)
    step = jnp.asarray(ckpt.step * _stream_k(trainer), state.step.dtype)
    return state._replace(opt_state=opt, step=step), frozen


def _has_count(n: Any) -> bool:
    return isinstance(n, tuple) and "count" in getattr(n, "_fields", ())


def load_checkpoint(source: Source, model: Model, trainer: Trainer,
                    params: Mapping[str, Any] | None = None) -> tuple[TrainState, dict]:
    """Resume from an onert checkpoint (circle-jax's or onert's): ``(state, frozen)``.

    Entries are matched to tensors by :func:`checkpoint_order`; the state gets the weights,
    Adam ``m``/``v`` (zeros for trainable tensors the checkpoint has no state for; dropped for
    an SGD trainer) and the update count. Pass the result to ``fit(..., state=state,
    params=trainer.merge(state, frozen))`` or use :func:`fit_checkpointed`.
    """
    return restore_checkpoint(read_checkpoint(source, model), model, trainer, params)


# --------------------------------------------------------------------------- .wof


def wof_bytes(model: Model, params: Mapping[str, Any] | None = None,
              trainable: Iterable[str] | None = None) -> bytes:
    """The ``.wof`` bytes of ``params`` (default: the model's) for the ``trainable`` names.

    Buffer ``k`` is tensor ``k`` of subgraph 0, filled for trainable float weights only
    (default: every param of subgraph 0), in the tensor's dtype.
    """
    params = model.params if params is None else params
    names = _main_params(model)
    chosen = set(names.values()) if trainable is None else set(trainable)
    unknown = sorted(chosen - set(model.params))
    if unknown:
        raise ValueError(f"unknown weight name(s) {unknown}; the model's params are "
                         f"{sorted(model.params)}")
    sg = model.ir.main
    buffers: list[np.ndarray | None] = [None] * len(sg.tensors)
    for i, name in names.items():
        if name in chosen:
            dt = ir.as_numpy_dtype(sg.tensors[i].dtype)
            buffers[i] = np.asarray(params[name]).astype(dt)
    return encode_wof(buffers)


def save_wof(path: PathLike, model: Model, params: Mapping[str, Any] | None = None,
             trainable: Iterable[str] | None = None, *,
             protect: PathLike | Iterable[PathLike] | None = None) -> None:
    """Write the trainable weights as a ``.wof`` file (atomically); see :func:`wof_bytes`."""
    atomic_write(path, wof_bytes(model, params, trainable), protect=protect)


def load_wof(source: Source, model: Model,
             params: Mapping[str, Any] | None = None) -> dict[str, jax.Array]:
    """``params`` (default: the model's) with the weights of a ``.wof`` file put in.

    The file must have one buffer per tensor of subgraph 0; each filled buffer must belong to
    a float weight and have exactly its size (dtype and shape come from the model). A filled
    buffer of another constant is accepted only when it repeats that constant's bytes.
    """
    buf, where = _read(source, "wof")
    sg = model.ir.main
    try:
        buffers = decode_wof(buf, num_tensors=len(sg.tensors))
    except CircleFormatError as e:
        raise CircleFormatError(f"{where}: {e}") from None
    names = _main_params(model)
    out = dict(model.params if params is None else params)
    for k, raw in enumerate(buffers):
        if raw is None:
            continue
        t = sg.tensors[k]
        if k not in names:
            if t.is_constant and raw.tobytes() == np.ascontiguousarray(t.data).tobytes():
                continue
            raise CircleFormatError(
                f"{where}: buffer {k} has {raw.size} bytes of data, but {_describe(t)} is not a "
                "float weight of the model: the file belongs to another model")
        if raw.size != _nbytes(t):
            raise CircleFormatError(
                f"{where}: buffer {k} has {raw.size} bytes, expected {_nbytes(t)} for "
                f"{_describe(t)}: the file belongs to another model")
        out[names[k]] = jnp.asarray(as_array(raw, ir.as_numpy_dtype(t.dtype), t.shape))
    return out


# --------------------------------------------------------------------------- circle+


def traininfo(trainer: Trainer) -> TrainInfo:
    """The circle+ :class:`~circle_jax.io.traininfo.TrainInfo` of a trainer's configuration.

    circle+ (and onert) express SGD or TF-style Adam with a constant learning rate, and
    trainable operators as "the last N": anything else raises ``ValueError``.
    """
    from .io.traininfo import LOSSES
    from .losses import get_reduction, loss_name
    from .optim import optimizer_name

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
    if spec == "none" or (isinstance(spec, int) and not isinstance(spec, bool) and spec == 0):
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
    raise ValueError(f"trainable weights {sorted(want)} are not those of the last N operators; "
                     "circle+ (onert) can only express that")


def circleplus_metadata(trainer: Trainer) -> dict[str, bytes]:
    """``{"CIRCLE_TRAINING": bytes}`` for ``Model.export(..., metadata=...)`` (see `traininfo`)."""
    return {METADATA_NAME: encode_traininfo(traininfo(trainer))}


# --------------------------------------------------------------------------- training driver


def fit_checkpointed(
    model: Model,
    x: Any,
    y: Any,
    config: TrainConfig | None = None,
    *,
    resume: Source | None = None,
    save: PathLike | None = None,
    every_steps: int | None = None,
    params: Mapping[str, Any] | None = None,
    protect: PathLike | Iterable[PathLike] | None = None,
    on_epoch: Callable[[int, History], None] | None = None,
    **overrides: Any,
) -> FitResult:
    """``train.fit`` with onert checkpoints: resume from ``resume``, write ``save`` as it goes.

    ``save`` is rewritten (atomically) after every epoch, or after every ``every_steps`` steps
    when given: the epoch's scan then runs in compiled chunks of that many steps. A resumed
    run trains ``config.epochs`` more whole epochs; with shuffling, epoch numbering continues
    from the checkpoint's ``cur_epoch`` so the data order matches an uninterrupted run.
    Results (history, params) are as ``fit`` returns them.
    """
    trainer = Trainer(model, config, **overrides)
    cfg = trainer.config
    if every_steps is not None and every_steps < 1:
        raise ValueError(f"every_steps must be >= 1, got {every_steps}")
    xs, ys = _as_inputs(model, x), jnp.asarray(y, jnp.float32)
    if any(a.shape[0] != ys.shape[0] for a in xs):
        raise DataError(f"inputs have {[a.shape[0] for a in xs]} samples, targets have "
                        f"{ys.shape[0]}")
    x_tr, y_tr, x_val, y_val = split_validation(xs, ys, cfg.validation_split)
    start = 0
    if resume is not None:
        ckpt = read_checkpoint(resume, model)
        state, frozen = restore_checkpoint(ckpt, model, trainer, params)
        start = ckpt.epoch
    else:
        state, frozen = trainer.init(params)
    if save is not None:  # fail before training, not after
        make_checkpoint(model, trainer, state, frozen)
    b = cfg.batch_size
    steps = max(y_tr.shape[0] // b, 1)
    chunk = min(every_steps or steps, steps)
    hist = History()
    t0 = time.perf_counter()
    xb, yb = _batched(x_tr, y_tr, b, steps)
    trainer._epoch.lower(state, frozen, tuple(a[:chunk] for a in xb), yb[:chunk]).compile()
    hist.compile_ms = (time.perf_counter() - t0) * 1000

    def checkpoint(s: TrainState, epochs_done: int) -> None:
        if save is not None:
            save_checkpoint(save, model, trainer, s, frozen, epoch=epochs_done, protect=protect)

    for epoch in range(cfg.epochs):
        t = time.perf_counter()
        if every_steps is None:
            state, m = trainer.run_epoch(state, frozen, x_tr, y_tr, start + epoch)
        else:
            state, m = _chunked_epoch(trainer, state, frozen, x_tr, y_tr, start + epoch,
                                      every_steps, lambda s, e=start + epoch: checkpoint(s, e))
        loss = float(jnp.mean(m.loss))
        ms = (time.perf_counter() - t) * 1000 / max(int(m.loss.shape[0]), 1)
        if not np.isfinite(loss) and not int(jnp.sum(m.skipped)):
            raise TrainingError(f"epoch {epoch + 1}: the loss is {loss} (not finite); lower "
                                "the learning rate or check the data")
        hist.loss.append(loss)
        seen = int(m.loss.shape[0]) * b
        hist.accuracy.append(float(jnp.sum(m.correct)) / max(seen, 1))
        hist.skipped.append(int(jnp.sum(m.skipped)))
        hist.loss_scale.append(float(state.loss_scale.loss_scale))
        hist.ms_per_step.append(ms)
        hist.steps.append(int(m.loss.shape[0]))
        checkpoint(state, start + epoch + 1)
        if y_val.shape[0]:
            vl, va = trainer.evaluate(trainer.merge(state, frozen), x_val, y_val)
            hist.val_loss.append(vl)
            hist.val_accuracy.append(va)
        if on_epoch is not None:
            on_epoch(epoch, hist)
    return FitResult(trainer.merge(state, frozen), state, hist, trainer)


def _chunked_epoch(trainer: Trainer, state: TrainState, frozen: dict, x: tuple, y: jax.Array,
                   epoch: int, every: int, after_chunk: Callable[[TrainState], None]
                   ) -> tuple[TrainState, StepMetrics]:
    """``Trainer.run_epoch`` as compiled scans of ``every`` steps, calling back after each."""
    cfg = trainer.config
    n, b = y.shape[0], cfg.batch_size
    if cfg.shuffle:
        perm = jax.random.permutation(jax.random.fold_in(jax.random.key(cfg.seed), epoch), n)
        x, y = tuple(a[perm] for a in x), y[perm]
    steps = n // b
    if steps == 0 and cfg.drop_remainder:
        raise DataError(f"{n} training samples are fewer than one batch of {b}")
    xs, ys = _batched(x, y, b, steps)
    parts = []
    for i in range(0, steps, every):
        state, m = trainer._epoch(state, frozen, tuple(a[i:i + every] for a in xs),
                                  ys[i:i + every])
        parts.append(m)
        after_chunk(state)
    if not cfg.drop_remainder and n % b:
        tail = (tuple(a[steps * b:] for a in x), y[steps * b:])
        state, m = trainer._step(state, frozen, tail)
        parts.append(jax.tree.map(lambda a: a[None], m))
    metrics = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
    return state, metrics
