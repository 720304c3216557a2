"""``run``: inference on data files; each output saved as ``output_<k>.npy``."""

from __future__ import annotations

import argparse
import functools
import os

import numpy as np

from .common import check_output_dir, load_model, read_inputs

NAME = "run"
HELP = "run inference; outputs saved as .npy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help=".npy/.npz/raw input (repeat per model input, or one .npz) (default: "
                   "none, required)")
    p.add_argument("--output_dir", default=".", metavar="DIR",
                   help="where output_<k>.npy go (default: .)")
    p.add_argument("--signature", metavar="KEY",
                   help="run this SignatureDef's subgraph (default: subgraph 0)")


def run(args: argparse.Namespace) -> int:
    import jax

    from circle_jax.formats.atomic import atomic_write

    check_output_dir("--output_dir", args.output_dir)
    model = load_model(args.model, signature=args.signature)
    xs = read_inputs(args.input, model)
    outs = jax.jit(model.apply)(model.params, *xs)
    os.makedirs(args.output_dir, exist_ok=True)
    for k, (spec, value) in enumerate(zip(model.outputs, outs)):
        path = os.path.join(args.output_dir, f"output_{k}.npy")
        atomic_write(path, functools.partial(np.save, arr=np.asarray(value)))
        print(f"output {k} {spec.name!r}: {list(np.shape(value))} -> {path}")
    return 0
