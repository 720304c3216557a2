"""Training: a ``TrainState`` pytree, a pure jitted step, epochs as one compiled ``lax.scan``,
and ``fit``, the one loop around them.

Data flow per step: trainable params (masters: float32, or float64 under a float64 policy)
→ cast to the variable then compute dtype → ``model.apply`` → loss in float32 (float64
under a float64 output dtype) → scaled gradients (optionally accumulated over
micro-batches inside the step) → unscaled, finiteness-checked → optax update (optionally
accumulated across steps) → new state, or the old state on a skipped overflow step.
Frozen params are a separate argument that is never differentiated.

Modules: `config` (what a run is, resolved once), `state` (the values passed around),
`data` (checks, validation split, batches), `trainer` (the step and the compiled epoch),
`loop` (``fit``: epochs, chunks, callbacks, resumption).
"""

from __future__ import annotations

from .config import TrainConfig, select_trainable
from .data import batched, split_validation
from .loop import Callback, FitResult, fit, prepare_data, record_epoch
from .state import History, StepMetrics, TrainState
from .trainer import CPU_COMPILER_OPTIONS, Trainer

__all__ = [
    "CPU_COMPILER_OPTIONS", "Callback", "FitResult", "History", "StepMetrics", "TrainConfig",
    "TrainState", "Trainer", "batched", "fit", "prepare_data", "record_epoch",
    "select_trainable", "split_validation",
]
