"""Errors circle-jax raises for bad input: each message is one line saying what is wrong."""

from __future__ import annotations


class CircleJaxError(Exception):
    """Base class of every error circle-jax raises on purpose."""


class CircleFormatError(CircleJaxError, ValueError):
    """A model or companion file is malformed, truncated or of a foreign format."""


class UnsupportedOperatorError(CircleJaxError, NotImplementedError):
    """The model uses operators circle-jax cannot lower; the message lists all of them."""


class DataError(CircleJaxError, ValueError):
    """Training or inference data does not fit the model (sizes, dtypes, counts)."""


class ConfigError(CircleJaxError, ValueError):
    """A training configuration that cannot train as given (an option that does not apply,
    a value of the wrong kind, a loss the model's output cannot take, nothing trainable);
    raised before anything compiles."""


class TrainingError(CircleJaxError, RuntimeError):
    """Training cannot go on (e.g. a non-finite loss)."""


class VariableError(CircleJaxError, RuntimeError):
    """A signature reads a resource variable that holds nothing: nothing assigned it (the
    file has no initialiser for it and no signature such as ``restore`` ran)."""


class CheckpointWarning(UserWarning):
    """A checkpoint read with less than it holds: Adam's moments resumed by an optimizer
    that keeps none (the weights and the update count still resume)."""


class LossScaleWarning(RuntimeWarning):
    """Steps are still skipped for non-finite gradients while the loss scale can no longer
    back off; the message names the first non-finite tensor and its operator."""
