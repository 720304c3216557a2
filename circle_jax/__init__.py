"""circle-jax: Circle and TFLite models as pure, differentiable JAX functions.

The package imports lazily (PEP 562): ``import circle_jax.formats`` reads and writes model
files without importing JAX, and ``circle_jax.load`` imports the JAX layers on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    CheckpointWarning,
    CircleFormatError,
    CircleJaxError,
    ConfigError,
    DataError,
    LossScaleWarning,
    TrainingError,
    UnsupportedOperatorError,
    VariableError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from . import checkpoints, formats, losses, optim, passes, signatures
    from .build import Builder, GraphBuilder
    from .formats.reader import read_model
    from .lowering.interpreter import unsupported_operators
    from .model import Model, TensorSpec, load
    from .ops.registry import supported_operators
    from .signatures import Interpreter
    from .train import (
        FitResult,
        History,
        ProgramCache,
        TrainConfig,
        Trainer,
        TrainState,
        fit,
        inline_cpu_dispatch,
        retain_host_memory,
        select_trainable,
    )

_SUBPACKAGES = ("checkpoints", "formats", "losses", "optim", "passes", "signatures")

# public name -> the module that defines it
_LAZY = {
    "Builder": ".build", "GraphBuilder": ".build",
    "read_model": ".formats.reader",
    "unsupported_operators": ".lowering.interpreter",
    "Model": ".model", "TensorSpec": ".model", "load": ".model",
    "supported_operators": ".ops.registry",
    "Interpreter": ".signatures",
    "FitResult": ".train", "History": ".train", "TrainConfig": ".train", "Trainer": ".train",
    "TrainState": ".train", "fit": ".train", "select_trainable": ".train",
    "ProgramCache": ".train", "inline_cpu_dispatch": ".train", "retain_host_memory": ".train",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name in _SUBPACKAGES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module 'circle_jax' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


__all__ = [
    "Builder", "CheckpointWarning", "CircleFormatError", "CircleJaxError", "ConfigError",
    "DataError", "FitResult", "GraphBuilder",
    "History", "Interpreter", "LossScaleWarning", "Model", "ProgramCache", "TensorSpec",
    "TrainConfig",
    "TrainState", "Trainer",
    "TrainingError", "UnsupportedOperatorError", "VariableError", "checkpoints", "fit", "formats",
    "inline_cpu_dispatch", "load", "losses", "optim", "passes", "read_model",
    "retain_host_memory",
    "select_trainable", "signatures",
    "supported_operators", "unsupported_operators",
]
