"""Training: a ``TrainState`` pytree, a pure jitted step, epochs as one compiled ``lax.scan``,
and ``fit``, the one loop around them.

Modules: `config` (what a run is, resolved once), `state` (the values passed around),
`data` (checks, validation split, batches), `compose` (the step: a core update and the
transforms around it), `step` (`TrainingStep`: the step's data flow, resolved once;
``make_train_step``: that step as pure ``init`` and ``step``), `trainer` (the step driven
as compiled epochs), `loop` (``fit``:
epochs, chunks, callbacks, resumption), `programs` (compiled programs kept on disk between
runs), `dispatch` (CPU programs run on the calling thread), `memory` (freed host memory
kept for the next call).

The package imports lazily (PEP 562), as ``circle_jax`` does: ``circle_jax.train.dispatch``
and ``circle_jax.train.programs`` import without the trainer and the model's layers, so
the command line sets up JAX and starts loading a repeated run's programs before it
imports them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import TrainConfig, select_trainable
    from .data import batched, split_validation
    from .dispatch import inline_cpu_dispatch
    from .loop import Callback, FitResult, fit, prepare_data, record_epoch
    from .memory import retain_host_memory
    from .programs import CLASSIC_EMITTERS, ProgramCache, cpu_compiler_options
    from .state import History, StepMetrics, TrainState
    from .step import StepState, TrainingStep, TrainStep, make_train_step
    from .trainer import Trainer

# public name -> the module that defines it
_LAZY = {
    "TrainConfig": ".config", "select_trainable": ".config",
    "batched": ".data", "split_validation": ".data",
    "inline_cpu_dispatch": ".dispatch",
    "Callback": ".loop", "FitResult": ".loop", "fit": ".loop", "prepare_data": ".loop",
    "record_epoch": ".loop",
    "retain_host_memory": ".memory",
    "CLASSIC_EMITTERS": ".programs", "ProgramCache": ".programs",
    "cpu_compiler_options": ".programs",
    "History": ".state", "StepMetrics": ".state", "TrainState": ".state",
    "StepState": ".step", "TrainingStep": ".step", "TrainStep": ".step", "make_train_step": ".step",
    "Trainer": ".trainer",
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'circle_jax.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "CLASSIC_EMITTERS", "Callback", "FitResult", "History", "ProgramCache", "StepMetrics",
    "StepState", "TrainConfig", "TrainStep", "TrainingStep",
    "TrainState", "Trainer", "batched", "cpu_compiler_options", "fit", "inline_cpu_dispatch",
    "make_train_step", "prepare_data",
    "record_epoch", "retain_host_memory", "select_trainable", "split_validation",
]
