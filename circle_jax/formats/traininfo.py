"""circle+ training metadata: the ``CIRCLE_TRAINING`` FlatBuffer (identifier ``CTR0``).

A Circle model carries its training parameters in a ``Model.metadata`` entry named
``CIRCLE_TRAINING`` whose buffer holds a complete FlatBuffer with root table
``ModelTraining``. Its vtable slots (a union field takes two: its ``_type`` then its value):

====  ======================  =============================================
slot  field                   type
====  ======================  =============================================
0     version                 uint32
1     optimizer               int8  (SGD=0, ADAM=1)
2     optimizer_opt_type      uint8 (NONE=0, SGDOptions=1, AdamOptions=2)
3     optimizer_opt           table
4     lossfn                  int8  (SPARSE_CCE=0, CCE=1, MSE=2)
5     lossfn_opt_type         uint8 (NONE=0, SparseCCE=1, CCE=2, MSE=3)
6     lossfn_opt              table
7     epochs                  int32
8     batch_size              int32
9     loss_reduction_type     int8  (SumOverBatchSize=0, Sum=1)
10    trainable_ops           [int32]
====  ======================  =============================================

There are no generated bindings for this schema in ``circle-schema``, so it is written
with ``flatbuffers.Builder`` and read by a small bounds-checked reader here.

The JSON form is the one ONE's ``circle_plus_gen`` reads (see :func:`traininfo_from_json`).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import flatbuffers
import numpy as np

from circle_jax.errors import CircleFormatError

METADATA_NAME = "CIRCLE_TRAINING"
"""Name of the ``Model.metadata`` entry that holds the training FlatBuffer."""

FILE_IDENTIFIER = b"CTR0"
"""Identifier written by :func:`encode_traininfo`."""

ACCEPTED_IDENTIFIERS = (b"CTR0", b"CTR1")
"""Identifiers accepted by :func:`decode_traininfo` (an older onert copy writes CTR1)."""

OPTIMIZERS = ("sgd", "adam")
LOSSES = ("sparse_categorical_crossentropy", "categorical_crossentropy", "mean_squared_error")
REDUCTIONS = ("sum_over_batch_size", "sum")

# Enum values of the schema; list index == enum value.
_OPTIMIZER_ENUM = {name: i for i, name in enumerate(OPTIMIZERS)}
_LOSS_ENUM = {name: i for i, name in enumerate(LOSSES)}
_REDUCTION_ENUM = {name: i for i, name in enumerate(REDUCTIONS)}
# Union tags (0 is NONE).
_OPT_UNION = {"sgd": 1, "adam": 2}
_LOSS_UNION = {
    "sparse_categorical_crossentropy": 1,
    "categorical_crossentropy": 2,
    "mean_squared_error": 3,
}

# vtable slots of ModelTraining
_S_VERSION, _S_OPTIMIZER, _S_OPT_TYPE, _S_OPT = 0, 1, 2, 3
_S_LOSSFN, _S_LOSS_TYPE, _S_LOSS_OPT = 4, 5, 6
_S_EPOCHS, _S_BATCH, _S_REDUCTION, _S_TRAINABLE = 7, 8, 9, 10
_NUM_SLOTS = 11

# Keras defaults, used where a JSON file leaves an argument out.
DEFAULT_LEARNING_RATE = {"sgd": 0.01, "adam": 0.001}
DEFAULT_BETA_1 = 0.9
DEFAULT_BETA_2 = 0.999
DEFAULT_EPSILON = 1e-7


@dataclass(frozen=True)
class TrainInfo:
    """Training parameters stored in a circle+ model.

    ``beta_1``, ``beta_2`` and ``epsilon`` are only stored for Adam; ``from_logits`` only
    for the cross-entropies. ``epochs == 0`` means "not set" (circle_plus_gen never sets
    it). ``trainable_ops`` are operator indices of subgraph 0 (empty = nothing trains).
    """

    optimizer: str = "sgd"
    learning_rate: float = 0.01
    beta_1: float = DEFAULT_BETA_1
    beta_2: float = DEFAULT_BETA_2
    epsilon: float = DEFAULT_EPSILON
    loss: str = "mean_squared_error"
    from_logits: bool = False
    reduction: str = "sum_over_batch_size"
    epochs: int = 0
    batch_size: int = 1
    trainable_ops: tuple[int, ...] = field(default_factory=tuple)
    version: int = 0

    def __post_init__(self) -> None:
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("loss", self.loss, LOSSES)
        _check_choice("reduction", self.reduction, REDUCTIONS)
        ops = tuple(int(i) for i in self.trainable_ops)
        if any(i < 0 for i in ops):
            raise ValueError(f"trainable_ops must be operator indices >= 0, got {list(ops)}")
        object.__setattr__(self, "trainable_ops", ops)
        object.__setattr__(self, "from_logits", bool(self.from_logits))
        for name in ("learning_rate", "beta_1", "beta_2", "epsilon"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name, lo, hi in (
            ("epochs", -(2**31), 2**31 - 1),
            ("batch_size", -(2**31), 2**31 - 1),
            ("version", 0, 2**32 - 1),
        ):
            v = int(getattr(self, name))
            if not lo <= v <= hi:
                raise ValueError(f"{name} must fit in the schema's integer type, got {v}")
            object.__setattr__(self, name, v)


def _check_choice(what: str, value: object, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"unknown {what} {value!r}; accepted: {', '.join(accepted)}")


def _f32(x: float) -> float:
    """The shortest decimal that rounds to the same float32 (0.01f reads back as 0.01)."""
    return float(str(np.float32(x)))


# --------------------------------------------------------------------------- encode


def encode_traininfo(info: TrainInfo) -> bytes:
    """Serialize ``info`` as a ``ModelTraining`` FlatBuffer with identifier ``CTR0``."""
    b = flatbuffers.Builder(128)

    trainable = None
    if info.trainable_ops:
        b.StartVector(4, len(info.trainable_ops), 4)
        for i in reversed(info.trainable_ops):
            b.PrependInt32(i)
        trainable = b.EndVector()

    # optimizer options table
    if info.optimizer == "adam":
        b.StartObject(4)
        b.PrependFloat32Slot(0, info.learning_rate, 0.0)
        b.PrependFloat32Slot(1, info.beta_1, 0.0)
        b.PrependFloat32Slot(2, info.beta_2, 0.0)
        b.PrependFloat32Slot(3, info.epsilon, 0.0)
    else:
        b.StartObject(1)
        b.PrependFloat32Slot(0, info.learning_rate, 0.0)
    opt = b.EndObject()

    # loss options table
    if info.loss == "mean_squared_error":
        b.StartObject(0)
    else:
        b.StartObject(1)
        b.PrependBoolSlot(0, info.from_logits, False)
    loss_opt = b.EndObject()

    b.StartObject(_NUM_SLOTS)
    b.PrependUint32Slot(_S_VERSION, info.version, 0)
    b.PrependInt8Slot(_S_OPTIMIZER, _OPTIMIZER_ENUM[info.optimizer], 0)
    b.PrependUint8Slot(_S_OPT_TYPE, _OPT_UNION[info.optimizer], 0)
    b.PrependUOffsetTRelativeSlot(_S_OPT, opt, 0)
    b.PrependInt8Slot(_S_LOSSFN, _LOSS_ENUM[info.loss], 0)
    b.PrependUint8Slot(_S_LOSS_TYPE, _LOSS_UNION[info.loss], 0)
    b.PrependUOffsetTRelativeSlot(_S_LOSS_OPT, loss_opt, 0)
    b.PrependInt32Slot(_S_EPOCHS, info.epochs, 0)
    b.PrependInt32Slot(_S_BATCH, info.batch_size, 0)
    b.PrependInt8Slot(_S_REDUCTION, _REDUCTION_ENUM[info.reduction], 0)
    if trainable is not None:
        b.PrependUOffsetTRelativeSlot(_S_TRAINABLE, trainable, 0)
    root = b.EndObject()
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


# --------------------------------------------------------------------------- decode


class _Table:
    """A FlatBuffer table at ``pos`` in ``buf``, read with bounds checks."""

    def __init__(self, buf: bytes, pos: int, what: str) -> None:
        self.buf, self.pos, self.what = buf, pos, what
        vt = pos - _unpack(buf, "<i", pos, what)
        self.vt = vt
        self.vt_len = _unpack(buf, "<H", vt, what)
        if self.vt_len < 4 or self.vt_len % 2:
            raise CircleFormatError(f"{what}: corrupt vtable (size {self.vt_len})")
        _need(buf, vt, self.vt_len, what)
        _need(buf, pos, _unpack(buf, "<H", vt + 2, what), what)

    def _field(self, slot: int) -> int:
        """Absolute position of the field in ``slot``, or 0 when absent."""
        off = 4 + 2 * slot
        if off >= self.vt_len:
            return 0
        rel = _unpack(self.buf, "<H", self.vt + off, self.what)
        return self.pos + rel if rel else 0

    def scalar(self, slot: int, fmt: str, default: int | float) -> Any:
        p = self._field(slot)
        return _unpack(self.buf, fmt, p, self.what) if p else default

    def table(self, slot: int, what: str) -> _Table | None:
        p = self._field(slot)
        if not p:
            return None
        return _Table(self.buf, p + _unpack(self.buf, "<I", p, self.what), what)

    def int32_vector(self, slot: int, what: str) -> tuple[int, ...] | None:
        p = self._field(slot)
        if not p:
            return None
        start = p + _unpack(self.buf, "<I", p, self.what)
        n = _unpack(self.buf, "<I", start, what)
        _need(self.buf, start + 4, 4 * n, what)
        return tuple(int(v) for v in np.frombuffer(self.buf, "<i4", n, start + 4))


def _need(buf: bytes, pos: int, size: int, what: str) -> None:
    if pos < 0 or pos + size > len(buf):
        raise CircleFormatError(
            f"{what}: truncated or corrupt, needs bytes {pos}..{pos + size} "
            f"but the buffer has {len(buf)}"
        )


def _unpack(buf: bytes, fmt: str, pos: int, what: str) -> Any:
    _need(buf, pos, struct.calcsize(fmt), what)
    return struct.unpack_from(fmt, buf, pos)[0]


def _enum_name(value: int, names: tuple[str, ...], what: str) -> str:
    if not 0 <= value < len(names):
        raise CircleFormatError(
            f"CIRCLE_TRAINING: unknown {what} value {value}; expected 0..{len(names) - 1} "
            f"({', '.join(names)})"
        )
    return names[value]


def _union_tag(root: _Table, slot: int, expected: int, which: str, what: str) -> int:
    """The type tag of an options union: 0 (absent) or the one ``which`` implies."""
    tag = root.scalar(slot, "<B", 0)
    if tag not in (0, expected):
        raise CircleFormatError(
            f"{what}: {which} but its options union has tag {tag} (expected {expected})")
    return tag


def decode_traininfo(buf: bytes | bytearray | memoryview) -> TrainInfo:
    """Parse a ``ModelTraining`` FlatBuffer (identifier ``CTR0`` or ``CTR1``)."""
    buf = bytes(buf)
    what = "CIRCLE_TRAINING"
    if len(buf) < 8:
        raise CircleFormatError(
            f"{what}: {len(buf)} bytes is too short for a FlatBuffer (expected at least 8)"
        )
    ident = buf[4:8]
    if ident not in ACCEPTED_IDENTIFIERS:
        raise CircleFormatError(
            f"{what}: file identifier {ident!r} is not training metadata "
            f"(expected {' or '.join(repr(i) for i in ACCEPTED_IDENTIFIERS)})"
        )
    root = _Table(buf, _unpack(buf, "<I", 0, what), what)

    optimizer = _enum_name(root.scalar(_S_OPTIMIZER, "<b", 0), OPTIMIZERS, "optimizer")
    opt_type = _union_tag(root, _S_OPT_TYPE, _OPT_UNION[optimizer], f"optimizer is {optimizer}",
                          what)
    opt = root.table(_S_OPT, f"{what} optimizer options") if opt_type else None
    lr = beta_1 = beta_2 = epsilon = 0.0
    if opt is not None:
        lr = opt.scalar(0, "<f", 0.0)
        if optimizer == "adam":
            beta_1 = opt.scalar(1, "<f", 0.0)
            beta_2 = opt.scalar(2, "<f", 0.0)
            epsilon = opt.scalar(3, "<f", 0.0)
    if optimizer == "sgd":  # not stored for SGD: keep the dataclass defaults
        beta_1, beta_2, epsilon = DEFAULT_BETA_1, DEFAULT_BETA_2, DEFAULT_EPSILON

    loss = _enum_name(root.scalar(_S_LOSSFN, "<b", 0), LOSSES, "loss function")
    loss_type = _union_tag(root, _S_LOSS_TYPE, _LOSS_UNION[loss], f"loss is {loss}", what)
    from_logits = False
    if loss_type and loss != "mean_squared_error":
        loss_opt = root.table(_S_LOSS_OPT, f"{what} loss options")
        if loss_opt is not None:
            from_logits = bool(loss_opt.scalar(0, "<B", 0))

    reduction = _enum_name(root.scalar(_S_REDUCTION, "<b", 0), REDUCTIONS, "loss reduction")
    trainable = root.int32_vector(_S_TRAINABLE, f"{what} trainable_ops") or ()
    if any(i < 0 for i in trainable):
        raise CircleFormatError(
            f"{what}: trainable_ops holds negative operator indices {list(trainable)}"
        )
    return TrainInfo(
        optimizer=optimizer,
        learning_rate=_f32(lr),
        beta_1=_f32(beta_1),
        beta_2=_f32(beta_2),
        epsilon=_f32(epsilon),
        loss=loss,
        from_logits=from_logits,
        reduction=reduction,
        epochs=root.scalar(_S_EPOCHS, "<i", 0),
        batch_size=root.scalar(_S_BATCH, "<i", 0),
        trainable_ops=trainable,
        version=root.scalar(_S_VERSION, "<I", 0),
    )


# --------------------------------------------------------------------------- JSON

# circle_plus_gen's names (lower-cased, compared as given); the first is written.
_JSON_OPTIMIZERS = {"sgd": "sgd", "stocasticgradientdescent": "sgd", "adam": "adam"}
_JSON_LOSSES = {
    "sparse categorical crossentropy": "sparse_categorical_crossentropy",
    "sparsecategoricalcrossentropy": "sparse_categorical_crossentropy",
    "sparsecce": "sparse_categorical_crossentropy",
    "categorical crossentropy": "categorical_crossentropy",
    "categoricalcrossentropy": "categorical_crossentropy",
    "cce": "categorical_crossentropy",
    "mean squared error": "mean_squared_error",
    "mse": "mean_squared_error",
}
_JSON_REDUCTIONS = {
    "sum over batch size": "sum_over_batch_size",
    "sumoverbatchsize": "sum_over_batch_size",
    "sum": "sum",
}
_JSON_NAME = {
    "sgd": "sgd",
    "adam": "adam",
    "sparse_categorical_crossentropy": "sparse categorical crossentropy",
    "categorical_crossentropy": "categorical crossentropy",
    "mean_squared_error": "mean squared error",
    "sum_over_batch_size": "sum over batch size",
    "sum": "sum",
}
# argument spellings: circle_plus_gen's camelCase and the schema's snake_case
_ARG_ALIASES = {
    "learningRate": "learning_rate",
    "learning_rate": "learning_rate",
    "beta1": "beta_1",
    "beta_1": "beta_1",
    "beta2": "beta_2",
    "beta_2": "beta_2",
    "epsilon": "epsilon",
    "fromLogits": "from_logits",
    "from_logits": "from_logits",
    "reduction": "reduction",
}
_OPT_ARGS = {"sgd": ("learning_rate",), "adam": ("learning_rate", "beta_1", "beta_2", "epsilon")}
_TOP_KEYS = ("optimizer", "loss", "batchSize", "fineTuning", "epochs")


def _lookup(table: dict[str, str], value: object, what: str) -> str:
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ValueError(f"unknown {what} {value!r}; accepted: {', '.join(repr(k) for k in table)}")


def _section(obj: dict, key: str) -> tuple[str, dict]:
    sec = obj[key]
    if not isinstance(sec, dict):
        raise ValueError(f"training JSON: {key!r} must be an object with 'type' and 'args'")
    unknown = sorted(set(sec) - {"type", "args", "reduction"})
    if unknown or "type" not in sec:
        raise ValueError(
            f"training JSON: {key!r} has keys {sorted(sec)}; expected 'type' and optional 'args'"
        )
    args = sec.get("args", {}) or {}
    if not isinstance(args, dict):
        raise ValueError(f"training JSON: {key}.args must be an object, got {args!r}")
    return sec["type"], args


def _args(args: dict, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        name = _ARG_ALIASES.get(key)
        if name not in allowed:
            spell = [k for k, v in _ARG_ALIASES.items() if v in allowed]
            raise ValueError(f"unknown {where} argument {key!r}; accepted: {', '.join(spell)}")
        if name in out:
            raise ValueError(f"{where} argument {name!r} is given twice ({key!r} and an alias)")
        out[name] = value
    return out


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"training JSON: {what} must be a number, got {value!r}")
    return float(value)


def _integer(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"training JSON: {what} must be an integer, got {value!r}")
    return value


def traininfo_from_json(obj: dict, num_operators: int) -> TrainInfo:
    """Build a :class:`TrainInfo` from circle_plus_gen's JSON.

    Keys: ``optimizer`` {type: sgd|adam, args: {learningRate, beta1, beta2, epsilon}},
    ``loss`` {type: "categorical crossentropy"|"sparse categorical crossentropy"|
    "mean squared error" (or cce/sparsecce/mse), args: {fromLogits, reduction:
    "sum over batch size"|"sum"}}, ``batchSize``, optional ``fineTuning`` (0 = all
    operators train (default), -1 = none, N > 0 = the last N operators) and, beyond
    circle_plus_gen, optional ``epochs``. Argument names may also be written in the
    schema's snake_case (learning_rate, beta_1, from_logits). ``reduction`` may sit in
    ``loss.args`` (as circle_plus_gen documents) or in ``loss`` (as its code reads).

    Arguments left out take Keras' defaults (circle_plus_gen would store 0): learning
    rate 0.01 for SGD and 0.001 for Adam, beta1 0.9, beta2 0.999, epsilon 1e-7,
    fromLogits false, reduction "sum over batch size".
    """
    if not isinstance(obj, dict):
        raise ValueError(f"training JSON must be an object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in _TOP_KEYS]
    if unknown:
        raise ValueError(
            f"unknown training JSON key(s) {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(_TOP_KEYS)}"
        )
    for key in ("optimizer", "loss", "batchSize"):
        if key not in obj:
            raise ValueError(f"training JSON lacks the required key {key!r}")

    opt_type, opt_args = _section(obj, "optimizer")
    optimizer = _lookup(_JSON_OPTIMIZERS, opt_type, "optimizer.type")
    oargs = _args(opt_args, _OPT_ARGS[optimizer], f"{optimizer} optimizer")
    lr = _number(oargs.get("learning_rate", DEFAULT_LEARNING_RATE[optimizer]), "learningRate")

    loss_type, loss_args = _section(obj, "loss")
    loss = _lookup(_JSON_LOSSES, loss_type, "loss.type")
    allowed = ("reduction",) if loss == "mean_squared_error" else ("from_logits", "reduction")
    largs = _args(loss_args, allowed, f"{_JSON_NAME[loss]} loss")
    reduction_names = [v for v in (largs.get("reduction"), obj["loss"].get("reduction")) if v]
    reductions = {_lookup(_JSON_REDUCTIONS, r, "loss reduction") for r in reduction_names}
    if len(reductions) > 1:
        raise ValueError(
            f"training JSON gives two different loss reductions {sorted(reductions)}; give one"
        )
    from_logits = largs.get("from_logits", False)
    if not isinstance(from_logits, bool):
        raise ValueError(f"training JSON: fromLogits must be true or false, got {from_logits!r}")

    batch_size = _integer(obj["batchSize"], "batchSize")
    if batch_size < 1:
        raise ValueError(f"training JSON: batchSize must be >= 1, got {batch_size}")
    fine = _integer(obj.get("fineTuning", 0), "fineTuning")
    if fine == 0:
        trainable = tuple(range(num_operators))
    elif fine == -1:
        trainable = ()
    elif 0 < fine <= num_operators:
        trainable = tuple(range(num_operators - fine, num_operators))
    else:
        raise ValueError(
            f"training JSON: fineTuning {fine} is invalid for a model with {num_operators} "
            f"operators; expected 0 (all), -1 (none) or 1..{num_operators} (the last N)"
        )
    epochs = _integer(obj.get("epochs", 0), "epochs")
    if epochs < 0:
        raise ValueError(f"training JSON: epochs must be >= 0 (0: not set), got {epochs}")
    if not (math.isfinite(lr) and lr >= 0):
        raise ValueError(f"training JSON: learningRate must be a finite number >= 0, got {lr}")

    return TrainInfo(
        optimizer=optimizer,
        learning_rate=lr,
        beta_1=_number(oargs.get("beta_1", DEFAULT_BETA_1), "beta1"),
        beta_2=_number(oargs.get("beta_2", DEFAULT_BETA_2), "beta2"),
        epsilon=_number(oargs.get("epsilon", DEFAULT_EPSILON), "epsilon"),
        loss=loss,
        from_logits=from_logits,
        reduction=reductions.pop() if reductions else "sum_over_batch_size",
        epochs=epochs,
        batch_size=batch_size,
        trainable_ops=trainable,
    )


def fine_tuning_value(trainable_ops: tuple[int, ...], num_operators: int) -> int:
    """circle_plus_gen's ``fineTuning`` for a set of trainable ops (0 all, -1 none, N tail)."""
    ops = sorted(set(trainable_ops))
    if not ops:
        return -1
    if ops == list(range(num_operators)):
        return 0
    if ops == list(range(num_operators - len(ops), num_operators)):
        return len(ops)
    raise ValueError(
        f"trainable_ops {ops} cannot be written as fineTuning: it expresses only all "
        f"operators, none, or the last N of the model's {num_operators}"
    )


def traininfo_to_json(info: TrainInfo, num_operators: int) -> dict:
    """The circle_plus_gen JSON object for ``info`` (``epochs`` only when set)."""
    if info.optimizer == "adam":
        opt_args = {
            "learningRate": info.learning_rate,
            "beta1": info.beta_1,
            "beta2": info.beta_2,
            "epsilon": info.epsilon,
        }
    else:
        opt_args = {"learningRate": info.learning_rate}
    loss_args: dict[str, Any] = {}
    if info.loss != "mean_squared_error":
        loss_args["fromLogits"] = info.from_logits
    loss_args["reduction"] = _JSON_NAME[info.reduction]
    out: dict[str, Any] = {
        "optimizer": {"type": _JSON_NAME[info.optimizer], "args": opt_args},
        "loss": {"type": _JSON_NAME[info.loss], "args": loss_args},
        "batchSize": info.batch_size,
        "fineTuning": fine_tuning_value(info.trainable_ops, num_operators),
    }
    if info.epochs:
        out["epochs"] = info.epochs
    return out
