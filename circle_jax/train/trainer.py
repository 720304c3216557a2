"""`Trainer`: `circle_jax.train.step.TrainingStep`'s pure step driven as compiled epochs
(one ``lax.scan`` each) and evaluation, for one model and configuration (its data flow per
step: docs/architecture.md, "The training step")."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..distributed import DataParallel
from ..errors import DataError
from ..losses import loss_name
from ..lowering.interpreter import RANGES
from ..model import Model
from ..optim import NoLossScale
from ..optim.flat import Packed, packable, per_weight, raveled
from .config import TrainConfig
from .data import Batch, batched, checked_params, scoring_split, trailing
from .hoisting import split_step
from .programs import AheadOfTime, ProgramCache, cpu_compiler_options
from .scoring import Scoring
from .state import StepMetrics, TrainState, epoch_metrics, same_arrays
from .step import TrainingStep
from .summary import SUMMARY_SIZE, epoch_summary, host_rows, host_summary


class Trainer(TrainingStep, Scoring, AheadOfTime):
    """Compiled training and evaluation for one model and configuration: the pure step of
    `TrainingStep` (the same arguments), driven as compiled epochs (one ``lax.scan``
    each), kept between calls and across runs (`circle_jax.train.programs`)."""

    def __init__(self, model: Model, config: TrainConfig | None = None, *,
                 placement: DataParallel | None = None, **overrides: Any):
        super().__init__(model, config, placement=placement, **overrides)
        #: ``progress(done, total)`` is called from inside the compiled epoch (set it before
        #: the first epoch compiles; the CLI's progress bar)
        self.progress: Callable[[Any, Any], None] | None = None
        #: compute the steps' data-only work for a whole epoch before its loop
        #: (`circle_jax.train.hoisting`; set before the first epoch compiles)
        self.hoist = True
        #: where compiled programs are kept between runs (`circle_jax.train.programs`;
        #: None: traced and compiled every run). Used when no progress callback is set and
        #: on one device.
        self.program_cache: ProgramCache | None = None
        #: the XLA options its programs compile with (`programs.cpu_compiler_options`)
        self.compiler_options: dict[str, Any] = cpu_compiler_options(
            op.type for sg in model.ir.subgraphs for op in sg.operators) \
            if self.platform == "cpu" else {}
        self._compiled: dict[str, Callable[..., Any]] = {}
        self._last_batches: tuple[tuple, jax.Array, tuple] | None = None
        #: the last `init`'s params (device arrays: immutable) and its result
        self._last_init: tuple[dict, tuple[TrainState, dict]] | None = None
        #: the last state `packed` packed, and its packed form
        self._last_packed: tuple[TrainState, TrainState] | None = None
        #: the last `epochs_runner`'s arguments (state, count, the frozen params' and the
        #: samples' arrays) and its runner
        self._last_runner: tuple[tuple, Callable[..., Any]] | None = None
        #: the device-array samples `circle_jax.train.prepare_data` last prepared for this
        #: trainer, and what it made of them (the next call on the same arrays reuses it)
        self.prepared_data: tuple[tuple, tuple] | None = None
        self._summary = jax.jit(epoch_summary)
        self._cut = jax.jit(batched, static_argnums=(2, 3))


    def packed(self, state: TrainState) -> TrainState:
        """``state`` (arrays, or ``jax.ShapeDtypeStruct``) with its params `Packed` (the
        vector weights in one vector), as `epochs_runner`'s programs carry them where that
        is exact (`circle_jax.optim.flat.packable`, on one device, no Keras sparse-gradient
        Adam); else (or packed already) as it is."""
        kept = self._last_packed  # the same state again (a fresh state `init` kept)
        if kept is not None and kept[0] is state:
            return kept[1]
        packed = state if isinstance(state.params, Packed) or self.placement is not None \
            or self.row_squares or not packable(state.params, state.opt_state) \
            else state._replace(params=Packed.pack(state.params))
        self._last_packed = (state, packed)
        return packed


    def init(self, params: Mapping[str, Any] | None = None) -> tuple[TrainState, dict]:
        """A fresh state and the frozen params for ``params`` (default: the model's): one
        compiled call (kept like the epochs, see `_compiled_for`) and one transfer,
        whatever the number of params. Params that are all device arrays (immutable, as a
        loaded model's are) and the same objects as the last call's give that call's state
        again (checked, moved and computed once: a repeated ``fit`` pays nothing here)."""
        given = self.model.params if params is None else params
        kept = self._last_init
        if kept is not None and same_arrays(kept[0], given):
            state, frozen = kept[1]
            return state, dict(frozen)
        params = given if params is None else checked_params(self.model, params)
        trainable, frozen = jax.device_put((
            {k: v for k, v in params.items() if k in self.trainable},
            {k: v for k, v in params.items() if k not in self.trainable}))
        fresh = self._compiled_for(self.fresh_state, "fresh", (trainable,))
        state = fresh(trainable)  # moving ranges given in the params (`merge`) continue
        state = state._replace(stats=frozen.pop(RANGES)) if RANGES in frozen else state
        if all(isinstance(v, jax.Array) for v in given.values()):
            self._last_init = (dict(given), (state, dict(frozen)))
        return state, frozen

    def per_weight_state(self, state: TrainState) -> Any:
        """``state.opt_state`` on the host, laid out as `per_weight_tx` keeps it (one
        ``mu[name]`` per weight); `with_per_weight_state` sets it back."""
        opt_state = jax.device_get(state.opt_state)
        return opt_state if self.tx is self.per_weight_tx else per_weight(
            opt_state, self.per_weight_tx, state.params)

    def with_per_weight_state(self, state: TrainState, opt_state: Any) -> TrainState:
        """``state`` with the optimizer state ``opt_state``, laid out per weight."""
        flat = self.tx is not self.per_weight_tx
        return state._replace(opt_state=jax.device_put(
            raveled(opt_state, state.params) if flat else opt_state))


    def _epoch_impl(self, state: TrainState, frozen: dict, xs: tuple, ys: jax.Array):
        steps = ys.shape[0]
        report = self.progress
        every = max(1, steps // 40)

        # Without loss scaling the last three metrics are constants: they are stacked after
        # the loop instead of written by every step (three fewer operations per step).
        constant = isinstance(state.loss_scale, NoLossScale)

        def step(s: TrainState, fr: dict, batch: Batch) -> tuple[TrainState, tuple]:
            s, m = self.train_step(s, fr, batch, in_loop=True)
            return s, m[:2] if constant else m

        first = jax.tree.map(lambda a: a[0], (xs, ys))
        dense = loss_name(self.config.loss) != "sparse_categorical_crossentropy"
        split = split_step(step, state, frozen, first, steps,
                           needed=first[1] if dense else ()) if self.hoist else None
        if split is None:
            data, run = (xs, ys), step
        else:  # the batches' data-only work, for all of them at once (see hoisting)
            data, run = split.precompute(frozen, (xs, ys)), split.step

        def body(s: TrainState, b: tuple) -> tuple[TrainState, tuple]:
            i, batch = b
            s, m = run(s, frozen, batch)
            if report is not None:  # host callback ~40 times an epoch (terminals only)
                lax.cond((i + 1) % every == 0,
                         lambda: jax.debug.callback(report, i + 1, steps), lambda: None)
            return s, m

        state, m = lax.scan(body, state, (jnp.arange(steps), data))
        if constant:
            zeros = jnp.zeros([steps], jnp.int32)
            m = StepMetrics(*m, zeros, zeros, jnp.full([steps], state.loss_scale.loss_scale))
        return state, m

    def _shuffled_epoch_impl(self, state: TrainState, frozen: dict, x: tuple, y: jax.Array,
                             epoch: jax.Array):
        """The epoch on the samples in epoch ``epoch``'s order (`_permuted`), drawn and
        applied on the device."""
        b = self.config.batch_size
        xs, ys = batched(*self._permuted(x, y, epoch), b, y.shape[0] // b)
        return self._epoch_impl(state, frozen, xs, ys)

    def _permuted(self, x: tuple, y: jax.Array, epoch: jax.Array) -> tuple[tuple, jax.Array]:
        """The samples in the order ``jax.random.permutation(fold_in(key(seed), epoch), n)``."""
        perm = jax.random.permutation(
            jax.random.fold_in(jax.random.key(self.config.seed), epoch), y.shape[0])
        return tuple(a[perm] for a in x), y[perm]

    def _epochs_impl(self, state: TrainState, frozen: dict, data: tuple, tail: Batch | None,
                     val: tuple | None, first: jax.Array, n: jax.Array, *, count: int
                     ) -> tuple[TrainState, jax.Array]:
        """``n`` (at most ``count``, a runtime value) whole epochs from epoch ``first`` in one
        compiled call: per epoch what `run_epoch` does (its batches, then the trailing
        partial batch), then the `epoch_summary` and, given ``val``, the validation (loss,
        accuracy) appended to it. Returns the state and the summaries in the first ``n`` of
        ``count`` rows (one transfer for the call).

        On one device ``data`` and ``val`` are all their samples, cut into batches here
        (no copy of the data, nothing compiled apart). On several (a ``placement``) they
        come placed: ``data`` as the batches sharded on their batch axis (with ``shuffle``,
        all samples), ``tail`` the trailing batch (a flag with ``shuffle``) and ``val``
        `_score_impl`'s batches."""
        b = self.config.batch_size
        inside = self.placement is None

        def epoch(s: TrainState, e: jax.Array) -> tuple[TrainState, jax.Array]:
            (xs, ys), rest = data, tail
            if inside or self.config.shuffle:
                x, y = self._permuted(*data, e) if self.config.shuffle else data
                steps = y.shape[0] // b
                xs, ys = batched(x, y, b, steps)
                if not self.config.drop_remainder and y.shape[0] % b:
                    rest = trailing(x, y, b, steps)
            s, m = self._epoch_impl(s, frozen, xs, ys)
            if rest is not None:
                s, last = self.train_step(s, frozen, rest)
                m = jax.tree.map(lambda a, z: jnp.concatenate([a, z[None]]), m, last)
            summary = epoch_summary(m, s.params, s.loss_scale.loss_scale)
            if val is not None:
                scored = scoring_split(*val, b) if inside else val
                scores = self._score_impl(*self.split_params(self.masters(s, frozen)), *scored)
                summary = jnp.concatenate([summary, jnp.stack(scores).astype(summary.dtype)])
            return s, summary

        def body(i: jax.Array, carry: tuple[TrainState, jax.Array]
                 ) -> tuple[TrainState, jax.Array]:
            s, rows = carry
            s, summary = epoch(s, first + i)
            return s, lax.dynamic_update_index_in_dim(rows, summary, i, 0)

        width = SUMMARY_SIZE + 2 * (val is not None)
        rows = jnp.zeros((count, width), self.loss_dtype)
        return lax.fori_loop(0, n, body, (state, rows))

    # -- host-side driving ---------------------------------------------------------------
    def run_epoch(self, state: TrainState, frozen: dict, x: Sequence[jax.Array], y: jax.Array,
                  epoch: int = 0, *, every_steps: int | None = None, skip_steps: int = 0,
                  after_chunk: Callable[[TrainState], None] | None = None,
                  ) -> tuple[TrainState, StepMetrics]:
        """One epoch: batches of ``batch_size`` (in epoch ``epoch``'s order with
        ``shuffle``), then the trailing partial batch unless ``drop_remainder`` (with fewer
        samples than a batch, that one step is the epoch).

        Whole, the epoch is one compiled scan. With ``every_steps`` it runs as compiled scans
        of that many steps, calling ``after_chunk(state)`` after each (checkpoints); the
        first ``skip_steps`` steps are left out (done before a mid-epoch checkpoint). Both
        ways give the same state up to float32 rounding: each program is deterministic, but
        XLA may round a sum differently in differently shaped programs (measured: 1 ulp in
        a few weights of a tiny MLP, whose products run as `lowering.matmul.small_matmul`).
        """
        n, b = y.shape[0], self.config.batch_size
        steps = n // b
        if steps == 0 and self.config.drop_remainder:
            raise DataError(f"{n} training samples are fewer than one batch of {b}")
        tail = not self.config.drop_remainder and n % b > 0
        parts = []
        if steps and every_steps is None and not skip_steps:
            args = self.epoch_arguments(state, frozen, x, y, epoch)
            state, metrics = self._compiled_epoch(*args, shuffled=self.config.shuffle)(*args)
            parts.append(metrics)
        if tail or not parts:
            x, y = self._ordered(x, y, epoch)
        if steps and not parts:
            every = every_steps or steps
            for i in range(skip_steps, steps, every):
                part = (state, frozen, *self.placed(
                    self._cut(tuple(x), y, b, min(every, steps - i), i), batch_axis=1))
                state, metrics = self._compiled_epoch(*part)(*part)
                parts.append(metrics)
                if after_chunk is not None:
                    after_chunk(state)
        if tail:
            rest = self.placed(trailing(x, y, b, steps))
            state, metrics = self._compiled_tail(state, frozen, rest)(state, frozen, rest)
            parts.append(metrics)
        return state, epoch_metrics(parts, tail)

    def epochs_runner(self, state: TrainState, frozen: dict, x: Sequence[jax.Array],
                      y: jax.Array, count: int, val: tuple[tuple, jax.Array] | None = None
                      ) -> Callable[..., tuple[TrainState, Any]]:
        """``runner(state, first_epoch, n, read=True)``: ``n`` epochs (`run_epoch`'s steps),
        at most ``count``, in one compiled call, compiled or looked up here once, for states
        laid out as ``state``; returns the state (`packed`: `unpacked` gives its params by
        name) and per epoch (the `summarize_epoch` values, the validation (loss, accuracy)
        over ``val`` or None): one transfer to the host, or with ``read=False`` none (the
        summaries on the device, for `host_rows`)."""
        given = (state, count, *frozen.values(), *x, y, *(() if val is None else
                                                          (*val[0], val[1])))
        kept = self._last_runner  # the same arguments as the last call's: its runner
        if kept is not None and len(kept[0]) == len(given) \
                and all(a is b for a, b in zip(kept[0], given)):
            return kept[1]
        packs = isinstance(self.packed(state).params, Packed)  # as every state of this layout
        args = self._epochs_arguments(self.packed(state), frozen, x, y, val)
        compiled = self._compiled_epochs(args, count)
        fixed = args[1:-2]  # all but the state, the first epoch and the epochs' count

        def runner(s: TrainState, first_epoch: int, n: int, read: bool = True
                   ) -> tuple[TrainState, Any]:
            if not 1 <= n <= count:
                raise ValueError(f"this runner trains 1 to {count} epochs a call, not {n}")
            s, summaries = compiled(self.packed(s) if packs else s, *fixed,
                                    np.int32(first_epoch), np.int32(n))
            return s, host_rows(summaries, n) if read else summaries

        self._last_runner = (given, runner)
        return runner

    def _epochs_arguments(self, state: TrainState, frozen: dict, x: Sequence[jax.Array],
                          y: jax.Array, val: tuple[tuple, jax.Array] | None) -> tuple:
        """`_epochs_impl`'s arguments (see there), from epoch 0, for one epoch."""
        n, b = y.shape[0], self.config.batch_size
        steps = n // b
        if steps == 0:
            raise DataError(f"{n} training samples are fewer than one batch of {b}")
        val = None if val is None or not val[1].shape[0] else (tuple(val[0]), val[1])
        if self.placement is None:
            return state, frozen, (tuple(x), y), None, val, np.int32(0), np.int32(1)
        tail = None
        if not self.config.drop_remainder and n % b:
            tail = self.placed(trailing(x, y, b, steps))
        data = (self.placed((tuple(x), y), batch_axis=0) if self.config.shuffle
                else self._batches(tuple(x), y))
        scored = None if val is None else self.scoring_batches(*val)
        return state, frozen, data, tail, scored, np.int32(0), np.int32(1)

    def _compiled_epochs(self, args: tuple, count: int) -> Callable[..., Any]:
        return self._compiled_for(functools.partial(self._epochs_impl, count=count),
                                  f"epochs{count}", args)

    def _ordered(self, x: Sequence[jax.Array], y: jax.Array, epoch: int
                 ) -> tuple[tuple, jax.Array]:
        """The samples in epoch ``epoch``'s order: as given, or permuted (``shuffle``)."""
        if not self.config.shuffle:
            return tuple(x), y
        args = (tuple(x), y, jnp.asarray(epoch, jnp.int32))
        return self._compiled_permutation(*args)(*args)

    def summarize_epoch(self, metrics: StepMetrics, state: TrainState) -> tuple:
        """(mean loss, skipped steps, correct samples, all weights finite, loss scale) of an
        epoch: one compiled reduction and one transfer to the host (the logging point)."""
        row = np.asarray(self._summary(metrics, state.params, state.loss_scale.loss_scale))
        return host_summary(row.tolist())[0]

    def placed(self, tree: Any, batch_axis: int | None = None) -> Any:
        """``tree`` on the placement's devices (sharded on ``batch_axis``), or as it is."""
        return tree if self.placement is None else self.placement.put(tree, batch_axis)

    def epoch_arguments(self, state: TrainState, frozen: dict, x: Sequence[jax.Array],
                        y: jax.Array, epoch: int = 0) -> tuple:
        """The compiled epoch's arguments: the data cut into batches, or with ``shuffle``
        all of it and the epoch number (the permutation is drawn inside)."""
        if self.config.shuffle:
            return (state, frozen, *self.placed((tuple(x), y), batch_axis=0),
                    np.int32(epoch))
        return (state, frozen, *self._batches(tuple(x), y))

    def _batches(self, x: tuple, y: jax.Array) -> tuple[tuple, jax.Array]:
        """``x``, ``y`` cut into placed batches, kept for the next call on the same arrays
        (every epoch of an unshuffled run)."""
        kept = self._last_batches
        if kept is not None and kept[1] is y and len(kept[0]) == len(x) \
                and all(a is b for a, b in zip(kept[0], x)):
            return kept[2]
        b = self.config.batch_size
        cut = self.placed(self._cut(x, y, b, y.shape[0] // b), batch_axis=1)
        self._last_batches = (x, y, cut)
        return cut

    def compile_epoch(self, state: TrainState, frozen: dict, x: Sequence[jax.Array],
                      y: jax.Array, every_steps: int | None = None,
                      val: tuple[tuple, jax.Array] | None = None) -> None:
        """Compile, before the first epoch, what `run_epoch` runs: the whole epoch, or its
        chunks of ``every_steps`` steps and the shorter last one, the trailing partial
        batch's step, the samples' permutation those take with ``shuffle``,
        `summarize_epoch`'s reduction and, given validation samples ``val``, their
        `score` (a chunk of another length, resuming mid-epoch, compiles when it first
        runs)."""
        if val is not None and val[1].shape[0]:
            self.compiled_score(self.scoring_arguments(self.masters(state, frozen), *val))
        b, n = self.config.batch_size, y.shape[0]
        steps = n // b
        programs = []  # an epoch's programs, in the order `run_epoch` runs them
        if steps and every_steps is None:
            args = self.epoch_arguments(state, frozen, x, y)
            programs.append(self._compiled_epoch(*args, shuffled=self.config.shuffle))
        elif steps:
            chunks: dict[int, Callable] = {}
            for i in range(0, steps, every_steps):
                k = min(every_steps, steps - i)
                if k not in chunks:  # the cut and the chunk of each length
                    args = (state, frozen, *self.placed(self._cut(tuple(x), y, b, k, 0),
                                                        batch_axis=1))
                    chunks[k] = self._compiled_epoch(*args)
                programs.append(chunks[k])
        tail = not self.config.drop_remainder and n % b > 0
        if tail:
            programs.append(self._compiled_tail(
                state, frozen, self.placed(trailing(x, y, b, steps))))
        if self.config.shuffle and (tail or every_steps is not None):
            self._compiled_permutation(tuple(x), y, jnp.asarray(0, jnp.int32))
        # an epoch's metrics as `run_epoch` joins them (zeros), and their summary
        parts = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), compiled.out_info[1])
                 for compiled in programs]
        self.summarize_epoch(self.placed(epoch_metrics(parts, tail)), state)

    def _compiled_permutation(self, *args: Any) -> Callable[..., tuple[tuple, jax.Array]]:
        """`_permuted` (the samples in an epoch's order, for the steps `run_epoch` runs
        apart from a whole epoch) compiled ahead of time for these arguments' shapes."""
        return self._compiled_for(self._permuted, "permutation", args)

    def _compiled_tail(self, *args: Any) -> Callable[..., tuple[TrainState, StepMetrics]]:
        """The step of an epoch's trailing partial batch, compiled ahead of time for these
        arguments' shapes (cached), as the epochs are."""
        return self._compiled_for(self.train_step, "trailing step", args)

    def _compiled_epoch(self, *args: Any, shuffled: bool = False
                        ) -> Callable[..., tuple[TrainState, StepMetrics]]:
        """The epoch (``shuffled``: the one drawing its permutation, see `epoch_arguments`)
        compiled ahead of time for these arguments' shapes (cached), so that compile time is
        measured apart from steady-state steps."""
        return self._compiled_for(self._shuffled_epoch_impl if shuffled else self._epoch_impl,
                                  f"epoch shuffled={shuffled}", args)
