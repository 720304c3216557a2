"""``export``: write a model, with weights from a .wof or a checkpoint, as .circle/.tflite/.wof;
with ``--training_graph``, its training step as builtin operators (`circle_jax.ondevice`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .common import CliError, check_outputs, load_model
from .config import load_options
from .train_args import (
    add_load_arguments,
    add_personalize_arguments,
    add_selection_arguments,
    add_step_arguments,
)

NAME = "export"
HELP = "write a model (with weights from a .wof or checkpoint) as .circle, .tflite or .wof"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--load_wof", metavar="FILE",
                     help="take the weights from a .wof file (default: the model's)")
    src.add_argument("--checkpoint", metavar="FILE",
                     help="take the weights from an onert checkpoint (default: the model's)")
    p.add_argument("--circle", metavar="OUT", help="write a .circle file (default: none)")
    p.add_argument("--tflite", metavar="OUT",
                   help="write a .tflite file, LiteRT runs it (default: none)")
    p.add_argument("--wof", metavar="OUT", help="write the float weights as .wof (default: none)")
    add_load_arguments(p.add_argument_group("loading (as the run that wrote the weights)"))
    add_personalize_arguments(p.add_argument_group("personalizing (as the run that wrote "
                                                   "the weights)"), seed=True)
    g = p.add_argument_group("training graph (docs/training-files.md): write the training step, "
                             "not the model; --wof writes its initial state")
    g.add_argument("--training_graph", choices=["functional", "signatures"],
                   help="write the training step as builtin operators: functional = subgraph 0 "
                   "is one step (inputs: the model's inputs, the targets, the state; outputs: "
                   "the loss, the new state); signatures = resource variables, signatures "
                   "train, infer, save, restore (default: none, the model is written)")
    g.add_argument("--batch_size", type=int, metavar="N",
                   help="samples per step, the graph's batch (default: the model's circle+ "
                   "value, else 32)")
    g.add_argument("--input_shapes", type=_shapes, metavar="SHAPES",
                   help="each input's shape in the step, batch first, e.g. 1x1760 or "
                   "8x28x28,8x10 (default: the declared ones at --batch_size; needed where "
                   "an input's shape is dynamic past the batch)")
    add_step_arguments(g)
    add_selection_arguments(g)


def _shapes(text: str) -> list[tuple[int, ...]]:
    """``--input_shapes``: shapes separated by commas, dimensions by ``x``."""
    try:
        shapes = [tuple(int(d) for d in s.split("x")) for s in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(d <= 0 for s in shapes for d in s):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected shapes such as 1x1760 or 8x28x28,8x10 (positive sizes)")
    return shapes


_STEP_FLAGS = ("batch_size", "learning_rate", "loss", "loss_reduction_type", "optimizer",
               "num_of_trainable_ops", "trainable", "from_logits", "loss_output", "beta1",
               "beta2", "epsilon", "weight_decay", "momentum", "ignore_index", "input_shapes")


def run(args: argparse.Namespace) -> int:
    from circle_jax.checkpoints import checkpoint_params, load_wof, save_wof
    from circle_jax.formats.atomic import atomic_write

    outputs = {"--circle": args.circle, "--tflite": args.tflite, "--wof": args.wof}
    if not any(outputs.values()):
        raise CliError("nothing to write: give --circle OUT, --tflite OUT and/or --wof OUT")
    inputs = [p for p in (args.model, args.load_wof, args.checkpoint) if p]
    check_outputs(outputs, inputs)
    given = [f"--{f}" for f in _STEP_FLAGS if getattr(args, f, None) not in (None, False)]
    if given and not args.training_graph:
        raise CliError(f"{', '.join(given)}: training-step flag(s); give --training_graph "
                       "functional (or signatures) to write the step")
    model = load_model(args.model, **load_options(args))
    params = model.params
    if args.load_wof:
        params = load_wof(args.load_wof, model)
    elif args.checkpoint:
        params = checkpoint_params(args.checkpoint, model)
    if args.training_graph:
        return _training_graph(args, model, params, outputs, inputs)
    for flag, fmt in (("--circle", "circle"), ("--tflite", "tflite")):
        if outputs[flag]:
            data = model.export(params, fmt, merge_adapters=not args.export_unmerged)
            atomic_write(outputs[flag], data, protect=inputs)
            print(f"wrote {outputs[flag]}")
    if args.wof:
        save_wof(args.wof, model, params, protect=inputs)
        print(f"wrote {args.wof}")
    return 0


def _training_graph(args: argparse.Namespace, model: Any, params: Mapping[str, Any],
                    outputs: Mapping[str, str | None], inputs: list[str]) -> int:
    """Write the training step (every file computed before the first is written)."""
    from circle_jax.formats.atomic import atomic_write
    from circle_jax.ondevice import export_training_graph
    from circle_jax.train import TrainConfig

    from .config import step_config

    if not (args.circle or args.tflite):
        raise CliError("--training_graph writes a model: give --tflite OUT and/or --circle OUT")
    if args.wof and args.training_graph != "functional":
        raise CliError(f"--wof: the {args.training_graph} packaging initialises its variables "
                       "in the file; a .wof goes with --training_graph functional")
    config = TrainConfig(batch_size=args.batch_size, **step_config(args))
    files = {}
    for flag, fmt in (("--tflite", "tflite"), ("--circle", "circle")):
        if outputs[flag]:
            done = export_training_graph(model, config, params=params,
                                         packaging=args.training_graph, file_format=fmt,
                                         input_shapes=args.input_shapes)
            files[outputs[flag]] = done.model
            if args.wof:
                files[args.wof] = done.wof
    for path, data in files.items():
        atomic_write(path, data, protect=inputs)
        print(f"wrote {path}")
    return 0
