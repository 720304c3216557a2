"""``export``: write a model, with weights from a .wof or a checkpoint, as .circle/.tflite/.wof."""

from __future__ import annotations

import argparse

from .common import CliError, check_outputs, load_model
from .config import load_options
from .train_args import add_load_arguments, add_personalize_arguments

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


def run(args: argparse.Namespace) -> int:
    from circle_jax.checkpoints import checkpoint_params, load_wof, save_wof
    from circle_jax.formats.atomic import atomic_write

    outputs = {"--circle": args.circle, "--tflite": args.tflite, "--wof": args.wof}
    if not any(outputs.values()):
        raise CliError("nothing to write: give --circle OUT, --tflite OUT and/or --wof OUT")
    inputs = [p for p in (args.model, args.load_wof, args.checkpoint) if p]
    check_outputs(outputs, inputs)
    model = load_model(args.model, **load_options(args))
    params = model.params
    if args.load_wof:
        params = load_wof(args.load_wof, model)
    elif args.checkpoint:
        params = checkpoint_params(args.checkpoint, model)
    for flag, fmt in (("--circle", "circle"), ("--tflite", "tflite")):
        if outputs[flag]:
            data = model.export(params, fmt, merge_adapters=not args.export_unmerged)
            atomic_write(outputs[flag], data, protect=inputs)
            print(f"wrote {outputs[flag]}")
    if args.wof:
        save_wof(args.wof, model, params, protect=inputs)
        print(f"wrote {args.wof}")
    return 0
