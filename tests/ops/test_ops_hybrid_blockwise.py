"""The blockwise hybrid FULLY_CONNECTED (float input, int4 weights with one float16 scale per
block of input channels, as ai-edge-quantizer's ``dynamic_wi4b32`` recipe writes them)
computes as LiteRT's blockwise kernel: equal to LiteRT's output (``array_equal``) on random
weights, scales, block sizes, inputs of varied scale and offset, with and without bias, 2-d
and 3-d inputs. LiteRT's two faults with this kernel are pinned (each check fails once
LiteRT is fixed) and circle-jax computes the file's meaning there: the fused activation,
which LiteRT's kernel drops, and the products of a layer with fewer than 4 outputs, which
LiteRT's kernel leaves out (its output is the bias). Gradients are the float operator's
(straight through the on-the-fly input quantization)."""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import write_model
from circle_jax.graph import ir
from tests.conformance import run_litert


def blockwise_fc(rng: np.random.Generator, xshape: tuple, outputs: int, block: int = 32,
                 bias: bool = True, activation: int = 0, weights: np.ndarray | None = None,
                 scales: np.ndarray | None = None) -> tuple[bytes, dict]:
    """A .tflite FULLY_CONNECTED of float input ``xshape`` with blockwise int4 weights
    (random unless given) and float16 block scales; the Builder writes int8 weights, the
    IR then makes them int4 blockwise and circle-jax's writer packs them."""
    depth = xshape[-1]
    w = rng.integers(-8, 8, (outputs, depth)).astype(np.int8) if weights is None else weights
    s = rng.uniform(1e-3, 0.1, (outputs, depth // block)).astype(np.float16) \
        if scales is None else scales
    b = Builder()
    x = b.input("x", xshape)
    si, wi = b.constant("scales", s), b.constant("w", w)
    inputs = [x, wi, b.constant("b", rng.normal(size=outputs).astype(np.float32))
              if bias else -1]
    oshape = (*xshape[:-1], outputs) if len(xshape) > 2 else (xshape[0], outputs)
    b.output(b.op("FULLY_CONNECTED", inputs, {"fused_activation_function": activation,
                                              "keep_num_dims": len(xshape) > 2},
                  shapes=[oshape]))
    model = read_model(b.to_bytes("tflite"))
    tensors = list(model.main.tensors)
    q = ir.Quantization((), (), 0, ir.Blockwise(si, -1, block))
    tensors[wi] = replace(tensors[wi], dtype="int4", quantization=q)
    model = replace(model, subgraphs=(replace(model.main, tensors=tuple(tensors)),))
    return write_model(model, "tflite"), {"w": w, "scales": s}


def _inputs(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    return (rng.normal(size=shape) * rng.uniform(0.1, 5) + rng.uniform(-2, 2)).astype(
        np.float32)


def _ours(data: bytes, x: np.ndarray) -> np.ndarray:
    m = cj.load(data)
    return np.asarray(jax.jit(m.apply)(m.params, x)[0])


def test_blockwise_fully_connected_equals_litert() -> None:
    rng = np.random.default_rng(5)
    for trial in range(12):
        block = (16, 32, 64)[trial % 3]
        depth = block * int(rng.integers(1, 7))
        xshape = (int(rng.integers(1, 5)), depth) if trial % 4 else (2, 3, depth)
        data, _ = blockwise_fc(rng, xshape, int(rng.integers(4, 13)), block,
                               bias=trial % 5 != 1)
        m = cj.load(data)
        assert m.params["w"].dtype == np.float32
        forward = jax.jit(m.apply)
        for k in range(3):
            x = _inputs(rng, xshape)
            if k == 2:
                x.reshape(-1, depth)[0] = 0  # a row of zeros
            np.testing.assert_array_equal(np.asarray(forward(m.params, x)[0]),
                                          run_litert(data, [x])[0])


def test_litert_drops_the_fused_activation_circle_jax_applies_it() -> None:
    rng = np.random.default_rng(1)
    data, parts = blockwise_fc(rng, (3, 64), 8, activation=1)  # RELU
    plain, _ = blockwise_fc(np.random.default_rng(1), (3, 64), 8)
    x = _inputs(rng, (3, 64))
    litert = run_litert(data, [x])[0]
    assert (litert < 0).any(), "LiteRT's blockwise kernel now applies the fused activation"
    np.testing.assert_array_equal(litert, run_litert(plain, [x])[0])
    np.testing.assert_array_equal(_ours(data, x), np.maximum(litert, 0))


@pytest.mark.parametrize("outputs", [1, 2, 3])
def test_litert_leaves_out_the_products_below_4_outputs(outputs: int) -> None:
    """LiteRT's output is the bias alone (zeros without one); circle-jax's is the layer's,
    checked against LiteRT on the same layer with a fourth output added (each output is
    computed on its own)."""
    rng = np.random.default_rng(outputs)
    w = rng.integers(-8, 8, (4, 64)).astype(np.int8)
    s = rng.uniform(1e-3, 0.1, (4, 2)).astype(np.float16)
    small, _ = blockwise_fc(rng, (2, 64), outputs, bias=False, weights=w[:outputs],
                            scales=s[:outputs])
    four, _ = blockwise_fc(rng, (2, 64), 4, bias=False, weights=w, scales=s)
    x = _inputs(rng, (2, 64))
    assert not run_litert(small, [x])[0].any(), "LiteRT now computes layers below 4 outputs"
    np.testing.assert_array_equal(_ours(small, x), run_litert(four, [x])[0][:, :outputs])


def test_blockwise_gradients_are_the_float_operator_s() -> None:
    rng = np.random.default_rng(2)
    data, _ = blockwise_fc(rng, (4, 96), 6)
    hybrid, exact = cj.load(data), cj.load(data, dequantize=True)
    x = _inputs(rng, (4, 96))

    def loss(m: cj.Model):
        return lambda p, x: (m.apply(p, x)[0] ** 2).sum()

    g_hybrid = jax.grad(loss(hybrid), argnums=(0, 1))(hybrid.params, x)
    g_float = jax.grad(loss(exact), argnums=(0, 1))(exact.params, x)
    # the same float function at outputs that differ by the input quantization: the
    # gradients differ by as much (1e-2 relative covers it, measured 3e-3)
    for a, b in zip(jax.tree.leaves(g_hybrid), jax.tree.leaves(g_float)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-2,
                                   atol=1e-2 * float(np.abs(b).max()))
