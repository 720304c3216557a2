"""circle-jax: Circle and TFLite models as pure, differentiable JAX functions."""

from __future__ import annotations


from .build import Builder, GraphBuilder
from .errors import (
    CircleFormatError,
    CircleJaxError,
    DataError,
    TrainingError,
    UnsupportedOperatorError,
)
from .io.reader import read_model
from .lower import lower, unsupported_operators
from .model import Model, TensorSpec, load
from .ops.registry import supported_operators

__version__ = "0.1.0"

__all__ = [
    "Builder", "CircleFormatError", "CircleJaxError", "DataError", "GraphBuilder", "Model",
    "TensorSpec", "TrainingError", "UnsupportedOperatorError", "load", "lower", "read_model",
    "supported_operators", "unsupported_operators",
]
