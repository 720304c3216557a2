"""circle+ training metadata: FlatBuffer encoding, circle_plus_gen JSON, and onert reading it."""

from __future__ import annotations

import random
from pathlib import Path

import flatbuffers
import numpy as np
import pytest

from circle_jax.errors import CircleFormatError
from circle_jax.formats.traininfo import (
    METADATA_NAME,
    TrainInfo,
    decode_traininfo,
    encode_traininfo,
    fine_tuning_value,
    traininfo_from_json,
    traininfo_to_json,
)
from tests.paths import shared_model

MNIST = "onert_micro_simple_mnist_model.circle"  # 6 operators: conv, pool, reshape, fc, fc, sm


def _shared_model(name: str) -> Path:
    return Path(shared_model(name))


ADAM = TrainInfo(
    optimizer="adam",
    learning_rate=0.0125,
    beta_1=0.8,
    beta_2=0.99,
    epsilon=1e-6,
    loss="categorical_crossentropy",
    from_logits=True,
    reduction="sum",
    epochs=3,
    batch_size=7,
    trainable_ops=(3, 4, 5),
    version=2,
)
SGD = TrainInfo(optimizer="sgd", learning_rate=0.5, loss="mean_squared_error", batch_size=3)


@pytest.mark.parametrize(
    "info",
    [
        ADAM,
        SGD,
        TrainInfo(),
        TrainInfo(loss="sparse_categorical_crossentropy", trainable_ops=tuple(range(40))),
        TrainInfo(optimizer="adam", learning_rate=0.001, reduction="sum", batch_size=0),
    ],
)
def test_round_trip(info: TrainInfo) -> None:
    buf = encode_traininfo(info)
    assert buf[4:8] == b"CTR0"
    assert decode_traininfo(buf) == info


def test_float32_values_read_back_as_their_short_decimal() -> None:
    info = decode_traininfo(encode_traininfo(TrainInfo(learning_rate=0.01)))
    assert info.learning_rate == 0.01  # stored as float32 0.0099999998


def test_ctr1_identifier_is_accepted() -> None:
    buf = bytearray(encode_traininfo(ADAM))
    buf[4:8] = b"CTR1"
    assert decode_traininfo(bytes(buf)) == ADAM


def test_foreign_identifier_is_refused() -> None:
    buf = bytearray(encode_traininfo(ADAM))
    buf[4:8] = b"CIR0"
    with pytest.raises(CircleFormatError, match=r"identifier b'CIR0'.*expected b'CTR0' or b'CTR1'"):
        decode_traininfo(bytes(buf))


def test_too_short() -> None:
    with pytest.raises(CircleFormatError, match="3 bytes is too short"):
        decode_traininfo(b"abc")


def test_truncated_and_corrupt_buffers_raise_only_circle_format_error() -> None:
    buf = encode_traininfo(ADAM)
    with pytest.raises(CircleFormatError, match="truncated or corrupt"):
        decode_traininfo(buf[: len(buf) // 2])
    for cut in range(8, len(buf)):
        try:
            decode_traininfo(buf[:cut])
        except CircleFormatError:
            pass
    rng = random.Random(0)
    for _ in range(300):
        bad = bytearray(buf)
        for _ in range(3):
            bad[rng.randrange(8, len(bad))] = rng.randrange(256)
        try:
            decode_traininfo(bytes(bad))
        except CircleFormatError:
            pass


def _hand_built(optimizer: int, opt_type: int, lossfn: int = 2, reduction: int = 0) -> bytes:
    b = flatbuffers.Builder(64)
    b.StartObject(1)
    b.PrependFloat32Slot(0, 0.5, 0.0)
    opt = b.EndObject()
    b.StartObject(11)
    b.PrependInt8Slot(1, optimizer, 0)
    b.PrependUint8Slot(2, opt_type, 0)
    b.PrependUOffsetTRelativeSlot(3, opt, 0)
    b.PrependInt8Slot(4, lossfn, 0)
    b.PrependInt8Slot(9, reduction, 0)
    b.Finish(b.EndObject(), file_identifier=b"CTR0")
    return bytes(b.Output())


def test_schema_defaults_when_fields_are_absent() -> None:
    info = decode_traininfo(_hand_built(0, 1))
    assert (info.optimizer, info.learning_rate, info.loss) == ("sgd", 0.5, "mean_squared_error")
    assert (info.epochs, info.batch_size, info.trainable_ops, info.version) == (0, 0, (), 0)


@pytest.mark.parametrize(
    "args, message",
    [
        ((5, 1), r"unknown optimizer value 5; expected 0..1 \(sgd, adam\)"),
        ((1, 1), r"optimizer is adam but its options union has tag 1 \(expected 2\)"),
        ((0, 1, 7), r"unknown loss function value 7; expected 0..2"),
        ((0, 1, 2, 9), r"unknown loss reduction value 9; expected 0..1"),
    ],
)
def test_bad_enum_values(args: tuple[int, ...], message: str) -> None:
    with pytest.raises(CircleFormatError, match=message):
        decode_traininfo(_hand_built(*args))


def test_traininfo_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="unknown optimizer 'rmsprop'; accepted: sgd, adam"):
        TrainInfo(optimizer="rmsprop")
    with pytest.raises(ValueError, match="unknown loss 'mae'"):
        TrainInfo(loss="mae")
    with pytest.raises(ValueError, match="unknown reduction 'mean'"):
        TrainInfo(reduction="mean")
    with pytest.raises(ValueError, match="trainable_ops must be operator indices >= 0"):
        TrainInfo(trainable_ops=(-1,))


# ----------------------------------------------------------------------------- JSON

CIRCLE_PLUS_GEN_EXAMPLE = {
    "optimizer": {
        "type": "adam",
        "args": {"learningRate": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-07},
    },
    "loss": {
        "type": "categorical crossentropy",
        "args": {"fromLogits": True, "reduction": "sum over batch size"},
    },
    "batchSize": 32,
    "fineTuning": 0,
}


def test_json_example_of_circle_plus_gen() -> None:
    info = traininfo_from_json(CIRCLE_PLUS_GEN_EXAMPLE, num_operators=6)
    assert info == TrainInfo(
        optimizer="adam",
        learning_rate=0.01,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-7,
        loss="categorical_crossentropy",
        from_logits=True,
        reduction="sum_over_batch_size",
        batch_size=32,
        trainable_ops=(0, 1, 2, 3, 4, 5),
    )
    assert traininfo_to_json(info, 6) == CIRCLE_PLUS_GEN_EXAMPLE


def test_json_aliases_and_defaults() -> None:
    obj = {
        "optimizer": {"type": "SGD"},
        "loss": {"type": "mse", "reduction": "sum"},
        "batchSize": 4,
        "fineTuning": 2,
    }
    info = traininfo_from_json(obj, num_operators=6)
    assert (info.optimizer, info.learning_rate) == ("sgd", 0.01)
    assert (info.loss, info.reduction, info.trainable_ops) == ("mean_squared_error", "sum", (4, 5))
    snake = {
        "optimizer": {"type": "adam", "args": {"learning_rate": 0.1, "beta_1": 0.5}},
        "loss": {"type": "cce", "args": {"from_logits": True}},
        "batchSize": 1,
        "fineTuning": -1,
        "epochs": 9,
    }
    info = traininfo_from_json(snake, num_operators=6)
    assert (info.learning_rate, info.beta_1, info.beta_2, info.epsilon) == (0.1, 0.5, 0.999, 1e-7)
    assert (info.from_logits, info.trainable_ops, info.epochs) == (True, (), 9)
    back = traininfo_to_json(info, 6)
    assert back["fineTuning"] == -1 and back["epochs"] == 9
    assert traininfo_from_json(back, 6) == info


def test_fine_tuning_value() -> None:
    assert fine_tuning_value((), 6) == -1
    assert fine_tuning_value(tuple(range(6)), 6) == 0
    assert fine_tuning_value((3, 4, 5), 6) == 3
    with pytest.raises(ValueError, match=r"trainable_ops \[0, 2, 5\] cannot be written as fineT"):
        fine_tuning_value((0, 2, 5), 6)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"fineFuning": 0}, r"unknown training JSON key\(s\) 'fineFuning'; accepted: optimizer"),
        ({"optimizer": {"type": "rmsprop"}}, r"unknown optimizer.type 'rmsprop'; accepted: 'sgd'"),
        ({"loss": {"type": "hinge"}}, r"unknown loss.type 'hinge'; accepted: 'sparse categ"),
        (
            {"loss": {"type": "mse", "args": {"reduction": "mean"}}},
            r"unknown loss reduction 'mean'; accepted: 'sum over batch size'",
        ),
        (
            {"optimizer": {"type": "sgd", "args": {"beta1": 0.9}}},
            r"unknown sgd optimizer argument 'beta1'; accepted: learningRate, learning_rate",
        ),
        (
            {"loss": {"type": "mse", "args": {"fromLogits": True}}},
            r"unknown mean squared error loss argument 'fromLogits'; accepted: reduction",
        ),
        ({"batchSize": 0}, r"batchSize must be >= 1, got 0"),
        ({"batchSize": "8"}, r"batchSize must be an integer, got '8'"),
        ({"fineTuning": 7}, r"fineTuning 7 is invalid for a model with 6 operators"),
        (
            {
                "loss": {
                    "type": "mse",
                    "args": {"reduction": "sum"},
                    "reduction": "sumoverbatchsize",
                }
            },
            r"two different loss reductions",
        ),
        ({"optimizer": {"type": "sgd", "args": {"learningRate": "x"}}}, r"learningRate must be"),
        ({"optimizer": {"type": "sgd", "args": {"learningRate": -1}}},
         r"learningRate must be a finite number >= 0, got -1"),
        ({"epochs": -3}, r"epochs must be >= 0 \(0: not set\), got -3"),
    ],
)
def test_json_errors(change: dict, message: str) -> None:
    obj = {**CIRCLE_PLUS_GEN_EXAMPLE, **change}
    with pytest.raises(ValueError, match=message):
        traininfo_from_json(obj, num_operators=6)


def test_json_missing_key() -> None:
    obj = dict(CIRCLE_PLUS_GEN_EXAMPLE)
    del obj["batchSize"]
    with pytest.raises(ValueError, match="lacks the required key 'batchSize'"):
        traininfo_from_json(obj, 6)


# ----------------------------------------------------------------------------- onert


def _with_traininfo(src: Path, info: TrainInfo, dst: Path) -> None:
    """Copy a circle model, adding a CIRCLE_TRAINING metadata entry holding ``info``."""
    from circle_schema.v0_10.circle.Buffer import BufferT
    from circle_schema.v0_10.circle.Metadata import MetadataT
    from circle_schema.v0_10.circle.Model import ModelT

    model = ModelT.InitFromPackedBuf(src.read_bytes(), 0)
    buffer = BufferT()
    buffer.data = np.frombuffer(encode_traininfo(info), np.uint8)
    model.buffers.append(buffer)
    meta = MetadataT()
    meta.name = METADATA_NAME.encode()
    meta.buffer = len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), meta]
    b = flatbuffers.Builder(0)
    b.Finish(model.Pack(b), file_identifier=b"CIR0")
    dst.write_bytes(b.Output())


@pytest.mark.parametrize(
    "info, trainable",
    [
        (ADAM, 3),  # the last three of six ops
        (TrainInfo(learning_rate=0.5, batch_size=3, trainable_ops=tuple(range(6))), -1),
        (TrainInfo(learning_rate=0.25, reduction="sum", batch_size=2), 0),
    ],
)
def test_onert_reads_our_traininfo(tmp_path: Path, info: TrainInfo, trainable: int) -> None:
    from onert.native import libnnfw_api_pybind as lib
    path = tmp_path / "plus.circle"
    _with_traininfo(_shared_model(MNIST), info, path)
    got = lib.experimental.nnfw_session(str(path), "train").train_get_traininfo()
    assert got.learning_rate == pytest.approx(info.learning_rate, rel=1e-7)
    assert got.batch_size == info.batch_size
    assert got.opt.name == info.optimizer.upper()
    assert got.loss_info.loss.name == info.loss.upper()
    assert got.loss_info.reduction_type.name == info.reduction.upper()
    # onert counts trainable ops as onert_train's flag does: -1 all, 0 none, N the last N
    assert got.num_of_trainable_ops == trainable


def test_onert_rejects_what_it_cannot_express(tmp_path: Path) -> None:
    from onert.native import libnnfw_api_pybind as lib
    path = tmp_path / "plus.circle"
    _with_traininfo(_shared_model(MNIST), TrainInfo(trainable_ops=(0, 2, 5)), path)
    session = lib.experimental.nnfw_session(str(path), "train")
    with pytest.raises(Exception, match="INVALID_STATE"):  # not a tail of the operators
        session.train_get_traininfo()
    _with_traininfo(_shared_model(MNIST), TrainInfo(loss="sparse_categorical_crossentropy"), path)
    with pytest.raises(Exception, match="NNFW_STATUS_ERROR"):  # onert has no sparse CCE
        lib.experimental.nnfw_session(str(path), "train")


def test_training_refuses_negative_circleplus_epochs() -> None:
    """A file another tool wrote with epochs < 0: refused when training (before: the
    default 5 epochs, silently)."""
    import circle_jax as cj
    from circle_jax.errors import ConfigError
    from circle_jax.examples import branching_cnn
    from circle_jax.formats.reader import read_model
    from circle_jax.formats.traininfo import encode_traininfo
    from circle_jax.formats.writer import export_model
    from circle_jax.train import TrainConfig

    m = read_model(branching_cnn().to_bytes("circle"))
    info = TrainInfo(epochs=-3, batch_size=4, trainable_ops=tuple(range(len(m.main.operators))))
    model = cj.load(export_model(m, metadata={"CIRCLE_TRAINING": encode_traininfo(info)}))
    with pytest.raises(ConfigError, match="circle\\+ metadata says -3 epochs; expected >= 0"):
        TrainConfig().with_defaults(model)
