"""unroll_static_whiles: a WHILE of a static trip count as copies of its body, on Keras's
converted LSTM (a WHILE of 5 steps whose body holds the cell's weights), and what the
exported training step makes of it."""

from __future__ import annotations

import numpy as np

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.ondevice import export_training_graph, exportable
from circle_jax.passes import keep_reachable, unroll_static_whiles
from tests import model_zoo
from tests.conformance import ATOL, RTOL, run_litert


def test_the_unrolled_keras_lstm_computes_what_the_loop_does() -> None:
    """No WHILE left, 5 copies of the body's cell; the body's weights are single tensors of
    subgraph 0 under their own names (each one param); circle-jax's forward equals the loop's
    bit for bit, and LiteRT's run of the written file equals circle-jax's."""
    source = model_zoo.source("keras:lstm.tflite")
    model = read_model(source)
    flat = keep_reachable(unroll_static_whiles(model))
    types = [op.type for op in flat.main.operators]
    assert "WHILE" not in types and len(flat.subgraphs) == 1
    assert types.count("SPLIT") == 5 and flat.passes[-2].changes == {"operator 1": "5 iterations"}
    loop, unrolled = cj.load(source), cj.Model(flat)
    assert set(loop.trainable_params) <= set(unrolled.param_keys)
    assert all(unrolled.param_keys[n][0] == 0 for n in loop.trainable_params)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 5, 3)).astype(np.float32)
    mine = np.asarray(unrolled(x)[0])
    np.testing.assert_array_equal(mine, np.asarray(loop(x)[0]))
    (theirs,) = run_litert(write_model(flat, "tflite"), [x])
    np.testing.assert_allclose(mine, theirs, rtol=RTOL, atol=ATOL)


def test_a_loop_of_a_run_time_trip_count_stays_and_its_weight_is_refused() -> None:
    """ONE's WHILE test model counts to its input: the loop stays, and exporting its
    body's weight is refused in one line."""
    source = model_zoo.source("one_vscode_while_000.circle")
    model = read_model(source)
    assert unroll_static_whiles(model).main.operators == model.main.operators
    try:
        export_training_graph(cj.load(source), batch_size=1, trainable=-1)
    except cj.ConfigError as e:
        assert "WHILE #0 reads" in str(e) and "trip count is not static" in str(e) \
            and "\n" not in str(e)
    else:
        raise AssertionError("the export was not refused")


def test_the_trainable_set_is_chosen_on_the_files_operators() -> None:
    """``trainable=2`` (onert's num_of_trainable_ops) counts the loaded file's operators (the
    dense head and its SOFTMAX), not the unrolled ones; ``-1`` trains what the file's
    trainable policy trains: the cell's weights and the head, not the loop's initial
    state (a constant the unrolled graph reads directly)."""
    model = cj.load(model_zoo.source("keras:lstm.tflite"))
    assert len(exportable(model).operators) > len(model.operators)
    head = export_training_graph(model, loss="mse", optimizer="sgd", learning_rate=0.1,
                                 batch_size=1, trainable=2)
    assert set(head.state) == {"functional_6_1/dense_8_1/MatMul1"}
    every = export_training_graph(model, loss="mse", optimizer="sgd", learning_rate=0.1,
                                  batch_size=1, trainable=-1)
    assert set(every.state) == set(model.trainable_params)
