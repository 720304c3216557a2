"""circle-jax: Circle and TFLite models as pure, differentiable JAX functions."""

from __future__ import annotations

from . import io, losses, optim
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
from .train import FitResult, History, TrainConfig, Trainer, TrainState, fit, select_trainable

__version__ = "0.1.0"

__all__ = [
    "Builder", "CircleFormatError", "CircleJaxError", "DataError", "FitResult", "GraphBuilder",
    "History", "Model", "TensorSpec", "TrainConfig", "TrainState", "Trainer", "TrainingError",
    "UnsupportedOperatorError", "fit", "io", "load", "losses", "lower", "optim", "read_model",
    "select_trainable", "supported_operators", "unsupported_operators",
]
