"""The bundled example: a small branching CNN and the 8x8 digits it trains on.

The CNN is built with circle-jax's own builder. Its first convolution's output feeds both
a second Conv2D and an Add (the branching case whose gradient must be the sum of both
paths), so it exercises exactly the bug class runtimes have had to fix by hand.
"""

from __future__ import annotations

import os

import numpy as np

from ..build import Builder

_DATA = os.path.join(os.path.dirname(__file__), "digits.npz")


def digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 handwritten digits (UCI ML, as shipped by scikit-learn), no download.

    Returns images as float32 [N, 8, 8, 1] scaled to [0, 1] and one-hot float32 labels
    [N, 10], in a fixed seeded shuffled order (so any tail split is class-balanced).
    """
    with np.load(_DATA) as d:
        images, labels = d["images"], d["labels"]
    order = np.random.default_rng(0).permutation(len(labels))
    x = (images[order].astype(np.float32) / 16.0)[..., None]
    y = np.eye(10, dtype=np.float32)[labels[order]]
    return x, y


def branching_cnn(channels: int = 8, classes: int = 10, seed: int = 0) -> Builder:
    """Conv3x3+ReLU → t; Conv3x3(t) + t → ReLU → MaxPool 2x2 → Reshape → FC → Softmax.

    Input [1, 8, 8, 1] (batch 1, onert's convention: it trains at any batch size).
    Weights are He-initialised from ``seed``.
    """
    rng = np.random.default_rng(seed)

    def he(*shape: int, fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    c = channels
    b = Builder("circle-jax example: branching CNN for 8x8 digits")
    x = b.input("image", (1, 8, 8, 1))
    w1 = b.constant("conv1/filter", he(c, 3, 3, 1, fan_in=9))
    b1 = b.constant("conv1/bias", np.zeros(c, np.float32))
    t = b.op("CONV_2D", [x, w1, b1], {"padding": "SAME", "stride_w": 1, "stride_h": 1,
                                      "fused_activation_function": "RELU"},
             names=["conv1"])
    w2 = b.constant("conv2/filter", he(c, 3, 3, c, fan_in=9 * c))
    b2 = b.constant("conv2/bias", np.zeros(c, np.float32))
    u = b.op("CONV_2D", [t, w2, b2], {"padding": "SAME", "stride_w": 1, "stride_h": 1},
             names=["conv2"])
    v = b.op("ADD", [u, t], {"fused_activation_function": "RELU"}, names=["residual"])
    p = b.op("MAX_POOL_2D", [v], {"padding": "VALID", "stride_w": 2, "stride_h": 2,
                                  "filter_width": 2, "filter_height": 2}, names=["pool"])
    shape = b.constant("flatten/shape", np.array([1, 16 * c], np.int32))
    f = b.op("RESHAPE", [p, shape], names=["flatten"])
    w3 = b.constant("dense/weights", he(classes, 16 * c, fan_in=16 * c))
    b3 = b.constant("dense/bias", np.zeros(classes, np.float32))
    logits = b.op("FULLY_CONNECTED", [f, w3, b3], names=["logits"])
    probs = b.op("SOFTMAX", [logits], {"beta": 1.0}, names=["probabilities"])
    b.output(probs)
    return b
