"""The parsed training command line becomes one checked value, `TrainRun`; nothing edits the
parsed arguments afterwards."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from .common import CliError

#: what ``--example`` sets where the flag is absent
EXAMPLE_DEFAULTS: dict[str, Any] = {
    "epochs": 20, "batch_size": 32, "learning_rate": 0.01, "loss": "categorical_crossentropy",
    "optimizer": "adam", "validation_split": 0.2, "metric": 0,
}


@dataclass(frozen=True)
class DataFiles:
    """Where the training data comes from (``raw``: onert_train's headerless layout)."""

    inputs: str | None
    expected: str | None
    inputs_raw: bool
    expected_raw: bool


@dataclass(frozen=True)
class Outputs:
    """Files written after (or, for checkpoints, during) training."""

    circle: str | None = None
    tflite: str | None = None
    circleplus: str | None = None
    checkpoint: str | None = None
    wof: str | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_order: str = "auto"
    #: --export_unmerged: models written with their LoRA adapter operators
    unmerged: bool = False

    def by_flag(self) -> dict[str, str | None]:
        return {"--export_circle": self.circle, "--export_tflite": self.tflite,
                "--export_circleplus": self.circleplus,
                "--export_checkpoint": self.checkpoint, "--export_wof": self.wof}


@dataclass(frozen=True)
class TrainRun:
    """A whole ``train`` invocation: the model, data, training config, files and reporting.

    ``train`` holds `circle_jax.TrainConfig` keyword arguments; ``None`` values take the
    model's circle+ values, then the library's defaults (`TrainConfig.with_defaults`).
    """

    model: str | None
    example: bool
    data: DataFiles
    train: dict[str, Any]
    outputs: Outputs
    resume: str | None = None
    metric: int = -1
    verbosity: int = 0
    mem_poll: bool = False
    output_sizes: tuple[tuple[int, int], ...] = ()
    compile_cache: str | None = None
    devices: int | None = None
    #: (coordinator HOST:PORT, number of processes, this process's id) of a multi-process run
    processes: tuple[str, int, int] | None = None
    extra: dict[str, str] = field(default_factory=dict)
    #: `circle_jax.load` keywords: numerics, tie_shared_weights, add_missing_bias
    load: dict[str, Any] = field(default_factory=dict)

    def input_files(self, resume: bool = True) -> list[str]:
        """The files the run reads, which no output overwrites (``resume=False``: but the
        checkpoint it resumes from, which --export_checkpoint may rewrite)."""
        files = [self.model, self.data.inputs, self.data.expected,
                 self.resume if resume else None]
        return [f for f in files if f]


def train_run(ns: argparse.Namespace) -> TrainRun:
    """Check the parsed flags and gather them into a `TrainRun`."""
    train = _train_config(ns)
    metric = -1 if ns.metric is None else ns.metric
    if ns.example and ns.model:
        raise CliError(f"--example trains the bundled model; drop {ns.model!r} or --example")
    if ns.example:
        metric = EXAMPLE_DEFAULTS["metric"] if ns.metric is None else metric
        train = {k: EXAMPLE_DEFAULTS[k] if train.get(k) is None and k in EXAMPLE_DEFAULTS
                 else v for k, v in train.items()}
    elif not ns.model:
        raise CliError("no model given: MODEL is a .circle/.tflite file or an nnpackage "
                       "directory (or --example)")
    run = TrainRun(model=ns.model, example=ns.example, data=data_files(ns), train=train,
                   outputs=_outputs(ns), resume=ns.checkpoint, metric=metric,
                   verbosity=ns.verbose_level or 0, mem_poll=bool(ns.mem_poll),
                   output_sizes=ns.output_sizes or (), compile_cache=ns.compile_cache,
                   devices=ns.devices, processes=_processes(ns), extra=_extra(ns),
                   load=load_options(ns))
    _check_files(run)
    return run


def load_options(ns: argparse.Namespace, qat: bool | str | None = "auto") -> dict[str, Any]:
    """`circle_jax.load` keywords from --numerics, --tie_shared_weights, --add_missing_bias,
    --signature, --restore, --dequantize, --qat, --qat_forward, --qat_ranges,
    --qat_range_decay and the personalizing flags
    (--new_head, --lora, ... with --seed). ``qat`` is the load's ``qat=`` when --qat is not
    given: "auto" (QAT for a fully quantized model) where weights train or come from a QAT
    run, None (the file's integer kernels, exact to LiteRT) to score the file as it is;
    with --dequantize, None. --qat on asks for QAT: a model without quantized activations
    is then refused, as are QAT flags a run cannot use (`circle_jax.load`)."""
    options = {"numerics": ns.numerics or "onert",
               "tie_shared_weights": True if ns.tie_shared_weights else None,
               "add_missing_bias": ns.add_missing_bias,
               "signature": ns.signature,
               "restore": getattr(ns, "restore", None),
               "dequantize": True if getattr(ns, "dequantize", False) else None,
               "qat": {"on": True, "off": False}.get(
                   getattr(ns, "qat", None),
                   None if getattr(ns, "dequantize", False) else qat),
               "qat_forward": getattr(ns, "qat_forward", None),
               "qat_ranges": getattr(ns, "qat_ranges", None),
               "qat_range_decay": getattr(ns, "qat_range_decay", None)}
    if getattr(ns, "lora", 0) is None and (ns.lora_alpha is not None
                                           or ns.lora_targets is not None
                                           or ns.export_unmerged):
        raise CliError("--lora_alpha, --lora_targets and --export_unmerged need --lora R")
    if getattr(ns, "new_head", None) is not None or getattr(ns, "lora", None) is not None:
        options.update(new_head=ns.new_head, seed=ns.seed or 0, lora=ns.lora,
                       lora_alpha=ns.lora_alpha, lora_targets=ns.lora_targets or "all")
    return options


def _positive(ns: argparse.Namespace, name: str, flag: str, minimum: int = 1) -> None:
    value = getattr(ns, name)
    if value is not None and value < minimum:
        raise CliError(f"{flag} must be >= {minimum}, got {value}")


def _train_config(ns: argparse.Namespace) -> dict[str, Any]:
    for name, flag in (("epoch", "--epoch"), ("batch_size", "--batch_size"),
                       ("accumulate", "--accumulate"),
                       ("checkpoint_every_steps", "--checkpoint_every_steps"),
                       ("devices", "--devices")):
        _positive(ns, name, flag)
    split = ns.validation_split
    if split is not None and not 0.0 <= split < 1.0:
        raise CliError(f"--validation_split must be in [0, 1), got {split}")
    return dict(
        epochs=ns.epoch, batch_size=ns.batch_size, **step_config(ns),
        validation_split=split, shuffle=ns.shuffle, seed=ns.seed or 0,
        drop_remainder=not ns.keep_remainder, accumulate=ns.accumulate or 1,
        accumulate_mode=ns.accumulate_mode or "stream", precision=ns.precision,
        loss_scale=ns.loss_scale or "none", on_overflow=ns.on_overflow or "skip",
    )


def step_config(ns: argparse.Namespace) -> dict[str, Any]:
    """`circle_jax.TrainConfig` keywords of one step: learning rate, loss, reduction,
    optimizer and its hyper-parameters, what trains, whether the loss reads logits (None:
    circle+, then defaults)."""
    trainable: Any = ns.num_of_trainable_ops
    if trainable is not None and trainable < -1:  # onert: an incorrect state
        raise CliError(f"--num_of_trainable_ops must be -1 (all), 0 (none) or N (the last N "
                       f"operators), got {trainable}")
    if ns.trainable and trainable is not None:
        raise CliError("give --num_of_trainable_ops or --trainable, not both")
    if ns.trainable:
        trainable = [n for value in ns.trainable for n in value.split(",") if n]
    from circle_jax.optim import HYPERPARAMETERS

    hyper = {kw: getattr(ns, flag) for flag, kw in HYPERPARAMETERS.items()
             if getattr(ns, flag, None) is not None}
    return dict(learning_rate=ns.learning_rate, loss=ns.loss, reduction=ns.loss_reduction_type,
                optimizer=ns.optimizer, from_logits=True if ns.from_logits else None,
                trainable=trainable, loss_output=ns.loss_output or 0, optimizer_kwargs=hyper,
                ignore_index=ns.ignore_index)


def _processes(ns: argparse.Namespace) -> tuple[str, int, int] | None:
    flags = {"--coordinator_address": ns.coordinator_address,
             "--num_processes": ns.num_processes, "--process_id": ns.process_id}
    given = [f for f, v in flags.items() if v is not None]
    if not given:
        return None
    if len(given) < len(flags):
        raise CliError(f"multi-process training needs {', '.join(flags)} together; "
                       f"{', '.join(f for f in flags if f not in given)} missing")
    _positive(ns, "num_processes", "--num_processes")
    _positive(ns, "process_id", "--process_id", minimum=0)
    if ns.process_id >= ns.num_processes:
        raise CliError(f"--process_id {ns.process_id} must be below --num_processes "
                       f"{ns.num_processes}")
    return ns.coordinator_address, ns.num_processes, ns.process_id


def data_files(ns: argparse.Namespace) -> DataFiles:
    for a, b in (("--load_input:raw", "--load_input"), ("--load_expected:raw", "--load_expected")):
        if getattr(ns, a[2:].replace(":", "_")) and getattr(ns, b[2:]):
            raise CliError(f"give {a} or {b}, not both")
    return DataFiles(ns.load_input_raw or ns.load_input, ns.load_expected_raw or ns.load_expected,
                     bool(ns.load_input_raw), bool(ns.load_expected_raw))


def _outputs(ns: argparse.Namespace) -> Outputs:
    if ns.checkpoint_every_steps is not None and not ns.export_checkpoint:
        raise CliError("--checkpoint_every_steps needs --export_checkpoint FILE")
    return Outputs(ns.export_circle, ns.export_tflite, ns.export_circleplus,
                   ns.export_checkpoint, ns.export_wof, ns.checkpoint_every_steps,
                   ns.checkpoint_order or "auto", bool(ns.export_unmerged))


def _extra(ns: argparse.Namespace) -> dict[str, str]:
    """Parameter-block lines beyond onert_train's, for the settings it lacks."""
    extra = {}
    if (ns.accumulate or 1) > 1:
        extra["accumulate"] = f"{ns.accumulate} ({ns.accumulate_mode or 'stream'})"
    if ns.devices is not None or ns.num_processes is not None:
        extra["devices"] = (f"{ns.devices or 'all'}"
                            + (f" over {ns.num_processes} processes" if ns.num_processes else ""))
    if ns.loss_scale not in (None, "none"):
        extra["loss_scale"] = f"{ns.loss_scale} (on overflow: {ns.on_overflow or 'skip'})"
    if ns.new_head is not None:
        extra["new_head"] = f"{ns.new_head} classes (seed {ns.seed or 0})"
    if ns.lora is not None:
        alpha = ns.lora if ns.lora_alpha is None else ns.lora_alpha
        extra["lora"] = (f"rank {ns.lora}, alpha {alpha:g}, targets {ns.lora_targets or 'all'}"
                         + (", exported unmerged" if ns.export_unmerged else ", merged"))
    return extra


def _check_files(run: TrainRun) -> None:
    import os

    from .common import check_outputs

    check_outputs(run.outputs.by_flag(), run.input_files(),
                  {"--export_checkpoint": run.resume})
    if run.resume and not os.path.exists(run.resume):
        raise CliError(f"checkpoint file {run.resume!r} does not exist")
