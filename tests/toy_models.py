"""Small models and data the tests share: builder-made MLPs and CNNs (batch 1, as onert
requires) and toy data."""

from __future__ import annotations

import numpy as np

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.examples import branching_cnn, digits


def he(rng: np.random.Generator, *shape: int, fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def mlp() -> Builder:
    """[1, 16] -> FC 12 + ReLU -> FC 10 -> Softmax."""
    rng = np.random.default_rng(1)
    b = Builder("test MLP")
    x = b.input("x", (1, 16))
    h = b.op("FULLY_CONNECTED", [x, b.constant("fc1/w", he(rng, 12, 16, fan_in=16)),
                                 b.constant("fc1/b", np.full(12, 0.01, np.float32))],
             {"fused_activation_function": "RELU"}, names=["fc1"])
    z = b.op("FULLY_CONNECTED", [h, b.constant("fc2/w", he(rng, 10, 12, fan_in=12)),
                                 b.constant("fc2/b", np.zeros(10, np.float32))], names=["fc2"])
    b.output(b.op("SOFTMAX", [z], {"beta": 1.0}, names=["probs"]))
    return b


def cnn() -> Builder:
    """[1, 8, 8, 1] -> Conv 3x3x4 + ReLU -> AvgPool 2x2 -> Reshape [1, 64] -> FC 10 -> Softmax."""
    rng = np.random.default_rng(2)
    b = Builder("test CNN")
    x = b.input("x", (1, 8, 8, 1))
    c = b.op("CONV_2D", [x, b.constant("conv/w", he(rng, 4, 3, 3, 1, fan_in=9)),
                         b.constant("conv/b", np.full(4, 0.01, np.float32))],
             {"padding": "SAME", "stride_w": 1, "stride_h": 1,
              "fused_activation_function": "RELU"}, names=["conv"])
    p = b.op("AVERAGE_POOL_2D", [c], {"padding": "VALID", "stride_w": 2, "stride_h": 2,
                                      "filter_width": 2, "filter_height": 2}, names=["pool"])
    f = b.op("RESHAPE", [p, b.constant("flat/shape", np.array([1, 64], np.int32))],
             names=["flat"])
    z = b.op("FULLY_CONNECTED", [f, b.constant("fc/w", he(rng, 10, 64, fan_in=64)),
                                 b.constant("fc/b", np.zeros(10, np.float32))], names=["fc"])
    b.output(b.op("SOFTMAX", [z], {"beta": 1.0}, names=["probs"]))
    return b


def reshape_mlp(classes: int = 4, softmax: bool = True, seed: int = 0) -> cj.Model:
    """Input [1, 4, 4, 2] -> Reshape [1, 32] -> FC 8 + ReLU -> FC -> (Softmax).

    Batch 1 as onert requires; the Reshape's [1, 32] must follow the batch at training time.
    """
    rng = np.random.default_rng(seed)
    b = Builder("reshape MLP")
    x = b.input("x", (1, 4, 4, 2))
    f = b.op("RESHAPE", [x, b.constant("flat/shape", np.array([1, 32], np.int32))],
             names=["flat"])
    h = b.op("FULLY_CONNECTED", [f, b.constant("fc1/w", rng.normal(0, 0.3, (8, 32))
                                               .astype(np.float32)),
                                 b.constant("fc1/b", np.full(8, 0.05, np.float32))],
             {"fused_activation_function": "RELU"}, names=["fc1"])
    z = b.op("FULLY_CONNECTED", [h, b.constant("fc2/w", rng.normal(0, 0.3, (classes, 8))
                                               .astype(np.float32)),
                                 b.constant("fc2/b", np.zeros(classes, np.float32))],
             names=["fc2"])
    b.output(b.op("SOFTMAX", [z], {"beta": 1.0}, names=["probs"]) if softmax else z)
    return cj.load(b.to_bytes("circle"))


def toy_data(n: int, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 4, 4, 2)).astype(np.float32)
    y = np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]
    return x, y


def branching() -> cj.Model:
    return cj.load(branching_cnn(channels=4).to_bytes("circle"))


def digits16() -> tuple[np.ndarray, np.ndarray]:
    x, y = digits()
    return x[:16], y[:16]


def token_model(vocab: int = 11, width: int = 6, tokens: int = 5, seed: int = 5,
                numerics: str = "onert") -> cj.Model:
    """tokens int32 [1, T] -> GATHER (an embedding [V, E]) -> FC V (keep_num_dims) ->
    SOFTMAX: next-token probabilities [1, T, V], batch 1 as onert requires."""
    rng = np.random.default_rng(seed)
    b = Builder("token model")
    x = b.input("tokens", (1, tokens), "int32")
    e = b.op("GATHER", [b.constant("embedding", rng.normal(0, 0.5, (vocab, width))
                                   .astype(np.float32)), x], {"axis": 0}, names=["embed"])
    z = b.op("FULLY_CONNECTED", [e, b.constant("head/w", he(rng, vocab, width, fan_in=width)),
                                 b.constant("head/b", np.zeros(vocab, np.float32))],
             {"keep_num_dims": True}, names=["head"])
    b.output(b.op("SOFTMAX", [z], {"beta": 1.0}, names=["probs"]))
    return cj.load(b.to_bytes("circle"), numerics=numerics)
