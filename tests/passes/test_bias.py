"""The bias pass (`circle_jax.passes.bias`): a zero bias for each weighted operator that
has none, recorded; its output exports and runs in LiteRT and onert (`test_pipeline`)."""

from __future__ import annotations

import numpy as np

from circle_jax import passes
from circle_jax.formats.reader import read_model
from circle_jax.graph import ir
from tests.passes.test_pipeline import MNIST_CIRCLE
from tests.paths import shared_model


def test_add_missing_biases_is_pure_and_records_what_it_changed() -> None:
    before = read_model(shared_model(MNIST_CIRCLE))
    after = passes.add_missing_biases(before)
    assert before.passes == () and len(before.main.tensors) + 2 == len(after.main.tensors)
    (rec,) = after.passes
    assert rec.name == "add_missing_biases"
    assert rec.changes == {"arith.constant1/bias": "zero bias of FULLY_CONNECTED #3",
                           "arith.constant/bias": "zero bias of FULLY_CONNECTED #4"}
    for op in (after.main.operators[3], after.main.operators[4]):
        bias = after.main.tensors[op.inputs[2]]
        assert bias.origin is None and bias.buffer == ir.NEW_BUFFER
        assert not np.any(bias.data) and bias.shape == (after.main.tensors[op.outputs[0]]
                                                         .shape[-1],)
