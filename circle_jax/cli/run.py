"""``run``: inference on data files; each output saved as ``output_<k>.npy``. A file with
resource variables (LiteRT's on-device training files) runs a signature as LiteRT does,
``--steps`` times, its inputs by name (`circle_jax.cli.signature_run`)."""

from __future__ import annotations

import argparse
import functools
import os

import numpy as np

from .common import CliError, check_output_dir, load_model, read_inputs
from .signature_run import has_variables, run_signature

NAME = "run"
HELP = "run inference; outputs saved as .npy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help=".npy/.npz/raw input (repeat per model input, or one .npz); for a "
                   "file with variables NAME=FILE per signature input (a string input: "
                   "NAME=TEXT) or one .npz named by them (default: none, required)")
    p.add_argument("--output_dir", default=".", metavar="DIR",
                   help="where output_<k>.npy go (default: .)")
    p.add_argument("--signature", metavar="KEY",
                   help="run this SignatureDef's subgraph (default: subgraph 0; a file with "
                   "variables: its only signature)")
    p.add_argument("--restore", metavar="CKPT",
                   help="a file with variables: run its restore signature on this TF V1 "
                   "checkpoint first (default: the file's initial values)")
    p.add_argument("--steps", type=int, default=1, metavar="N",
                   help="a file with variables: run the signature N times, the variables "
                   "kept between (default: 1)")
    p.add_argument("--variables", metavar="NPZ",
                   help="a file with variables: give them these values first, by shared_name "
                   "(default: the file's initialisers)")
    p.add_argument("--save_variables", metavar="NPZ",
                   help="a file with variables: write them all here after the last step "
                   "(default: none)")


def run(args: argparse.Namespace) -> int:
    import jax

    from circle_jax.formats.atomic import atomic_write

    if os.path.isfile(args.model) and has_variables(args.model):
        return run_signature(args)
    given = [f for f in ("steps", "variables", "save_variables", "restore")
             if getattr(args, f) != (1 if f == "steps" else None)]
    if given:
        raise CliError(f"--{given[0]} applies to a file with resource variables; "
                       f"{args.model!r} has none")
    check_output_dir("--output_dir", args.output_dir)
    model = load_model(args.model, signature=args.signature, restore=args.restore)
    xs = read_inputs(args.input, model)
    outs = jax.jit(model.apply)(model.params, *xs)
    os.makedirs(args.output_dir, exist_ok=True)
    for k, (spec, value) in enumerate(zip(model.outputs, outs)):
        path = os.path.join(args.output_dir, f"output_{k}.npy")
        atomic_write(path, functools.partial(np.save, arr=np.asarray(value)))
        print(f"output {k} {spec.name!r}: {list(np.shape(value))} -> {path}")
    return 0
