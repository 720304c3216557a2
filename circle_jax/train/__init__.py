"""Training: a ``TrainState`` pytree, a pure jitted step, epochs as one compiled ``lax.scan``,
and ``fit``, the one loop around them.

Modules: `config` (what a run is, resolved once), `state` (the values passed around),
`data` (checks, validation split, batches), `trainer` (the step, its data flow, and the
compiled epochs), `loop` (``fit``: epochs, chunks, callbacks, resumption), `programs`
(compiled programs kept on disk between runs), `dispatch` (CPU programs run on the calling
thread), `memory` (freed host memory kept for the next call).
"""

from __future__ import annotations

from .config import TrainConfig, select_trainable
from .data import batched, split_validation
from .dispatch import inline_cpu_dispatch
from .loop import Callback, FitResult, fit, prepare_data, record_epoch
from .memory import retain_host_memory
from .programs import CPU_COMPILER_OPTIONS, ProgramCache
from .state import History, StepMetrics, TrainState
from .trainer import Trainer

__all__ = [
    "CPU_COMPILER_OPTIONS", "Callback", "FitResult", "History", "ProgramCache", "StepMetrics",
    "TrainConfig",
    "TrainState", "Trainer", "batched", "fit", "inline_cpu_dispatch", "prepare_data",
    "record_epoch", "retain_host_memory", "select_trainable", "split_validation",
]
