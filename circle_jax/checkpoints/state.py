"""onert checkpoints: writing, reading (whatever the entry order) and resuming.

A checkpoint holds one entry per *constant tensor of subgraph 0 that an operator reads*
(float weights, trainable or frozen, and integer constants such as Reshape shapes; onert
leaves out a constant no operator reads, such as the old weights a new head replaced),
Adam ``m``/``v`` per entry (zero-size for tensors without optimizer state), the number of
weight updates (``cur_step``) and an epoch counter.

*Writing*: entries go in ascending tensor index (:func:`constant_tensors`) by default; such
files carry :data:`ASCENDING_MARK` in the header's reserved byte, so readers know their
order. onert reads entries by position, without checking, in its own order: write with
``order="onert"`` (:func:`onert_order`, which asks the onert wheel) for a file that
``onert_train --checkpoint`` / ``train_import_checkpoint`` reads right. ``cur_step`` is the
number of optimizer updates (Adam's ``t``), ``cur_epoch`` the number of completed epochs
(onert writes 0 there and ignores it on import).

*Reading* (:func:`read_checkpoint`): a marked file is in ascending order. Any other file
(onert's) is in onert's internal hash-map order, which depends on the model's tensor indices
and tensor count, so each entry is matched to a tensor by size and content
(:func:`checkpoint_order`):

1. an entry's candidates are the constant tensors with the same byte size (the count of
   entries of each size must equal the count of tensors of that size, or the file is
   refused);
2. within a group of same-size candidates, dtype decides where it can: an entry with Adam
   state belongs to a float tensor, and an integer tensor matches only its own exact bytes;
3. the rest is decided by distance to the model's current weights (mean absolute
   difference; a checkpoint taken after some training is closest to the weights it started
   from), assigning the closest (entry, tensor) pair first (greedy);
4. tensors whose reference bytes are *identical* (e.g. two zero-initialised biases of one
   size) cannot be told apart by content: the entries that go to them are placed as
   :func:`onert_order` says when the onert wheel is installed and its order agrees with
   every other entry, else in ascending order (then such tensors may come out swapped).

Resuming from a checkpoint restores weights, Adam ``m``/``v`` and the update count (and the
count of every other ``count``-carrying optax state, e.g. learning-rate schedules), so the
continued run is bit-identical to an uninterrupted one. Not stored (onert's format has no
place for them): loss-scale state (reset from the config), a partial gradient accumulation
(saving mid-cycle is refused) and optimizer state other than Adam's moments (momentum,
RMSprop: refused). Weights and moments are stored in the tensor's dtype, so a half-precision
model resumes from rounded float32 masters. A QAT model's moving activation ranges are
written beside the file (`circle_jax.checkpoints.ranges`).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..errors import CheckpointWarning, CircleFormatError, DataError, TrainingError
from ..formats.atomic import PathLike, atomic_write
from ..formats.checkpoint import Checkpoint, as_array, decode_checkpoint, encode_checkpoint
from ..formats.reader import read_bytes
from ..formats.writer import write_model
from ..graph import ir
from ..interop.onert import onert_checkpoint_order
from ..lowering.interpreter import RANGES
from ..model import Model
from ..optim import AccumulateState, AdamTFState, SparseAdamState
from ..train import (
    Trainer,
    TrainState,
)
from ._common import Source, _describe, _main_params, _nbytes, _stream_k, require_finite
from .ranges import read_ranges, restore_ranges, save_ranges

Order = str | Sequence[int]
"""A checkpoint entry order: "ascending", "onert", "auto" or the tensor index of each entry."""

ASCENDING_MARK = 1
"""Header byte 3 of circle-jax's ascending-order checkpoints (onert writes 0 and ignores it)."""

#: states whose mu/nu are Adam's m and v
_MOMENTS = (AdamTFState, SparseAdamState, optax.ScaleByAdamState)


def constant_tensors(model: Model) -> tuple[int, ...]:
    """Indices of the constant tensors of subgraph 0 that an operator reads, ascending: a
    checkpoint's entries in their default order (onert's hold the same tensors)."""
    sg = model.ir.main
    read = {i for op in sg.operators for i in op.inputs}
    return tuple(t.index for t in sg.tensors if t.is_constant and t.index in read)


def _moment_nodes(opt_state: Any) -> list[Any]:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, _MOMENTS))
    return [n for n in nodes if isinstance(n, _MOMENTS)]


def _accumulate_nodes(opt_state: Any) -> list[AccumulateState]:
    nodes = jax.tree.leaves(opt_state, is_leaf=lambda n: isinstance(n, AccumulateState))
    return [n for n in nodes if isinstance(n, AccumulateState)]


def _unstorable(opt_state: Any, path: str = "opt_state") -> list[str]:
    """Array leaves of shape > () outside Adam's moments and accumulators (e.g. momentum)."""
    kinds = (*_MOMENTS, AccumulateState)
    found = []
    nodes, _ = jax.tree_util.tree_flatten_with_path(
        opt_state, is_leaf=lambda n: isinstance(n, kinds))
    for keys, node in nodes:
        where = path + jax.tree_util.keystr(keys)
        if isinstance(node, _MOMENTS):
            continue
        if isinstance(node, AccumulateState):
            found += _unstorable(node.inner_state, where + ".inner_state")
        elif np.ndim(node) > 0:
            found.append(where)
    return found


def _updates(trainer: Trainer, state: TrainState) -> int:
    """The number of optimizer updates ``state`` has seen (onert's ``cur_step``)."""
    moments = _moment_nodes(state.opt_state)
    if moments:
        return int(moments[0].count)
    acc = _accumulate_nodes(state.opt_state)
    if acc:
        return int(acc[0].gradient_step)
    return int(state.step) // _stream_k(trainer)


def resolved_order(model: Model, order: Order) -> tuple[int, ...]:
    """An entry order given as "ascending", "onert", "auto" or tensor indices, checked (also
    onert's answer, which may come from a file kept by an earlier process)."""
    consts = constant_tensors(model)
    if isinstance(order, str):
        if order == "ascending":
            return consts
        if order not in ("onert", "auto"):
            raise ValueError(f"unknown checkpoint order {order!r}: use 'ascending', 'onert', "
                             "'auto' or a sequence of tensor indices")
        try:
            got = onert_order(model)
        except DataError:
            if order == "onert":
                raise
            return consts
    else:
        got = tuple(int(i) for i in order)
    if sorted(got) != list(consts):
        raise ValueError(f"checkpoint order {list(got)} is not a permutation of the model's "
                         f"constant tensors {list(consts)}")
    return got


def make_checkpoint(model: Model, trainer: Trainer, state: TrainState,
                    frozen: Mapping[str, Any] | None = None, epoch: int = 0,
                    order: Order = "ascending") -> Checkpoint:
    """The :class:`~circle_jax.formats.checkpoint.Checkpoint` of a training state.

    One entry per constant tensor of subgraph 0 in ``order`` ("ascending" tensor index,
    "onert" — see :func:`onert_order` —, "auto" — onert's when the onert wheel can tell,
    else ascending — or explicit tensor indices): trained weights from
    ``state``, frozen ones from ``frozen`` (default: the model's), other constants as
    stored. ``step`` is the number of optimizer updates; ``epoch`` is written as
    ``cur_epoch`` (completed epochs).
    """
    opt_state = trainer.per_weight_state(state)
    bad = _unstorable(opt_state)
    if bad:
        raise TrainingError(
            f"the optimizer state has {len(bad)} array(s) besides Adam's m and v (such as "
            f"{bad[0]}), which an onert checkpoint cannot hold; use --optimizer sgd or adam")
    acc = _accumulate_nodes(opt_state)
    if acc and int(acc[0].mini_step):
        raise TrainingError(
            f"cannot checkpoint in the middle of a gradient accumulation cycle "
            f"({int(acc[0].mini_step)} micro-batches accumulated); save after a real update")
    moments = _moment_nodes(opt_state)
    if len(moments) > 1:
        raise TrainingError(f"the optimizer state holds {len(moments)} Adam states; an onert "
                            "checkpoint holds one")
    frozen = model.params if frozen is None else frozen
    names = _main_params(model)
    sg = model.ir.main
    tensors, ms, vs = [], [], []
    for i in resolved_order(model, order):
        t = sg.tensors[i]
        dt = ir.as_numpy_dtype(t.dtype)
        name = names.get(i)
        if name is not None and name in state.params:
            value = state.params[name]
        elif name is not None and name in frozen:
            value = frozen[name]
        else:
            value = t.data
        what = f"{_describe(t)} of the state to checkpoint"
        tensors.append(require_finite(np.asarray(value).astype(dt), what, TrainingError))
        if moments and name is not None and name in state.params:
            ms.append(require_finite(np.asarray(moments[0].mu[name]).astype(dt),
                                     f"Adam m of {what}", TrainingError))
            vs.append(require_finite(np.asarray(moments[0].nu[name]).astype(dt),
                                     f"Adam v of {what}", TrainingError))
        else:
            ms.append(b"")
            vs.append(b"")
    return Checkpoint(tensors, ms if moments else None, vs if moments else None,
                      step=_updates(trainer, state), epoch=epoch)


def checkpoint_bytes(model: Model, trainer: Trainer, state: TrainState,
                     frozen: Mapping[str, Any] | None = None, *, epoch: int = 0,
                     order: Order = "ascending") -> bytes:
    """The checkpoint file's bytes (see :func:`make_checkpoint`).

    Files in ascending order carry ``ASCENDING_MARK`` in the header's reserved byte (offset 3;
    onert writes 0 there and ignores it on import), so readers need not guess their order.
    """
    resolved = resolved_order(model, order)
    mark = ASCENDING_MARK if resolved == constant_tensors(model) else 0
    return encode_checkpoint(make_checkpoint(model, trainer, state, frozen, epoch, resolved),
                             reserved=mark)


def save_checkpoint(path: PathLike, model: Model, trainer: Trainer, state: TrainState,
                    frozen: Mapping[str, Any] | None = None, *, epoch: int = 0,
                    order: Order = "ascending",
                    protect: PathLike | Iterable[PathLike] | None = None) -> None:
    """Write ``state`` as an onert checkpoint, atomically (see :func:`checkpoint_bytes`).

    ``order="onert"`` writes the entries in the order onert uses for this model, so
    ``onert_train --checkpoint`` / ``train_import_checkpoint`` read them right (onert reads
    entries by position, unchecked). ``protect`` names inputs that must not be overwritten.
    """
    data = checkpoint_bytes(model, trainer, state, frozen, epoch=epoch, order=order)
    atomic_write(path, data, protect=protect)
    save_ranges(path, state, protect)


def onert_order(model: Model) -> tuple[int, ...]:
    """The tensor index of each entry of the checkpoints onert writes for ``model``.

    onert's entry order comes from its internal hash maps (it depends on the tensor indices
    and the tensor count, not on the weights, the optimizer or the trainable ops), so this
    asks the installed ``onert`` wheel: it trains one step with no trainable operator on a
    copy of the model whose float constants hold distinct marker values, exports a
    checkpoint and matches entries by content. Cached per model (answer or refusal), so a
    run that writes many checkpoints serializes the model once; needs ``onert``.
    """
    found = _ONERT_ORDERS.get(model)
    if found is None:
        try:  # asked about the model after load's passes
            found = onert_checkpoint_order(write_model(model.ir))
        except DataError as e:
            found = str(e)
        _ONERT_ORDERS[model] = found
    if isinstance(found, str):
        raise DataError(found)
    return found


#: `onert_order`'s answers (an order, or a refusal's message) per live model
_ONERT_ORDERS: weakref.WeakKeyDictionary[Model, tuple[int, ...] | str] = \
    weakref.WeakKeyDictionary()


def read_checkpoint(source: Source, model: Model, params: Mapping[str, Any] | None = None,
                    order: Order | None = None) -> tuple[Checkpoint, tuple[int, ...]]:
    """Decode a checkpoint (path or bytes) for ``model``: ``(checkpoint, tensor of each entry)``.

    ``order`` None resolves the entries' tensors: files circle-jax wrote in ascending order
    say so in their header; other files (onert's) are matched by :func:`checkpoint_order`
    against ``params`` (default: the model's), with tensors of identical content placed as
    onert places them when the onert wheel can tell (:func:`onert_order`). "ascending",
    "onert" or explicit tensor indices force an order. Foreign, truncated or another model's
    files raise :class:`CircleFormatError` (one line, naming what was expected).
    """
    buf, where = read_bytes(source, "checkpoint", DataError)
    try:
        ckpt = decode_checkpoint(buf)
        n = len(constant_tensors(model))
        if len(ckpt.tensors) != n:
            raise CircleFormatError(
                f"checkpoint has {len(ckpt.tensors)} tensors, expected {n} (one per constant "
                "tensor of the model's subgraph 0): it belongs to another model")
        if order is None and buf[3] == ASCENDING_MARK:
            order = "ascending"
        if order is None:
            found = checkpoint_order(model, ckpt, params)
            if any(len(c) > 1 for c in _tie_classes(model, params)):
                try:
                    found = checkpoint_order(model, ckpt, params, ties=onert_order(model))
                except DataError:
                    pass  # no onert: ties stay in ascending order
        else:
            found = resolved_order(model, order)
            _check_sizes(model, ckpt, found)
    except CircleFormatError as e:
        raise CircleFormatError(f"{where}: {e}") from None
    sg = model.ir.main
    for e, i in enumerate(found):
        t = sg.tensors[i]
        if t.is_float:
            raw = [ckpt.tensors[e]] + ([ckpt.adam_m[e], ckpt.adam_v[e]] if ckpt.is_adam else [])
            dt = np.dtype(ir.as_numpy_dtype(t.dtype)).newbyteorder("<")
            for r in raw:
                if r.size and r.size % dt.itemsize == 0:
                    require_finite(np.frombuffer(r.tobytes(), dt), f"{where}: {_describe(t)}",
                                   DataError)
    return ckpt, found


def _check_sizes(model: Model, ckpt: Checkpoint, order: Sequence[int]) -> None:
    sg = model.ir.main
    for e, (raw, i) in enumerate(zip(ckpt.tensors, order)):
        if raw.size != _nbytes(sg.tensors[i]):
            raise CircleFormatError(f"checkpoint entry {e} has {raw.size} bytes, expected "
                                    f"{_nbytes(sg.tensors[i])} for {_describe(sg.tensors[i])}")


def _references(model: Model, params: Mapping[str, Any] | None) -> dict[int, np.ndarray]:
    """Reference value of each constant tensor of subgraph 0, in the tensor's dtype."""
    params = model.params if params is None else params
    names = _main_params(model)
    sg = model.ir.main
    out = {}
    for i in constant_tensors(model):
        t = sg.tensors[i]
        value = params[names[i]] if i in names and names[i] in params else t.data
        out[i] = np.asarray(value).astype(ir.as_numpy_dtype(t.dtype))
    return out


def _tie_classes(model: Model, params: Mapping[str, Any] | None) -> list[list[int]]:
    """Groups (ascending) of constant tensors with the same size and identical content."""
    classes: dict[bytes, list[int]] = {}
    for i, ref in _references(model, params).items():
        classes.setdefault(ref.tobytes(), []).append(i)
    return list(classes.values())


def checkpoint_order(model: Model, ckpt: Checkpoint, params: Mapping[str, Any] | None = None,
                     ties: Sequence[int] | None = None) -> tuple[int, ...]:
    """The tensor index of each checkpoint entry, resolved by size and content.

    The rule (see the module docstring): candidates have the entry's byte size; an entry
    with Adam state is a float tensor and an integer tensor takes only its exact bytes; the
    rest goes by the smallest mean absolute difference to ``params`` (default: the model's
    weights), greedy. Entries that land on tensors of identical content take ``ties`` (an
    entry order such as :func:`onert_order`'s) when it agrees with every other entry, else
    ascending order. Raises :class:`CircleFormatError` when the sizes do not fit the model.
    """
    sg = model.ir.main
    consts = constant_tensors(model)
    if len(ckpt.tensors) != len(consts):
        raise CircleFormatError(
            f"checkpoint has {len(ckpt.tensors)} tensors, expected {len(consts)} (one per "
            "constant tensor of the model's subgraph 0)")
    refs = _references(model, params)
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
    classes = _tie_classes(model, params)
    class_of = {i: k for k, c in enumerate(classes) for i in c}
    # greedy over (entry, class) pairs: a class of identical tensors takes as many entries
    # as it has members
    pairs = []
    for size, es in entries.items():
        ks = sorted({class_of[i] for i in by_size[size]})
        for e in es:
            stateful = ckpt.adam_m is not None and ckpt.adam_m[e].size > 0
            for k in ks:
                i = classes[k][0]
                d = 0.0 if len(ks) == 1 else _distance(ckpt.tensors[e], sg.tensors[i], refs[i],
                                                       stateful)
                pairs.append((d, e, k))
    pairs.sort()
    taken: dict[int, list[int]] = {k: [] for k in range(len(classes))}
    done: set[int] = set()
    for _, e, k in pairs:
        if e not in done and len(taken[k]) < len(classes[k]):
            taken[k].append(e)
            done.add(e)
    order = [-1] * len(consts)
    for k, group in enumerate(classes):
        for e, i in zip(sorted(taken[k]), group):
            order[e] = i
    if ties is not None and len(ties) == len(order):
        ties = tuple(int(i) for i in ties)
        agree = all(class_of.get(t) == class_of[o] if len(classes[class_of[o]]) > 1 else t == o
                    for t, o in zip(ties, order))
        if agree:
            order = list(ties)
    return tuple(order)


def _distance(raw: np.ndarray, t: ir.Tensor, ref: np.ndarray, stateful: bool) -> float:
    """How far an entry's bytes are from tensor ``t``'s reference value (inf: impossible)."""
    if not t.is_float:
        if stateful:
            return float("inf")
        return 0.0 if raw.tobytes() == ref.tobytes() else float("inf")
    value = as_array(raw, ir.as_numpy_dtype(t.dtype), t.shape).astype(np.float64)
    with np.errstate(all="ignore"):
        d = float(np.mean(np.abs(value - ref.astype(np.float64)))) if value.size else 0.0
    return d if np.isfinite(d) else float("inf")


def _entry_params(ckpt: Checkpoint, model: Model, order: Sequence[int],
                  params: Mapping[str, Any]) -> dict[str, jax.Array]:
    out = dict(params)
    names = _main_params(model)
    sg = model.ir.main
    for e, i in enumerate(order):
        if i in names:
            t = sg.tensors[i]
            dt = ir.as_numpy_dtype(t.dtype)
            out[names[i]] = jnp.asarray(as_array(ckpt.tensors[e], dt, t.shape))
    return out


def checkpoint_params(source: Source, model: Model, params: Mapping[str, Any] | None = None,
                      order: Order | None = None) -> dict[str, jax.Array]:
    """All params of ``model`` (model dtypes) with the weights found in a checkpoint.

    ``params``: reference weights for matching (see :func:`read_checkpoint`) and the values
    of params the checkpoint does not cover; default: the model's own. A QAT model's
    moving activation ranges saved beside it come with them
    (`circle_jax.lowering.interpreter.RANGES`).
    """
    ckpt, found = read_checkpoint(source, model, params, order)
    out = _entry_params(ckpt, model, found, model.params if params is None else params)
    ranges = read_ranges(source, model)
    return {**out, RANGES: ranges} if ranges else out


def load_checkpoint(source: Source, model: Model, trainer: Trainer,
                    params: Mapping[str, Any] | None = None,
                    order: Order | None = None) -> tuple[TrainState, dict]:
    """Resume from an onert checkpoint (circle-jax's or onert's): ``(state, frozen)``.

    Entries are matched to tensors as :func:`read_checkpoint` says; the state gets the
    weights, Adam ``m``/``v`` (zeros for trainable tensors without state in the file; dropped
    for a non-Adam trainer) and the update count. Continue with :func:`fit_checkpointed`, or
    ``fit(..., state=state, params=trainer.merge(state, frozen))``.
    """
    ckpt, found = read_checkpoint(source, model, params, order)
    return _restore(ckpt, found, model, trainer, params, source)


def _restore(ckpt: Checkpoint, order: Sequence[int], model: Model, trainer: Trainer,
             params: Mapping[str, Any] | None, source: Source) -> tuple[TrainState, dict]:
    params = model.params if params is None else params
    state, frozen = trainer.init(_entry_params(ckpt, model, order, params))
    names = _main_params(model)
    sg = model.ir.main
    mu: dict[str, np.ndarray] = {}
    nu: dict[str, np.ndarray] = {}
    if ckpt.is_adam:
        for e, i in enumerate(order):
            name = names.get(i)
            if name in state.params and ckpt.adam_m[e].size:
                t = sg.tensors[i]
                dt = ir.as_numpy_dtype(t.dtype)
                master = state.params[name].dtype
                mu[name] = np.asarray(as_array(ckpt.adam_m[e], dt, t.shape), master)
                nu[name] = np.asarray(as_array(ckpt.adam_v[e], dt, t.shape), master)
    updates = ckpt.step if ckpt.is_adam or not _moment_nodes(state.opt_state) else 0
    if ckpt.is_adam and not _moment_nodes(state.opt_state):
        warnings.warn(CheckpointWarning(
            f"the checkpoint holds Adam's moments, which optimizer "
            f"{trainer.config.optimizer!r} keeps none of: they are dropped (the weights and "
            f"the update count resume)"), stacklevel=3)

    def set_moments(n: Any) -> Any:
        if not isinstance(n, _MOMENTS):
            return n
        # fresh zeros where the file has no state (never one buffer for two leaves: donated)
        return n._replace(mu={k: mu[k] if k in mu else np.zeros_like(v) for k, v in n.mu.items()},
                          nu={k: nu[k] if k in nu else np.zeros_like(v) for k, v in n.nu.items()})

    def set_count(n: Any) -> Any:
        if isinstance(n, AccumulateState):
            return n._replace(gradient_step=jnp.asarray(updates, n.gradient_step.dtype))
        if _has_count(n):
            return n._replace(count=jnp.asarray(updates, n.count.dtype))
        return n

    opt = jax.tree.map(set_moments, trainer.per_weight_state(state),
                       is_leaf=lambda n: isinstance(n, _MOMENTS))
    opt = jax.tree.map(set_count, opt, is_leaf=lambda n: isinstance(n, AccumulateState))
    opt = jax.tree.map(set_count, opt, is_leaf=_has_count)
    state = trainer.with_per_weight_state(state, opt)
    step = jnp.asarray(ckpt.step * _stream_k(trainer), state.step.dtype)
    return restore_ranges(source, model, state._replace(step=step)), frozen


def _has_count(n: Any) -> bool:
    return isinstance(n, tuple) and "count" in getattr(n, "_fields", ())
