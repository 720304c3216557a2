"""unroll_lstms: a plain UNIDIRECTIONAL_SEQUENCE_LSTM as its time steps' builtin operators,
on the real TFLM MNIST LSTM (28 steps of 20 cells, cell clip 10)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.passes import unroll_lstms
from circle_jax.passes.edit import replace_subgraph
from circle_jax.passes.recurrent import LSTM
from tests.conformance import ATOL, RTOL, run_litert
from tests.paths import shared_model

PATH = shared_model("tflm_mnist_lstm_float.tflite")


@pytest.mark.slow
def test_the_unrolled_lstm_computes_what_the_layer_does() -> None:
    """No LSTM left; circle-jax's forward of the unrolled graph equals the layer's at the
    declared batch and at batch 3 (1e-6: the layer computes every step's input projection
    in one matmul), and LiteRT's run of the written file equals circle-jax's."""
    model = read_model(PATH)
    flat = unroll_lstms(model)
    types = [op.type for op in flat.main.operators]
    assert LSTM not in types and types.count("FULLY_CONNECTED") == 8 * 28 - 4 + 1
    assert flat.passes[-1].changes == {"operator 0": "28 time steps"}
    layer, unrolled = cj.load(PATH), cj.Model(flat)
    for batch in (1, 3):
        x = np.random.default_rng(batch).uniform(-1, 1, (batch, 28, 28)).astype(np.float32)
        mine = np.asarray(unrolled.apply(unrolled.params, x)[0])
        np.testing.assert_allclose(mine, layer.apply(layer.params, x)[0], rtol=0, atol=1e-6)
    (theirs,) = run_litert(write_model(flat, "tflite"), [x[:1]])
    np.testing.assert_allclose(unrolled(x[:1])[0], theirs, rtol=RTOL, atol=ATOL)


def test_an_lstm_of_another_form_stays() -> None:
    """Without an input gate (CIFG: input 1 absent) the layer is not the plain form."""
    model = read_model(PATH)
    ops = list(model.main.operators)
    k = [op.type for op in ops].index(LSTM)
    ops[k] = replace(ops[k], inputs=(ops[k].inputs[0], -1, *ops[k].inputs[2:]))
    cifg = replace_subgraph(model, 0, operators=tuple(ops))
    assert unroll_lstms(cifg).main.operators == cifg.main.operators
