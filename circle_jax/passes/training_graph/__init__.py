"""The training step as builtin Circle/TFLite operators (issue 56): forward, loss, the
backward down to the first trainable operator, and the optimizer's update, built from a
model's IR and a training configuration (`functional_step`, `StepConfig`). One backward
rule per operator, a module per family: `conv`, `dense`, `elementwise`, `indexing`,
`pooling`, `reduce`, `resize`, `shape`, `slicing`."""

from __future__ import annotations

from .loss import LOSSES, LossSpec
from .optimizer import OPTIMIZERS, OptimizerSpec
from .signatures import SIGNATURES, signature_model
from .step import RULES, StepConfig, TrainingStep, functional_step, unsupported

__all__ = ["LOSSES", "OPTIMIZERS", "RULES", "SIGNATURES", "LossSpec", "OptimizerSpec",
           "StepConfig", "TrainingStep", "functional_step", "signature_model", "unsupported"]
