"""Training data on its way into the compiled epoch: checked, split, cut into batches; and
the params a run is given, checked."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import ConfigError, DataError
from ..formats.rawdata import check_training_data, lossless_cast
from ..graph.batching import check_input_count, free_axes, takes_samples
from ..lowering.interpreter import RANGES
from ..model import Model, TensorSpec

Batch = tuple[tuple[jax.Array, ...], jax.Array]


def batched(x: Sequence[jax.Array], y: jax.Array, b: int, steps: int,
            first: int | jax.Array = 0) -> tuple[tuple, jax.Array]:
    """``steps`` batches of ``b`` samples, from batch ``first`` on (which may be traced: one
    compiled cut serves every chunk of an epoch): arrays of shape (steps, b, ...)."""

    def cut(a: jax.Array) -> jax.Array:
        rows = lax.dynamic_slice_in_dim(a, first * b, steps * b)
        return rows.reshape((steps, b) + a.shape[1:])

    return tuple(cut(a) for a in x), cut(y)


def trailing(x: Sequence[jax.Array], y: jax.Array, b: int, steps: int) -> Batch:
    """The samples after ``steps`` batches of ``b``: the trailing partial batch."""
    return tuple(a[steps * b:] for a in x), y[steps * b:]


def correct(out: jax.Array, y: jax.Array, ignore_index: int | None = None) -> jax.Array:
    """Per-sample categorical accuracy: the argmax of the flattened sample (first max wins)
    against the label's argmax, or against the label itself where a sample's label is one
    value (a class index). With a label per position (a sequence's ``[N, T]`` against
    ``[N, T, V]``), a sample is right when every position's argmax is its label, positions
    labelled ``ignore_index`` left out."""
    if y.ndim >= 2 and y.ndim == out.ndim - 1:
        hit = jnp.argmax(out, axis=-1) == y.astype(jnp.int32)
        if ignore_index is not None:
            hit |= y == ignore_index
        return jnp.all(hit.reshape(hit.shape[0], -1), axis=-1).astype(jnp.int32)
    pred = jnp.argmax(out.reshape(out.shape[0], -1), axis=-1)
    if y.size > y.shape[0]:
        target = jnp.argmax(y.reshape(y.shape[0], -1), axis=-1)
    else:
        target = y.reshape(y.shape[0]).astype(pred.dtype)
    return (pred == target).astype(jnp.int32)


def as_inputs(model: Model, x: Any) -> tuple[np.ndarray, ...]:
    """``x`` (an array or one per model input) as host arrays of the model's input dtypes
    (`model_input`), shapes checked (`takes_samples`; callers move them to the device in one
    `jax.device_put`)."""
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    check_input_count(len(model.inputs), len(xs))
    out = []
    main = model.ir.main
    for a, spec, i in zip(xs, model.inputs, main.inputs):
        a = np.asarray(a)
        if not spec.shape:
            raise DataError(f"input {spec.name!r} is a scalar: the model has no batch axis to "
                            "stack samples on (it runs only at its declared shapes)")
        if not takes_samples(main.tensors[i], a.shape):
            raise DataError(f"input {spec.name!r}: samples of shape {list(a.shape[1:])}, "
                            f"the model expects {list(spec.shape[1:])}")
        out.append(model_input(spec, a, f"input {spec.name!r}", round_floats=True,
                               remedy="pass it as"))
    check_table_ids(model, out)
    return tuple(out)


def model_input(spec: TensorSpec, a: np.ndarray, what: str,
                on_cast: Callable[[str], None] | None = None, **cast: Any) -> np.ndarray:
    """Data ``a`` for the model input ``spec`` in its dtype. Data in the integer dtype the
    model's file stores a float input in (``spec.stored``: a dequantized or quantization-
    aware training model of a quantized file) is those stored integers: dequantized with
    the file's scale and zero point, as the file's own QUANTIZE/DEQUANTIZE would. Any other
    dtype is cast as `lossless_cast` allows (``cast``: its keywords): float data for an
    integer input (token ids), bools, complex, and integers that would wrap or round are
    refused in one line naming ``what`` and both dtypes. ``on_cast`` hears of each cast."""
    q = spec.stored
    if q is not None and a.dtype == q.np_dtype:
        if on_cast is not None:
            how = ("per channel" if q.per_channel else
                   f"scale {q.s:.6g}, zero point {q.zp}")
            on_cast(f"{what}: {a.dtype.name}, the integers the model's file stores the input "
                    f"in, dequantized ({how})")
        return q.real(a).astype(spec.dtype)
    if a.dtype == spec.dtype:
        return a
    return lossless_cast(a, spec.dtype, what, on_cast, **cast)


#: operators that look rows up in a table: (position of the ids, of the table)
_LOOKUPS = {"GATHER": (1, 0), "EMBEDDING_LOOKUP": (0, 1)}


def check_table_ids(model: Model, xs: Sequence[np.ndarray]) -> None:
    """DataError (one line) when a model input read as ids by a GATHER or EMBEDDING_LOOKUP
    holds one outside that table's rows: JAX would clamp it, or fill the row with NaN, and
    train on that row (LiteRT refuses the call)."""
    sg = model.ir.main
    for x, t in zip(xs, sg.inputs, strict=True):
        if x.size == 0 or not np.issubdtype(x.dtype, np.integer):
            continue
        for op in sg.operators:
            at = _LOOKUPS.get(op.type)
            if at is None or len(op.inputs) <= max(at) or op.inputs[at[0]] != t:
                continue
            table = sg.tensors[op.inputs[at[1]]]
            axis = int(op.options.axis or 0) if op.type == "GATHER" else 0
            rows = table.shape[axis] if table.shape and 0 <= axis < len(table.shape) else 0
            low, high = int(x.min()), int(x.max())
            if rows > 0 and (low < 0 or high >= rows):
                raise DataError(
                    f"input {sg.tensors[t].name!r}: ids from {low} to {high}, but operator "
                    f"{op.index} ({op.type}) reads table {table.name!r} of {rows} rows: "
                    f"expected ids in [0, {rows})")


def training_samples(n: int, fraction: float) -> int:
    """How many of ``n`` samples train when the last ``fraction`` validate (onert's
    split), or ConfigError for a fraction outside [0, 1)."""
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) \
            or not 0.0 <= fraction < 1.0:
        raise ConfigError(f"validation_split must be in [0, 1), got {fraction}")
    return n - int(n * fraction)


def split_validation(x: tuple, y: Any, fraction: float) -> tuple[tuple, Any, tuple, Any]:
    """(train x, train y, val x, val y): the LAST ``fraction`` of samples validate (onert,
    `training_samples`)."""
    cut = training_samples(y.shape[0], fraction)
    return tuple(a[:cut] for a in x), y[:cut], tuple(a[cut:] for a in x), y[cut:]


def scoring_split(x: Sequence[jax.Array], y: jax.Array, batch_size: int
                  ) -> tuple[Batch, Batch | None]:
    """The samples as full batches of ``batch_size`` (at most all samples) and the partial
    batch left over (None when there is none)."""
    n = y.shape[0]
    b = min(batch_size, n)
    steps, rest = divmod(n, b)
    return batched(tuple(x), y, b, steps), (trailing(x, y, b, steps) if rest else None)


def checked_samples(model: Model, x: Any, y: Any, dtype: Any,
                    loss: str = "mean_squared_error", output: int = 0,
                    ignore_index: int | None = None
                    ) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """(inputs, targets as ``dtype``) from ``x`` (an array or one per input, `as_inputs`)
    and ``y``, or DataError (one line) for sample counts that differ or are 0, NaN or
    infinity, and targets that do not fit loss ``loss`` (a canonical name) on model output
    ``output`` (`check_targets`; an output whose shape signature leaves an axis past 0 free
    is checked at the shape one sample of ``x`` gives it)."""
    y = np.asarray(y)  # checked as given (sparse labels keep their own type)
    xs, ys = as_inputs(model, x), y.astype(dtype, copy=False)
    if any(a.shape[0] != ys.shape[0] for a in xs):
        raise DataError(f"inputs have {[a.shape[0] for a in xs]} samples, targets have "
                        f"{ys.shape[0]}")
    if ys.shape[0] == 0:
        raise DataError("no samples: expected at least one (samples on axis 0)")
    spec = model.outputs[output]
    if free_axes(model.ir.main.tensors[model.ir.main.outputs[output]]):  # one sample's shape
        shape = jax.eval_shape(model.apply, model.params, *(a[:1] for a in xs))[output].shape
        spec = replace(spec, shape=tuple(shape))
    check_targets(y, loss, spec)
    sparse = loss == "sparse_categorical_crossentropy"
    check_training_data(xs, y, spec.shape[-1] if sparse and spec.shape else None,
                        ignore_index, distributions=loss == "categorical_crossentropy")
    return xs, ys


def check_targets(y: np.ndarray, loss: str, output: Any) -> None:
    """DataError (one line naming both shapes) unless the samples of ``y`` have the shape
    loss ``loss`` needs on ``output`` (a `TensorSpec`, batch on axis 0): the output's
    per-sample shape for mean squared error and categorical crossentropy, that without the
    class axis (or with a trailing 1 there) for sparse labels. Outputs of unknown or no
    per-sample shape are not checked."""
    per_sample = tuple(output.shape[1:])
    if not output.shape or any(d < 0 for d in per_sample):
        return
    wanted = [per_sample]
    if loss == "sparse_categorical_crossentropy":
        wanted = [per_sample[:-1], per_sample[:-1] + (1,)]
    if tuple(y.shape[1:]) not in wanted:
        raise DataError(f"the expected data: samples of shape {list(y.shape[1:])}, but loss "
                        f"{loss} on output {output.name!r} (samples of shape "
                        f"{list(per_sample)}) expects {list(wanted[0])}")


def checked_params(model: Model, params: Mapping[str, Any]) -> Mapping[str, Any]:
    """``params`` when they are ``model``'s: the same names (and a QAT model's moving
    ranges), shapes and finite values; else one line naming the first that is not (a
    wrong shape would fail inside an operator, a NaN after a whole epoch)."""
    names = set(model.params)
    extra, missing = sorted(set(params) - names - {RANGES}), sorted(names - set(params))
    if extra or missing:
        raise ValueError(f"params are not the model's: {len(missing)} missing, e.g. "
                         f"{(missing or [None])[0]!r}; {len(extra)} unknown, e.g. "
                         f"{(extra or [None])[0]!r} (expected the names of model.params)")
    for name, want in model.params.items():
        have = params[name]
        if np.shape(have) != np.shape(want):
            raise ValueError(f"params[{name!r}] has shape {list(np.shape(have))}, the model's "
                             f"is {list(np.shape(want))}")
        if jnp.issubdtype(jnp.result_type(have), jnp.inexact) and \
                not np.isfinite(np.asarray(have)).all():
            raise DataError(f"params[{name!r}] holds NaN or infinity; expected finite weights")
    return params
