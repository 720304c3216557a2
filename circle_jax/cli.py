"""``circle-jax``: train (an onert_train drop-in), info, run, export and traininfo.

Errors print one line ``E: <what is wrong>`` and exit non-zero; no output file is left
half-written (every write is atomic).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

ONERT_LOSS = {1: "mean_squared_error", 2: "categorical_crossentropy"}
ONERT_REDUCTION = {1: "sum_over_batch_size", 2: "sum"}
ONERT_OPTIMIZER = {1: "sgd", 2: "adam"}
READABLE_LOSS = {"mse": "mean_squared_error", "cce": "categorical_crossentropy",
                 "sparse_cce": "sparse_categorical_crossentropy"}


class CliError(Exception):
    """A user error: printed as one ``E:`` line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"E: {message} (see circle-jax {self.prog.split()[-1]} --help)", file=sys.stderr)
        raise SystemExit(2)


def _choice(table: dict[int, str], readable: dict[str, str] | Sequence[str], what: str):
    """An argparse type accepting onert's numeric codes or readable names."""
    names = dict(readable) if isinstance(readable, dict) else {n: n for n in readable}

    def parse(value: str) -> str | int:
        if value.lstrip("-").isdigit() and int(value) in table:
            return int(value)  # onert's code: selects onert's numerics (e.g. CCE's clip)
        if value in names:
            return names[value]
        if value in names.values():
            return value
        codes = ", ".join(f"{k}={v}" for k, v in table.items())
        raise argparse.ArgumentTypeError(
            f"invalid {what} {value!r}: expected {codes} or one of {', '.join(names)}")

    return parse


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model (onert_train's flags and output)")
    p.add_argument("model", nargs="?", help=".circle/.tflite model file")
    p.add_argument("--example", action="store_true",
                   help="train the bundled branching CNN on the bundled 8x8 digits")
    p.add_argument("--epoch", type=int, help="epochs (default 5; 20 with --example)")
    p.add_argument("--batch_size", type=int)
    p.add_argument("--learning_rate", type=float)
    p.add_argument("--loss", type=_choice(ONERT_LOSS, READABLE_LOSS, "loss"))
    p.add_argument("--loss_reduction_type",
                   type=_choice(ONERT_REDUCTION, ["sum_over_batch_size", "sum"], "reduction"))
    p.add_argument("--optimizer", type=_choice(
        ONERT_OPTIMIZER, ["sgd", "adam", "adamw", "rmsprop", "momentum", "nesterov",
                          "adam_optax", "adam_onert_micro"], "optimizer"))
    p.add_argument("--from_logits", action="store_true", default=None)
    p.add_argument("--num_of_trainable_ops", type=int)
    p.add_argument("--validation_split", type=float, default=0.0)
    p.add_argument("--metric", type=int, choices=[0], help="0: categorical accuracy")
    p.add_argument("--load_input:raw", dest="load_input_raw", metavar="FILE")
    p.add_argument("--load_expected:raw", dest="load_expected_raw", metavar="FILE")
    p.add_argument("--load_input", metavar="FILE", help=".npy/.npz/raw input data")
    p.add_argument("--load_expected", metavar="FILE", help=".npy/.npz/raw expected data")
    p.add_argument("--export_circle", metavar="FILE", help="write the trained model (.circle)")
    p.add_argument("--export_tflite", metavar="FILE",
                   help="write the trained model as .tflite (LiteRT runs it)")
    p.add_argument("--export_circleplus", metavar="FILE",
                   help="write the trained model with its training parameters (circle+)")
    p.add_argument("--export_checkpoint", metavar="FILE",
                   help="write an onert checkpoint after every epoch (or --checkpoint_every_steps)")
    p.add_argument("--checkpoint_every_steps", type=int, metavar="N",
                   help="rewrite --export_checkpoint every N steps instead")
    p.add_argument("--checkpoint_order", choices=["auto", "onert", "ascending"],
                   default="auto", help="entry order of --export_checkpoint: onert's (so "
                   "onert_train imports it; asks the onert wheel), ascending tensor index, or "
                   "auto: onert's when the onert wheel can tell (default)")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="resume from an onert checkpoint (weights, Adam m/v, step)")
    p.add_argument("--export_wof", metavar="FILE", help="write the trained weights as .wof")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--keep_remainder", action="store_true",
                   help="train on a trailing partial batch (onert drops it)")
    p.add_argument("--accumulate", type=int, default=1, metavar="K")
    p.add_argument("--accumulate_mode", choices=["stream", "in_step"], default="stream")
    p.add_argument("--precision", metavar="POLICY")
    p.add_argument("--loss_scale", default="none", metavar="none|dynamic|FLOAT")
    p.add_argument("--on_overflow", choices=["skip", "retry"], default="skip")
    p.add_argument("-v", "--verbose_level", type=int, default=0)
    p.add_argument("-m", "--mem_poll", type=int, default=0)


def _add_other(sub: Any) -> None:
    p = sub.add_parser("info", help="print a model's summary")
    p.add_argument("model")
    p = sub.add_parser("run", help="run inference; outputs saved as .npy")
    p.add_argument("model")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help=".npy/.npz/raw input (repeat per model input, or one .npz)")
    p.add_argument("--output_dir", default=".", metavar="DIR")
    p = sub.add_parser("export", help="write a model (with weights from a .wof or checkpoint) "
                       "as .circle, .tflite or .wof")
    p.add_argument("model")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--load_wof", metavar="FILE", help="take the weights from a .wof file")
    src.add_argument("--checkpoint", metavar="FILE", help="take the weights from a checkpoint")
    p.add_argument("--circle", metavar="OUT", help="write a .circle file")
    p.add_argument("--tflite", metavar="OUT", help="write a .tflite file (LiteRT runs it)")
    p.add_argument("--wof", metavar="OUT", help="write the float weights as .wof")
    p = sub.add_parser("traininfo", help="print or set circle+ training metadata")
    p.add_argument("model")
    p.add_argument("--set", metavar="JSON", help="circle_plus_gen-style hyper-parameters")
    p.add_argument("-o", "--output", metavar="FILE")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="circle-jax", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_train(sub)
    _add_other(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import CircleJaxError

    try:
        return {"train": cmd_train, "info": cmd_info, "run": cmd_run, "export": cmd_export,
                "traininfo": cmd_traininfo}[args.command](args)
    except (CliError, CircleJaxError, ValueError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"E: {msg}", file=sys.stderr)
        return 1


# -- commands ------------------------------------------------------------------------------
def _load(path: str) -> Any:
    import circle_jax as cj

    if not os.path.exists(path):
        raise CliError(f"model file {path!r} does not exist")
    return cj.load(path)


def cmd_info(args: argparse.Namespace) -> int:
    from .io.reader import read_model
    from .lower import param_table, unsupported_operators
    from .model import summarize

    m = read_model(args.model)
    print(summarize(m, param_table(m)))
    missing = unsupported_operators(m)
    if missing:
        print(f"\nunsupported operators ({len(missing)}): " + "; ".join(missing))
    return 0


def _data(path: str, specs: list[tuple[tuple[int, ...], Any]], names: list[str] | None,
          raw: bool = False) -> list[np.ndarray]:
    from .io.rawdata import load_array_file, read_raw

    if not os.path.exists(path):
        raise CliError(f"data file {path!r} does not exist")
    return read_raw(path, specs) if raw else load_array_file(path, specs, names)


def cmd_run(args: argparse.Namespace) -> int:
    import jax

    from .io.atomic import atomic_write

    model = _load(args.model)
    specs = [(s.shape[1:], s.dtype) for s in model.inputs]
    names = [s.name for s in model.inputs]
    if len(args.input) == 1:
        xs = _data(args.input[0], specs, names)
    elif len(args.input) == len(specs):
        xs = [_data(f, [s], None)[0] for f, s in zip(args.input, specs)]
    else:
        raise CliError(f"the model has {len(specs)} inputs, got {len(args.input)} --input files")
    outs = jax.jit(model.apply)(model.params, *xs)
    os.makedirs(args.output_dir, exist_ok=True)
    for k, (spec, out) in enumerate(zip(model.outputs, outs)):
        path = os.path.join(args.output_dir, f"output_{k}.npy")
        atomic_write(path, functools.partial(np.save, arr=np.asarray(out)))
        print(f"output {k} {spec.name!r}: {list(np.shape(out))} -> {path}")
    return 0


def cmd_traininfo(args: argparse.Namespace) -> int:
    from .io.atomic import atomic_write
    from .io.reader import read_model
    from .io.traininfo import encode_traininfo, traininfo_from_json
    from .io.writer import export_model

    m = read_model(args.model)
    if args.set is None:
        if "CIRCLE_TRAINING" not in m.metadata:
            print(f"{args.model}: no CIRCLE_TRAINING metadata")
            return 0
        print(format_traininfo(m))
        return 0
    if not args.output:
        raise CliError("--set needs -o OUT (the input model is never modified)")
    _check_outputs({"-o": args.output}, [args.model, args.set])
    with open(args.set) as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise CliError(f"{args.set}: not valid JSON ({e})") from None
    info = traininfo_from_json(obj, len(m.main.operators))
    data = export_model(m, metadata={"CIRCLE_TRAINING": encode_traininfo(info)})
    atomic_write(args.output, data, protect=args.model)
    print(f"wrote {args.output}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .io.atomic import atomic_write
    from .state_io import checkpoint_params, load_wof, save_wof

    outputs = {"--circle": args.circle, "--tflite": args.tflite, "--wof": args.wof}
    if not any(outputs.values()):
        raise CliError("nothing to write: give --circle OUT, --tflite OUT and/or --wof OUT")
    inputs = [p for p in (args.model, args.load_wof, args.checkpoint) if p]
    _check_outputs(outputs, inputs)
    model = _load(args.model)
    params = model.params
    if args.load_wof:
        params = load_wof(args.load_wof, model)
    elif args.checkpoint:
        params = checkpoint_params(args.checkpoint, model)
    for flag, fmt in (("--circle", "circle"), ("--tflite", "tflite")):
        if outputs[flag]:
            atomic_write(outputs[flag], model.export(params, fmt), protect=inputs)
            print(f"wrote {outputs[flag]}")
    if args.wof:
        save_wof(args.wof, model, params, protect=inputs)
        print(f"wrote {args.wof}")
    return 0


def _check_outputs(outputs: dict[str, str | None], inputs: Sequence[str | None],
                   allowed: dict[str, str | None] | None = None) -> None:
    """Refuse, before any work, outputs that are inputs, repeat, or lie in no directory.

    ``allowed[flag]`` is an input that output ``flag`` may rewrite (a checkpoint it resumes).
    """
    allowed = allowed or {}
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        for src in inputs:
            if src and src != allowed.get(flag) and _same_path(src, path):
                raise CliError(f"refusing to write {flag} {path!r}: it is the input file "
                               f"{src!r}; choose a different output path")
        full = os.path.realpath(path)
        if full in seen:
            raise CliError(f"{seen[full]} and {flag} both write {path!r}; give different paths")
        seen[full] = flag
        if os.path.isdir(path):
            raise CliError(f"cannot write {flag} {path!r}: it is a directory, expected a file")
        directory = os.path.dirname(full)
        if not os.path.isdir(directory):
            raise CliError(f"cannot write {flag} {path!r}: directory {directory!r} does not "
                           "exist")


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def format_traininfo(m: Any) -> str:
    from .io.traininfo import decode_traininfo, traininfo_to_json

    info = decode_traininfo(m.metadata["CIRCLE_TRAINING"])
    lines = [f"{k:20} = {v}" for k, v in vars(info).items()]
    lines.append("circle_plus_gen JSON = " + json.dumps(
        traininfo_to_json(info, len(m.main.operators))))
    return "\n".join(lines)


def _print_params(cfg: Any, trainable_ops: int, extra: dict[str, str]) -> None:
    loss = cfg_loss_text(cfg)
    print("== training parameter ==")
    print(f"- {'learning_rate':20} = {cfg.learning_rate:g}")
    print(f"- {'batch_size':20} = {cfg.batch_size}")
    print(f"- {'loss_info':20} = {{loss = {loss}, reduction = "
          f"{str(cfg_reduction(cfg)).replace('_', ' ')}}}")
    print(f"- {'optimizer':20} = {cfg_optimizer(cfg)}")
    print(f"- {'num_of_trainable_ops':20} = {trainable_ops}")
    for k, v in extra.items():
        print(f"- {k:20} = {v}")
    print("========================")


def cfg_loss_text(cfg: Any) -> str:
    from .losses import loss_name

    return loss_name(cfg.loss).replace("_", " ")


def cfg_reduction(cfg: Any) -> str:
    from .losses import get_reduction

    return get_reduction(cfg.reduction).value


def cfg_optimizer(cfg: Any) -> str:
    from .optim import optimizer_name

    return optimizer_name(cfg.optimizer)


def cmd_train(args: argparse.Namespace) -> int:
    import jax

    from .train import TrainConfig, fit

    t0 = time.perf_counter()
    if args.example:
        import circle_jax as cj

        from .examples import branching_cnn, digits

        model = cj.load(branching_cnn().to_bytes("circle"))
        x, y = digits()
        xs = [x]
        defaults = {"batch_size": 32, "learning_rate": 0.01, "loss": "categorical_crossentropy",
                    "optimizer": "adam", "validation_split": 0.2}
        for k, v in defaults.items():
            if getattr(args, k, None) in (None, 0.0):
                setattr(args, k, v)
        if args.metric is None:
            args.metric = 0
        if args.epoch is None:
            args.epoch = 20
    else:
        if not args.model:
            raise CliError("no model given: circle-jax train MODEL [options] (or --example)")
        model = _load(args.model)
        xs, y = _train_data(args, model)
    load_ms = (time.perf_counter() - t0) * 1000
    n_ops = len(model.operators)
    config = TrainConfig(
        epochs=5 if args.epoch is None else args.epoch, batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        loss=args.loss, reduction=args.loss_reduction_type, from_logits=args.from_logits,
        optimizer=args.optimizer, trainable=args.num_of_trainable_ops,
        validation_split=args.validation_split, shuffle=args.shuffle, seed=args.seed,
        drop_remainder=not args.keep_remainder, accumulate=args.accumulate,
        accumulate_mode=args.accumulate_mode, precision=args.precision,
        loss_scale=args.loss_scale, on_overflow=args.on_overflow,
    )
    if config.epochs < 1:
        raise CliError(f"--epoch must be >= 1, got {config.epochs}")
    trainer_cfg = config.with_defaults(model)
    if trainer_cfg.batch_size < 1:
        raise CliError(f"--batch_size must be >= 1, got {trainer_cfg.batch_size}")
    spec = trainer_cfg.trainable
    n_trainable = spec if isinstance(spec, int) else (-1 if spec == "all" else
                                                       (0 if spec == "none" else len(spec)))
    if isinstance(n_trainable, int) and n_trainable > n_ops:
        raise CliError(f"--num_of_trainable_ops {n_trainable} exceeds the model's {n_ops} "
                       "operators")
    extra = {"backend": jax.default_backend()}
    if config.accumulate > 1:
        extra["accumulate"] = f"{config.accumulate} ({config.accumulate_mode})"
    if config.precision:
        from .optim import get_policy

        extra["precision"] = str(get_policy(config.precision))
    if config.loss_scale != "none":
        extra["loss_scale"] = f"{config.loss_scale} (on overflow: {config.on_overflow})"
    x_files = [args.load_input_raw or args.load_input, args.load_expected_raw or args.load_expected]
    inputs = [args.model, *x_files, args.checkpoint]
    outputs = {"--export_circle": args.export_circle, "--export_tflite": args.export_tflite,
               "--export_circleplus": args.export_circleplus,
               "--export_checkpoint": args.export_checkpoint, "--export_wof": args.export_wof}
    _check_outputs(outputs, inputs, {"--export_checkpoint": args.checkpoint})
    if args.checkpoint_every_steps is not None and not args.export_checkpoint:
        raise CliError("--checkpoint_every_steps needs --export_checkpoint FILE")
    if args.checkpoint and not os.path.exists(args.checkpoint):
        raise CliError(f"checkpoint file {args.checkpoint!r} does not exist")
    if args.export_circleplus:
        from .state_io import traininfo_of
        from .train import Trainer

        traininfo_of(Trainer(model, trainer_cfg))  # fails now rather than after training
    _print_params(trainer_cfg, n_trainable, extra)

    bar = _progress_bar() if sys.stdout.isatty() else None

    def report(epoch: int, h: Any) -> None:
        if bar is not None:
            print("\r\033[K", end="")  # clear the progress bar's line
        line = (f"Epoch {epoch + 1}/{config.epochs} - time: {h.ms_per_step[-1]:.3f}ms/step"
                f" - loss: [0] {h.loss[-1]:.4f}")
        if args.metric == 0:
            line += f" - categorical_accuracy: [0] {h.accuracy[-1]:.4f}"
        if h.val_loss:
            line += f" - val_loss: [0] {h.val_loss[-1]:.4f}"
            if args.metric == 0:
                line += f" - val_categorical_accuracy: [0] {h.val_accuracy[-1]:.4f}"
        if config.loss_scale != "none":
            line += f" - skipped: {h.skipped[-1]} - loss_scale: {h.loss_scale[-1]:g}"
        print(line, flush=True)

    t1 = time.perf_counter()
    if args.export_checkpoint or args.checkpoint:
        from .state_io import fit_checkpointed

        result = fit_checkpointed(model, xs, y, trainer_cfg, resume=args.checkpoint,
                                  save=args.export_checkpoint,
                                  every_steps=args.checkpoint_every_steps,
                                  order=args.checkpoint_order,
                                  protect=[p for p in inputs[:3] if p], on_epoch=report)
    else:
        result = fit(model, xs, y, trainer_cfg, on_epoch=report, progress=bar)
    execute_ms = (time.perf_counter() - t1) * 1000
    h = result.history
    _export_trained(args, model, result, [p for p in inputs if p])
    print("===================================")
    print(f"{'MODEL_LOAD':12} takes {load_ms:.4f} ms")
    print(f"{'PREPARE':12} takes {h.compile_ms:.4f} ms")
    print(f"{'EXECUTE':12} takes {execute_ms:.4f} ms")
    for i, (ms, steps) in enumerate(zip(h.ms_per_step, h.steps)):
        print(f"- {'Epoch ' + str(i + 1):12} takes {ms * steps:.4f} ms")
    print("===================================")
    if args.example and h.val_accuracy:
        print(f"held-out accuracy (last 20% of the digits): {h.val_accuracy[-1]:.4f}")
    return 0


def _export_trained(args: argparse.Namespace, model: Any, result: Any,
                    inputs: list[str]) -> None:
    from .io.atomic import atomic_write
    from .state_io import circleplus_metadata, save_wof

    exports = [(args.export_circle, "circle", None), (args.export_tflite, "tflite", None)]
    if args.export_circleplus:
        exports.append((args.export_circleplus, "circle", circleplus_metadata(result.trainer)))
    for path, fmt, meta in exports:
        if path:
            data = model.export(result.params, fmt, metadata=meta)
            atomic_write(path, data, protect=inputs)
    if args.export_wof:
        save_wof(args.export_wof, model, result.params, result.trainer.trainable,
                 protect=inputs)


def _progress_bar(width: int = 30) -> Any:
    """A ``progress(done, total)`` that draws ``[=====>    ] done/total`` on the terminal."""

    def draw(done: Any, total: Any) -> None:
        done, total = int(done), int(total)
        filled = width * done // max(total, 1)
        print(f"\r[{'=' * filled}{'>' if filled < width else ''}"
              f"{' ' * (width - filled - 1)}] {done}/{total}", end="", flush=True)

    return draw


def _train_data(args: argparse.Namespace, model: Any) -> tuple[list[np.ndarray], np.ndarray]:
    in_specs = [(s.shape[1:], s.dtype) for s in model.inputs]
    out = model.outputs[0]
    out_specs = [(out.shape[1:], out.dtype)]
    x_file = args.load_input_raw or args.load_input
    y_file = args.load_expected_raw or args.load_expected
    if not x_file or not y_file:
        raise CliError("training data missing: give --load_input:raw FILE and "
                       "--load_expected:raw FILE (or --load_input/--load_expected .npy/.npz)")
    xs = _data(x_file, in_specs, [s.name for s in model.inputs], raw=bool(args.load_input_raw))
    if args.loss == "sparse_categorical_crossentropy":
        out_specs = [((), np.int32)]
    ys = _data(y_file, out_specs, None, raw=bool(args.load_expected_raw))
    from .io.rawdata import check_same_count

    check_same_count(xs, ys)
    return xs, ys[0]


if __name__ == "__main__":
    raise SystemExit(main())
