"""Training on the device: a model's training step exported as builtin Circle/TFLite
operators (`export_training_graph`; the graph pass is `circle_jax.passes.training_graph`)."""

from __future__ import annotations

from .export import PACKAGINGS, TrainingExport, export_training_graph, exportable, step_config

__all__ = ["PACKAGINGS", "TrainingExport", "export_training_graph", "exportable", "step_config"]
