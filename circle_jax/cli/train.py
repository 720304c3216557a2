"""``train``: onert_train's command line and output (also the ``onert-train-jax`` program).

Parsing gives a `TrainRun`; this module loads the model and data, calls `circle_jax.fit`
(or the checkpointing driver), writes the files and prints onert_train's output through
`onert_output`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from circle_jax.errors import DataError, LossScaleWarning

from . import onert_output as out
from .cache import cache_dir, enable_compile_cache, named_by_user
from .common import CliError, Log, check_finite_data, input_names, load_model, read_data
from .config import DataFiles, TrainRun, train_run
from .train_args import add_circle_jax_arguments, add_onert_train_arguments

if TYPE_CHECKING:
    from circle_jax.train.programs import ProgramCache

NAME = "train"
HELP = "train a model (onert_train's flags, codes and output)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_onert_train_arguments(p)
    add_circle_jax_arguments(p)


def run(ns: argparse.Namespace) -> int:
    return train(train_run(ns))


@dataclass
class Clock:
    """Wall-clock marks of a run, in milliseconds, and resident memory per phase (``-m``)."""

    t0: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)
    epoch_ends: list[float] = field(default_factory=list)
    rss_kb: dict[str, int] = field(default_factory=dict)
    #: whether the training epoch's programs were all loaded from the cache (none compiled)
    loaded: bool = False

    def mark(self, phase: str) -> None:
        """Note the time and, for onert's phase names, the resident memory now."""
        self.marks[phase] = time.perf_counter()
        if phase.isupper():
            self.rss_kb[phase] = _memory_kb("VmRSS")

    def ms(self, start: str, end: str) -> float:
        return (self.marks[end] - self.marks[start]) * 1000


def train(run: TrainRun) -> int:
    """Train as ``run`` says, printing onert_train's output; 0 on success.

    In a multi-process run every process trains its slice of each batch; process 0 alone
    prints and writes files (the others' errors still go to stderr).
    """
    from circle_jax.train import inline_cpu_dispatch, retain_host_memory

    inline_cpu_dispatch()  # before JAX starts: one program at a time, on this thread
    retain_host_memory()  # each epoch's call reuses the last one's pages
    if run.processes is not None:
        from circle_jax.distributed import initialize, is_main_process

        initialize(*run.processes)
        if not is_main_process():
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                return _train_logged(replace(run, verbosity=0))
    return _train_logged(run)


def _train_logged(run: TrainRun) -> int:
    log = Log(run.verbosity)
    cache = enable_compile_cache(cache_dir(run.compile_cache),
                                 named_by_user(run.compile_cache))
    log(1, f"compile cache: {cache}")
    programs = _program_cache(run, cache, log)
    from circle_jax.interop.onert import answers_kept_in

    # onert's checkpoint entry orders (--checkpoint_order auto, onert), asked once per model
    with answers_kept_in(None if cache == "off" else os.path.join(cache, "onert_orders")):
        if run.verbosity < 2:
            return _train(run, log, cache, programs)
        import jax

        log(2, f"devices: {jax.devices()}")
        with jax.log_compiles(True):  # JAX logs each compile (and its time) on stderr
            return _train(run, log, cache, programs)


def _program_cache(run: TrainRun, cache: str, log: Log) -> ProgramCache | None:
    """The run's `ProgramCache` beside the compile cache (None when it is off), already
    loading the programs this run used when it last ended (`ProgramCache.prefetch_run`),
    while the model and the data are read."""
    if cache == "off":
        return None
    from circle_jax.train.programs import ProgramCache

    programs = ProgramCache(os.path.join(cache, "programs"))
    loading = programs.prefetch_run(run_name(run))
    if loading:
        log(1, f"loading the {loading} compiled programs this run used last time")
    return programs


def run_name(run: TrainRun) -> str:
    """What names a run for its program cache's record: its flags but the number of epochs
    and the verbosity, which change no program, and each file it reads by absolute path,
    size and modification time (a file changed since is another run)."""
    from circle_jax.train.programs import describe_config

    files = []
    for f in run.input_files():
        with contextlib.suppress(OSError):  # a missing file fails later, with its own line
            st = os.stat(f)
            files.append(f"{os.path.abspath(f)}:{st.st_size}:{st.st_mtime_ns}")
    flags = replace(run, train={**run.train, "epochs": None}, verbosity=0)
    return describe_config([flags, files])


#: imported before a run's clock starts, as onert_train's phases leave out its start-up
#: (the programs' load, begun by then, goes on beside them)
TRAINING_MODULES = ("circle_jax.train.config", "circle_jax.train.loop", "circle_jax.distributed")


def _train(run: TrainRun, log: Log, cache: str, programs: ProgramCache | None) -> int:
    for module in TRAINING_MODULES:
        importlib.import_module(module)
    from circle_jax.train import TrainConfig

    clock = Clock()
    clock.mark("start")
    model = training_model(run)
    clock.mark("MODEL_LOAD")
    log(1, f"loaded {run.model or 'the example'}: {len(model.operators)} operators, "
        f"{len(model.params)} params, in {clock.ms('start', 'MODEL_LOAD'):.1f} ms")
    xs, y = training_data(run, model, log)
    log(1, f"data: {y.shape[0]} samples, inputs {[list(a.shape[1:]) for a in xs]}, "
        f"expected {list(y.shape[1:])}")
    cfg = TrainConfig(**{k: v for k, v in run.train.items() if v is not None})
    cfg = cfg.with_defaults(model)
    trainer = _checked_trainer(run, model, cfg, len(y))
    print(out.parameter_block(**_parameters(run, model, cfg)), flush=True)
    _log_trainable(log, model, cfg)
    result = _fit(run, model, xs, y, trainer, clock, log, programs)
    clock.mark("EXECUTE")
    _export(run, model, result, log)
    if programs is not None:  # after the exports: a resumed checkpoint rewritten is named anew
        programs.remember_run(run_name(run))
        for why in programs.write_errors:
            print(f"W: the compile cache could not keep this run's compiled programs in "
                  f"{str(programs.directory)!r} ({why}); the next run compiles them again",
                  file=sys.stderr, flush=True)
    print(out.timing_summary(_timing(clock, result.history, cache)))
    if run.mem_poll:
        print(out.memory_summary(clock.rss_kb, _memory_kb("VmHWM")))
    if run.example and result.history.val_accuracy:
        print(f"held-out accuracy (last 20% of the digits): "
              f"{result.history.val_accuracy[-1]:.4f}")
    return 0


def training_model(run: TrainRun) -> Any:
    if not run.example:
        return load_model(run.model or "", **run.load)
    import circle_jax as cj
    from circle_jax.examples import branching_cnn

    return cj.load(branching_cnn().to_bytes("circle"), **run.load)


def training_data(run: TrainRun, model: Any, log: Log | None = None
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """(inputs, expected) from the data files (or the bundled digits for ``--example``)."""
    if run.example and not run.data.inputs:
        from circle_jax.examples import digits

        x, y = digits()
        return [x], y
    from circle_jax.train.config import output_index

    sparse = run.train.get("loss") == "sparse_categorical_crossentropy"
    return labelled_data(run.data, model, sparse,
                         output_index(model, run.train.get("loss_output", 0)), log)


def labelled_data(files: DataFiles, model: Any, sparse: bool = False, output: int = 0,
                  log: Log | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(inputs, targets of model output ``output``) from the files (``sparse``: class
    indices, one per position: the output's shape without its class axis). Sample counts
    are compared before values are checked, so that a raw file of another dtype is named
    as such; ``log`` hears of lossless casts (-v 1). A .npy/.npz input in the integer dtype
    a dequantized or QAT model's file stores it in is those integers (`model_input`)."""
    if not files.inputs or not files.expected:
        raise CliError("data missing: give --load_input:raw FILE and --load_expected:raw FILE "
                       "(or --load_input/--load_expected .npy/.npz)")
    from circle_jax.formats.rawdata import check_same_count
    from circle_jax.train.data import model_input

    in_specs = [(s.shape[1:], s.dtype) for s in model.inputs]
    numpy_file = os.path.splitext(files.inputs)[1].lower() in (".npy", ".npz")
    keep = [(s.shape[1:], None if s.stored and numpy_file and not files.inputs_raw
             else s.dtype) for s in model.inputs]  # stored integers: model_input reads them
    xs = read_data(files.inputs, keep, input_names(model), raw=files.inputs_raw, log=log,
                   finite=False)
    notice = None if log is None else (lambda line: log(1, line))
    xs = [model_input(s, a, f"the data of input {s.name!r} in {files.inputs!r}", notice)
          for s, a in zip(model.inputs, xs)]
    o = model.outputs[output]
    ex_specs = [(o.shape[1:-1], np.int32) if sparse else (o.shape[1:], o.dtype)]
    ys = read_data(files.expected, ex_specs, None, raw=files.expected_raw, log=log,
                   finite=False)
    try:
        check_same_count(xs, ys)
    except DataError as e:  # a raw file of another dtype holds another count of samples
        raise DataError(f"{e}{_count_hint(files, in_specs, ex_specs, len(xs[0]), len(ys[0]))}"
                        ) from None
    check_finite_data(files.inputs, xs, in_specs, counted=True)
    check_finite_data(files.expected, ys, ex_specs, counted=True)
    return xs, ys[0]


def _count_hint(files: DataFiles, in_specs: list, ex_specs: list, n_in: int, n_ex: int) -> str:
    """What a raw file's size would fit if it were another dtype: the other file's count
    of samples (raw files carry no dtype); "" when neither file's size says so."""
    from circle_jax.formats.rawdata import size_hint

    for which, path, specs, samples in (("input", files.inputs, in_specs, n_ex),
                                        ("expected", files.expected, ex_specs, n_in)):
        if path and os.path.splitext(path)[1].lower() not in (".npy", ".npz"):
            found = size_hint(os.path.getsize(path), specs, samples)
            if found:
                return f"; the {which} file's {found}"
    return ""


def _trainable_ops(cfg: Any) -> int | None:
    """onert's num_of_trainable_ops for the parameter block (-1 all, 0 none, N); None for
    params chosen by name (a new head and adapters, circle+'s operator list), which the
    block's ``trainable`` line lists instead."""
    spec = cfg.trainable
    if isinstance(spec, int) and not isinstance(spec, bool):
        return spec
    return {"all": -1, "none": 0}.get(spec) if isinstance(spec, str) else None


def _checked_trainer(run: TrainRun, model: Any, cfg: Any, samples: int) -> Any:
    """The run's `Trainer` (on ``--devices`` / the processes' devices), refusing, before
    the parameter block and any compiling, what would fail later: the trainer's own checks
    (optimizer hyper-parameters, precision, loss scale, trainable params, a batch the
    devices do not split), operator counts, the steps that accumulation needs, output
    sizes and what circle+ cannot hold."""
    from circle_jax.distributed import DataParallel
    from circle_jax.train import Trainer
    from circle_jax.train.data import training_samples
    from circle_jax.train.loop import check_updates, steps_per_epoch

    n_ops, spec = len(model.operators), cfg.trainable
    if isinstance(spec, int) and spec > n_ops:  # named as the flag, before the trainer's
        raise CliError(f"--num_of_trainable_ops {spec} exceeds the model's {n_ops} operators")
    trainer = Trainer(model, cfg, placement=DataParallel.of(run.devices))
    if run.resume is None:  # fit's check, before the parameter block
        steps = steps_per_epoch(cfg, training_samples(samples, cfg.validation_split))
        check_updates(cfg, cfg.epochs * steps, steps)
    for index, size in run.output_sizes:
        if index >= len(model.outputs):
            raise CliError(f"--output_sizes: output {index} does not exist (the model has "
                           f"{len(model.outputs)} outputs)")
        _check_output_size(model.outputs[index], index, size)
    if run.outputs.circleplus:
        from circle_jax.checkpoints import traininfo_of

        traininfo_of(trainer)  # fails now rather than after training
    return trainer


def _parameters(run: TrainRun, model: Any, cfg: Any) -> dict[str, Any]:
    import jax

    from circle_jax.losses import get_reduction, loss_name
    from circle_jax.optim import get_policy, hyperparameters, optimizer_name
    from circle_jax.train.config import output_index

    hyper = hyperparameters(cfg.optimizer, model.numerics.optimizers, **cfg.optimizer_kwargs)
    extra = {**{k: f"{v:g}" for k, v in hyper.items()}, "backend": jax.default_backend(),
             **run.extra,
             **model.numerics.as_dict(), **_rewrites(model)}
    if cfg.precision:
        extra["precision"] = str(get_policy(cfg.precision))
    if model.qat_forward is not None:
        extra["qat"] = f"forward {model.qat_forward}, ranges {model.qat_ranges}"
    if not isinstance(cfg.trainable, (int, str)):
        extra["trainable"] = ", ".join(sorted(model.aliases[n] for n in
                                              model.resolve_params(cfg.trainable)))
    if len(model.outputs) > 1 or cfg.loss_output not in (0, "0"):
        index = output_index(model, cfg.loss_output)
        extra["loss_output"] = f"{index} ({model.outputs[index].name})"
    if cfg.ignore_index is not None:
        extra["ignore_index"] = str(cfg.ignore_index)
    return dict(learning_rate=cfg.learning_rate, batch_size=cfg.batch_size,
                loss=loss_name(cfg.loss), reduction=get_reduction(cfg.reduction).value,
                optimizer=optimizer_name(cfg.optimizer), trainable_ops=_trainable_ops(cfg),
                extra=extra)


def _rewrites(model: Any) -> dict[str, str]:
    """Parameter-block lines for the untied copies and added biases the load made."""
    rw, out = model.rewrites, {}
    if rw.untied:
        out["untied_copies"] = str(len(rw.untied))
    if rw.added_bias:
        out["added_biases"] = str(len(rw.added_bias))
    return out


def _log_trainable(log: Log, model: Any, cfg: Any) -> None:
    if log.verbosity < 2:
        return
    from circle_jax.train import select_trainable

    chosen = select_trainable(model, cfg.trainable)
    for name, alias in model.aliases.items():
        log(2, f"  {'train' if name in chosen else 'frozen':6} {alias:14} "
            f"{list(model.params[name].shape)} {name}")


class Reporter:
    """Prints each epoch's line as it ends; on a terminal, a "compiling…" line on stderr
    while the epochs compile, then a bar of the epochs (tqdm, stderr) that the epoch lines
    print above. The bar advances per epoch, from the host: the compiled epochs hold no
    host callback, so a compiled epoch is kept by the program cache in a terminal too."""

    def __init__(self, run: TrainRun, epochs: int, clock: Clock, log: Log) -> None:
        self.run, self.epochs, self.clock, self.log = run, epochs, clock, log
        self.terminal = sys.stderr.isatty()
        self.notice = out.CompileNotice("compiling the training epoch", self.terminal,
                                        run.verbosity >= 1)
        self.bar: Any = None
        self.warned = False
        #: the trainer's program cache (None: off), which says whether the epoch compiled
        self.programs: Any = None
        if self.terminal:
            from tqdm import tqdm

            self.tqdm = tqdm
            tqdm.get_lock()  # made now (a few ms), not in epoch 1

    @property
    def loaded(self) -> bool:
        """Whether every compiled program came from the program cache (nothing compiled)."""
        return self.programs is not None and self.programs.hits > 0 and \
            self.programs.misses == 0

    def on_start(self, h: Any) -> None:
        self.clock.loaded = self.loaded
        self.notice.stop(h.compile_ms, "loading the compiled training epoch from the cache"
                         if self.loaded else None)
        self.clock.mark("PREPARE")
        from circle_jax.lowering import cpu_kernels

        self.log(2, f"CPU kernels: {cpu_kernels.status()}")
        if self.terminal:
            self.bar = self.tqdm(total=self.epochs, unit="epoch", leave=False, file=sys.stderr,
                            dynamic_ncols=True)
            self.ticker = out.Ticker(self.bar.refresh)  # elapsed time moves in long epochs

    def on_epoch(self, epoch: int, h: Any) -> None:
        self.clock.epoch_ends.append(time.perf_counter())
        metric = self.run.metric == 0
        extra = {}
        if self.run.train.get("loss_scale", "none") != "none":
            extra = {"skipped": str(h.skipped[-1]), "loss_scale": f"{h.loss_scale[-1]:g}"}
        line = out.epoch_line(out.EpochResult(
            epoch + 1, self.epochs, h.ms_per_step[-1], h.loss[-1],
            h.accuracy[-1] if metric else None, h.val_loss[-1] if h.val_loss else None,
            h.val_accuracy[-1] if metric and h.val_loss else None, extra))
        if self.bar is None:
            print(line, flush=True)
        else:
            self.bar.write(line, file=sys.stdout)
            self.bar.update(1)
        if h.overflow is not None and not self.warned:  # once: fit records it once
            self.warned = True
            print(f"W: {h.overflow}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self.notice.stop()
        if self.bar is not None:
            self.ticker.stop()
            self.bar.close()


def _check_output_size(spec: Any, index: int, size: int) -> None:
    """CliError unless ``size`` bytes can hold output ``index``'s values: whole elements of
    its dtype, and at least one sample of a static shape (onert_train sizes its output
    buffers with it; circle-jax sizes outputs from the model and only checks)."""
    item = np.dtype(spec.dtype).itemsize
    sample = int(np.prod(spec.shape[1:], dtype=np.int64)) * item
    if size % item or size < sample:
        raise CliError(f"--output_sizes: {size} bytes for output {index} ({spec.name!r}, "
                       f"{spec.dtype} {list(spec.shape)}): expected a multiple of {item} "
                       f"bytes, at least one sample's {sample}")


def _fit(run: TrainRun, model: Any, xs: list, y: np.ndarray, trainer: Any, clock: Clock,
         log: Log, programs: ProgramCache | None) -> Any:
    """Train with ``trainer``, printing epoch lines as they end; the fit result. With the
    compile cache on, the compiled programs are kept in ``programs``
    (`circle_jax.train.programs`)."""
    from circle_jax.train import fit

    trainer.program_cache = programs
    rep = Reporter(run, trainer.config.epochs, clock, log)
    rep.programs = trainer.program_cache
    clock.mark("fit")
    rep.notice.start()
    o = run.outputs
    # the reporter prints fit's LossScaleWarning as one "W:" line; any other, one line too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LossScaleWarning)
        warnings.showwarning = _warning_line
        try:
            if o.checkpoint or run.resume:
                from circle_jax.checkpoints import fit_checkpointed

                return fit_checkpointed(model, xs, y, trainer=trainer, resume=run.resume,
                                        save=o.checkpoint, every_steps=o.checkpoint_every_steps,
                                        order=o.checkpoint_order,
                                        protect=run.input_files(resume=False),
                                        on_epoch=rep.on_epoch, on_start=rep.on_start)
            return fit(model, xs, y, trainer=trainer, on_epoch=rep.on_epoch,
                       on_start=rep.on_start)
        finally:
            rep.stop()


def _warning_line(message: Warning | str, *_: Any, **__: Any) -> None:
    """A warning during training as one ``W:`` line (not Python's file:line format)."""
    print(f"W: {message}", file=sys.stderr, flush=True)


def _timing(clock: Clock, history: Any, cache: str) -> out.Timing:
    """The phases as onert_train names them. PREPARE reads the data and runs everything
    before ``fit``'s ``on_start`` (checking the checkpoint to write and resolving its entry
    order, data to the device, state, compiling every training program); the rest of
    ``fit`` (epochs, validation, checkpoints) is EXECUTE. Epoch 1 also holds the compiled
    programs' first run."""
    compiled = clock.marks["PREPARE"]  # on_start's mark
    starts = [compiled, *clock.epoch_ends[:-1]]
    epoch_ms = [(e - s) * 1000 for s, e in zip(starts, clock.epoch_ends)]
    note = "includes one-time work: the compiled epoch's first run"
    return out.Timing(load_ms=clock.ms("start", "MODEL_LOAD"),
                      prepare_ms=(compiled - clock.marks["MODEL_LOAD"]) * 1000,
                      execute_ms=(clock.epoch_ends[-1] - compiled) * 1000,
                      epoch_ms=epoch_ms, compile_ms=history.compile_ms, cache=cache,
                      first_epoch_note=note, loaded=clock.loaded)


def _export(run: TrainRun, model: Any, result: Any, log: Log) -> None:
    from circle_jax.checkpoints import circleplus_metadata, save_wof
    from circle_jax.distributed import is_main_process
    from circle_jax.formats.atomic import atomic_write

    o, protect = run.outputs, run.input_files()
    if not is_main_process():  # one copy of the (replicated) result is written, by process 0
        return
    exports = [(o.circle, "circle", None), (o.tflite, "tflite", None)]
    if o.circleplus:
        exports.append((o.circleplus, "circle", circleplus_metadata(result.trainer)))
    for path, fmt, meta in exports:
        if path:
            data = model.export(result.params, fmt, metadata=meta, merge_adapters=not o.unmerged)
            atomic_write(path, data, protect=protect)
            log(1, f"wrote {path}")
    if o.wof:
        save_wof(o.wof, model, result.params, result.trainer.trainable, protect=protect)
        log(1, f"wrote {o.wof}")
    if o.checkpoint:
        every = (f"every {o.checkpoint_every_steps} steps and " if o.checkpoint_every_steps
                 else "")
        log(1, f"wrote {o.checkpoint} (the checkpoint, rewritten after {every}every epoch; "
            f"last after epoch {len(result.history.loss)})")


def _memory_kb(field_name: str) -> int:
    """This process's VmRSS / VmHWM in KB (Linux), else the peak from getrusage."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
