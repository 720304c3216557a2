"""How a `Trainer` scores samples: `Scoring.evaluate` (loss and accuracy over all of
them) and fit's validation, in batches of one compiled scan and a trailing partial batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..losses import loss_name
from .config import check_integer
from .data import Batch, checked_samples, correct, scoring_split

if TYPE_CHECKING:
    from ..losses import Reduction
    from ..model import Model
    from .config import TrainConfig


class Scoring:
    """`Trainer`'s scoring methods (a base of `Trainer`, whose attributes they read: the
    model, configuration, loss, forward pass and placement)."""

    model: Model
    config: TrainConfig
    reduction: Reduction
    loss_fn: Callable[..., jax.Array]
    loss_dtype: np.dtype
    loss_output: int
    _compiled_for: Callable[..., Callable[..., Any]]
    _forward: Callable[..., jax.Array]
    placed: Callable[..., Any]
    split_params: Callable[[Mapping[str, Any]], tuple[dict, dict]]

    def _score_impl(self, trainable: dict, frozen: dict, full: Batch, tail: Batch | None
                    ) -> tuple[jax.Array, jax.Array]:
        """(loss, categorical accuracy) over the batches ``full`` ([steps, batch, ...]) and
        the partial batch ``tail``: the batches' losses weighted by their sizes (see
        `evaluate`)."""
        def body(_: None, batch: Batch) -> tuple[None, tuple[jax.Array, jax.Array]]:
            return None, self._eval_batch_impl(trainable, frozen, *batch, in_loop=True)

        _, (losses, hits) = lax.scan(body, None, full)
        b = full[1].shape[1]
        per_sample = self.reduction.value != "sum"  # the batch loss is a mean over it
        total, right, n = jnp.sum(losses) * (b if per_sample else 1), jnp.sum(hits), \
            full[1].shape[0] * b
        if tail is not None:
            loss, hit = self._eval_batch_impl(trainable, frozen, *tail)
            rest = tail[1].shape[0]
            total, right, n = total + loss * (rest if per_sample else 1), right + hit, n + rest
        return total / n * (1 if per_sample else b), right / n

    def _eval_batch_impl(self, trainable: dict, frozen: dict, x: tuple, y: jax.Array,
                         in_loop: bool = False) -> tuple[jax.Array, jax.Array]:
        """(the batch's loss, how many of its samples are classified right), the forward as
        in training (precision policy)."""
        out = self._forward(trainable, frozen, x, in_loop=in_loop)
        return self.loss_fn(out, y), jnp.sum(correct(out, y, self.config.ignore_index))

    def evaluate(self, params: Mapping[str, Any], x: Sequence[Any], y: Any,
                 batch_size: int | None = None) -> tuple[float, float]:
        """(loss, categorical accuracy) over ALL the samples, in batches of ``batch_size``
        (default: the config's): the full batches in one compiled scan, then the trailing
        partial batch. The samples are checked as `fit` checks its own (`checked_samples`).

        The loss is what the configured reduction gives per batch, averaged over batches
        with each batch weighted by its size: under "sum_over_batch_size" the mean over all
        samples; under "sum" the sum over all samples divided by n / batch_size. ``params``
        are all params (model dtypes, or ``{**state.params, **frozen}`` for the masters);
        the forward runs as in training (precision policy).
        """
        check_integer("batch_size", batch_size, 1)
        return self.score(params, *self.checked_samples(x, y), batch_size)

    def checked_samples(self, x: Any, y: Any) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """`circle_jax.train.data.checked_samples` for this run's model, loss and labels."""
        return checked_samples(self.model, x, y, self.loss_dtype, loss_name(self.config.loss),
                               self.loss_output, self.config.ignore_index)

    def score(self, params: Mapping[str, Any], x: Sequence[Any], y: Any,
              batch_size: int | None = None) -> tuple[float, float]:
        """`evaluate` of samples already checked (`checked_samples`): fit's validation."""
        args = self.scoring_arguments(params, x, y, batch_size)
        loss, accuracy = jax.device_get(self.compiled_score(args)(*args))
        return float(loss), float(accuracy)

    def compiled_score(self, args: tuple) -> Callable[..., tuple[jax.Array, jax.Array]]:
        """`_score_impl` compiled ahead of time for `scoring_arguments` shaped like ``args``
        (kept as the training programs are: fit compiles its validation's before its
        epochs)."""
        return self._compiled_for(self._score_impl, "score", args)

    def scoring_arguments(self, params: Mapping[str, Any], x: Sequence[Any], y: Any,
                          batch_size: int | None = None) -> tuple:
        """`_score_impl`'s arguments: ``params`` split and placed, and `scoring_batches`."""
        x, y = jax.device_put((tuple(x), y))
        trainable, frozen = self.placed(self.split_params(params))
        return (trainable, frozen, *self.scoring_batches(x, y, batch_size))

    def scoring_batches(self, x: Sequence[jax.Array], y: jax.Array,
                        batch_size: int | None = None) -> tuple[Batch, Batch | None]:
        """`_score_impl`'s batches: the full batches of ``batch_size`` (default: the
        config's, at most all samples) and the partial batch left over (None when there is
        none). Full batches are split over the devices where their size divides evenly
        (fewer samples than a batch may not), else replicated, as the partial batch is."""
        full, tail = scoring_split(x, y, batch_size or self.config.batch_size)
        devices = 1 if self.placement is None else self.placement.size
        even = full[1].shape[1] % devices == 0
        return self.placed(full, batch_axis=1 if even else None), self.placed(tail)
