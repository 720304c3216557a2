"""The batch rule (`circle_jax.graph.batching`): which graphs run a batch of N as one batched graph
and which map their batch-1 graph over the samples, on builder-made graphs and on the shared
models the issue named (a batch of N must always give what N single-sample runs give)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.examples import branching_cnn
from tests.compile_events import COMPILE, compile_events
from tests.conformance import run_litert
from tests.paths import shared_model


def _one_op(key: str, x_shape: tuple, consts: list, options: dict | None = None,
            first: bool = True) -> cj.Model:
    """x -> KEY(x, *consts) (x first unless ``first`` is False; CONCATENATION joins x with
    itself) -> output."""
    b = Builder()
    x = b.input("x", x_shape)
    cs = [b.constant(f"c{i}", c) for i, c in enumerate(consts)]
    ins = [x, x] if key == "CONCATENATION" else [x, *cs] if first else [*cs, x]
    b.output(b.op(key, ins, options or {}))
    return cj.load(b.to_bytes("circle"))


I32 = np.int32
FOLLOW = [  # operators whose options and constants leave dimension 0 alone
    ("RESHAPE", (1, 2, 3), [np.array([1, -1], I32)], None),
    ("RESHAPE", (1, 2, 3), [np.array([-1, 3, 2], I32)], None),
    ("TRANSPOSE", (1, 2, 3), [np.array([0, 2, 1], I32)], None),
    ("STRIDED_SLICE", (1, 4, 3), [np.array([0, 1], I32), np.array([1, 3], I32),
                                  np.array([1, 1], I32)], {"end_mask": 1}),
    ("SLICE", (1, 4, 3), [np.array([0, 1, 0], I32), np.array([-1, 2, 3], I32)], None),
    ("MEAN", (1, 4, 3), [np.array([1, 2], I32)], {"keep_dims": True}),
    ("PAD", (1, 4, 3), [np.array([[0, 0], [1, 1], [0, 2]], I32)], None),
    ("CONCATENATION", (1, 4, 3), [], {"axis": -1}),
]
PIN = [  # ... and operators that pin it (the batch-1 graph is mapped over the samples)
    ("RESHAPE", (1, 2, 3), [np.array([2, 3], I32)], None, "new shape"),
    ("TRANSPOSE", (1, 2, 3), [np.array([1, 0, 2], I32)], None, "moves dimension 0"),
    ("STRIDED_SLICE", (1, 4, 3), [np.array([0, 1], I32), np.array([1, 3], I32),
                                  np.array([1, 1], I32)], None, "pin dimension 0"),
    ("SLICE", (1, 4, 3), [np.array([0, 1, 0], I32), np.array([1, 2, 3], I32)], None,
     "pin dimension 0"),
    ("MEAN", (1, 4, 3), [np.array([0, 1], I32)], {"keep_dims": True}, "dimension 0"),
    ("TILE", (1, 4, 3), [np.array([2, 1, 1], I32)], None, "tiles dimension 0"),
    ("CONCATENATION", (1, 4, 3), [], {"axis": 0}, "dimension 0"),
    ("BROADCAST_TO", (1, 4, 3), [np.array([1, 4, 3], I32)], None, "not known"),
    ("SOFTMAX", (1,), [], {"beta": 1.0}, "dimension 0"),
]


def _check_per_sample(model: cj.Model, n: int = 3) -> None:
    x = np.random.default_rng(0).standard_normal((n, *model.inputs[0].shape[1:]))
    x = x.astype(np.float32)
    for apply in (model.apply, jax.jit(model.apply)):
        got = apply(model.params, *([x] * len(model.inputs)))[0]
        want = np.concatenate([model(*([x[i:i + 1]] * len(model.inputs)))[0]
                               for i in range(n)])
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("key, shape, consts, options", FOLLOW)
def test_operators_that_follow_the_batch_run_batched(key, shape, consts, options) -> None:
    model = _one_op(key, shape, consts, options)
    assert model.batch_blocker is None
    _check_per_sample(model)


@pytest.mark.parametrize("key, shape, consts, options, why", PIN)
def test_operators_that_pin_dimension_0_map_the_batch_1_graph(key, shape, consts, options,
                                                              why) -> None:
    model = _one_op(key, shape, consts, options)
    assert model.batch_blocker is not None and why in model.batch_blocker
    assert f"operator 0 ({key})" in model.batch_blocker
    _check_per_sample(model)


def test_a_declared_batch_other_than_1_that_is_pinned_is_refused_in_one_line() -> None:
    model = _one_op("RESHAPE", (2, 3), [np.array([6], I32)])
    assert model(np.ones((2, 3), np.float32))[0].shape == (6,)
    with pytest.raises(cj.DataError, match=r"^inputs of shapes \[\[4, 3\]\]: the model runs "
                       r"only at its declared batch \(\[\[2, 3\]\]\), because operator 0 "
                       r"\(RESHAPE\)[^\n]*$"):
        model(np.ones((4, 3), np.float32))


@pytest.fixture(scope="module")
def hand() -> cj.Model:
    return cj.load(shared_model("mediapipe_hand_recrop_fp32.tflite"))


def test_hand_recrop_maps_its_batch_1_graph_and_matches_litert_per_sample(hand) -> None:
    """Its operator 49 (STRIDED_SLICE channel_padding_3) keeps batch 1 in begin/end: mapped.
    LiteRT tolerance as tests/test_sweep.py (rtol 1e-4, atol 1e-4 x output scale)."""
    assert hand.batch_blocker.startswith("operator 49 (STRIDED_SLICE)")
    x = np.random.default_rng(1).uniform(-1, 1, (3, 256, 256, 3)).astype(np.float32)
    got = np.asarray(jax.jit(hand.apply)(hand.params, x)[0])
    with open(shared_model("mediapipe_hand_recrop_fp32.tflite"), "rb") as f:
        tflite = f.read()
    for i in range(3):
        want = run_litert(tflite, [x[i:i + 1]])[0]
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(got[i:i + 1], want, rtol=1e-4, atol=1e-4 * scale)


def test_common_models_keep_the_batched_graph() -> None:
    """The fast path: these follow the batch, so a batch runs as one batched graph."""
    for name in ("mobilenet_v1_0.25_128_float.tflite", "mlperftiny_resnet8_cifar10_float.tflite",
                 "mediapipe_face_detection_short_range_fp16w.tflite"):
        assert cj.load(shared_model(name)).batch_blocker is None, name
    assert cj.load(branching_cnn().to_bytes("circle")).batch_blocker is None


def test_face_detector_runs_at_batch_8() -> None:
    """Its RESHAPEs to [1, -1, 16] keep each sample's 896 x 16 at batch 8 (they made one
    sample of 7168 x 16 before). Its training at batch 4, and its batch rows against single
    samples and LiteRT: `tests/test_sweep.py`."""
    model = cj.load(shared_model("mediapipe_face_detection_short_range_fp16w.tflite"))
    x = np.random.default_rng(2).uniform(-1, 1, (8, 128, 128, 3)).astype(np.float32)
    assert [o.shape for o in jax.eval_shape(model.apply, model.params, x)] == [
        (8, 896, 16), (8, 896, 1)]


def test_apply_outside_a_trace_compiles_once_per_input_shape() -> None:
    """`Model.apply` runs compiled: one program for a new shape (at most 2 compiles;
    operator by operator the example compiles 19 primitives),
    a repeated shape compiles nothing more, another shape compiles again, and the values
    are the operator-by-operator run's."""
    model = cj.load(branching_cnn().to_bytes("circle"))
    x = np.random.default_rng(4).uniform(0, 1, (5, 8, 8, 1)).astype(np.float32)

    def compiles() -> int:
        return sum(e.name == COMPILE for e in events)

    with compile_events() as events:
        first = model(x[:2])
        assert 1 <= compiles() <= 2
        before = compiles()
        again = model(x[2:4])
        assert compiles() == before
        model(x)
        assert compiles() > before
    with jax.disable_jit():
        eager = model(x[:2])
    for a, b in zip(first, eager):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert again[0].shape == first[0].shape


def test_inputs_the_graph_cannot_take_are_named_before_any_operator() -> None:
    """apply (eager and traced) names the input, the shape or dtype given and the one
    expected: not an operator's complaint about the model file (CircleFormatError), and
    never real data rounded into token ids."""
    from circle_jax.errors import DataError

    model = cj.load(branching_cnn().to_bytes())
    x = np.zeros((2, 8, 8, 1), np.float32)
    for fn in (model.apply, jax.jit(model.apply)):
        with pytest.raises(DataError, match=r"input 'image': .* \[2, 8, 8\], .* \[N, 8, 8, 1\]"):
            fn(model.params, x[..., 0])
        with pytest.raises(DataError, match="the model has 1 inputs, got 2 arrays"):
            fn(model.params, x, x)
    text = cj.load(shared_model("tflite_support_movie_review_text.tflite"))  # GATHER of ids
    with pytest.raises(DataError, match="float32 data, the model expects int32"):
        text(np.zeros((1, 256), np.float32))
    assert text(np.zeros((3, 256), np.int32))[0].shape == (3, 2)


def test_a_float_shape_constant_holding_infinity_is_refused_in_one_line() -> None:
    # the fuzz reproducer: a mutated RESHAPE shape constant holding infinity escaped the
    # batching analysis as an OverflowError
    b = cj.Builder()
    x = b.input("x", (1, 4))
    s = b.constant("shape", np.array([np.inf, 4], np.float32))
    b.output(b.op("RESHAPE", [x, s], shapes=[(1, 4)]))
    with pytest.raises(cj.CircleFormatError, match="reshape shape must hold integers"):
        m = cj.load(b.to_bytes("circle"))
        m.apply(m.params, np.zeros((3, 4), np.float32))
