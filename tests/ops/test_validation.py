"""Whole-graph validation at load: malformed graphs are refused by ``load`` in one line
naming the subgraph, operator or tensor and what was expected, before anything is traced;
errors an operator raises while traced become one CircleFormatError line naming it."""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import unpack
from circle_jax.formats.writer import pack
from tests.conformance import refused_at_load


def _mlp() -> bytes:
    b = cj.Builder()
    x = b.input("x", (1, 4))
    w = b.constant("w", np.ones((3, 4), np.float32))
    h = b.op("FULLY_CONNECTED", [x, w, -1], {}, shapes=[(1, 3)])
    y = b.op("RELU", [h], shapes=[(1, 3)])
    b.output(y)
    return b.to_bytes("circle")


def _edit(edit) -> bytes:
    m = unpack(_mlp())
    edit(m)
    return pack(m, "circle")


def test_the_valid_model_loads():
    m = cj.load(_mlp())
    assert m(np.ones((1, 4), np.float32))[0].shape == (1, 3)


def test_too_many_inputs_for_the_kernel():
    def edit(m):
        m.subgraphs[0].operators[1].inputs = [2, 2, 2]
    assert "has 3 inputs; RELU takes 1" in refused_at_load(_edit(edit))


def test_operators_out_of_execution_order():
    def edit(m):
        ops = m.subgraphs[0].operators
        ops[0], ops[1] = ops[1], ops[0]
    assert "before any operator computes it" in refused_at_load(_edit(edit))


def test_shape_budget_and_negative_dims():
    def huge(m):
        m.subgraphs[0].tensors[2].shape = [67108865, 0, 16, 32]
    assert "over the budget" in refused_at_load(_edit(huge))

    def negative(m):
        m.subgraphs[0].tensors[2].shape = [1, -7]
    assert "negative dimension" in refused_at_load(_edit(negative))

    def deep(m):
        m.subgraphs[0].tensors[2].shape = [1] * 131
    msg = refused_at_load(_edit(deep))
    assert "rank 131" in msg and len(msg) < 250


def test_budget_is_settable():
    with pytest.raises(cj.CircleFormatError, match="budget of 8 elements"):
        cj.load(_mlp(), max_elements=8)


def test_geometry_options_are_bounded():
    b = cj.Builder()
    x = b.input("x", (1, 8, 8, 1))
    w = b.constant("w", np.ones((1, 3, 3, 1), np.float32))
    y = b.op("CONV_2D", [x, w, -1], {"padding": 1, "stride_h": 1, "stride_w": 1,
                                     "dilation_h_factor": 1, "dilation_w_factor": 1},
             shapes=[(1, 6, 6, 1)])
    b.output(y)
    m = unpack(b.to_bytes("circle"))
    m.subgraphs[0].operators[0].builtinOptions.dilationHFactor = 16777216
    assert "dilation_h_factor 16777216 is out of range" in refused_at_load(pack(m, "circle"))


def test_trace_errors_are_one_format_error_line():
    """A RESHAPE whose constant new shape cannot hold its input: the file loads (its declared
    shapes are not checked against the kernel's), and the first apply names the operator."""
    b = cj.Builder()
    x = b.input("x", (1, 4))
    s = b.constant("s", np.array([3, 5], np.int32))
    b.output(b.op("RESHAPE", [x, s], {"new_shape": [3, 5]}, shapes=[(3, 5)]))
    m = unpack(b.to_bytes("circle"))
    model = cj.load(pack(m, "circle"))
    with pytest.raises(cj.CircleFormatError) as e:
        model(np.ones((1, 4), np.float32))
    msg = str(e.value)
    assert msg.startswith("operator 0 (RESHAPE) of subgraph 0: ") and "\n" not in msg, msg


def test_many_refusals_make_one_bounded_line():
    def edit(m):
        m.subgraphs[0].operators[1].inputs = [2, 2, 2]
        m.subgraphs[0].operators += [m.subgraphs[0].operators[1]] * 100
    msg = refused_at_load(_edit(edit))
    assert msg.startswith("10") and "; and " in msg and "more" in msg and len(msg) < 1200, msg
