"""``golden``: a model's golden tensors for one batch, in the files ONE's tools read."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from .common import load_model, read_data, read_inputs
from .train_args import add_load_arguments, add_selection_arguments, add_step_arguments

NAME = "golden"
HELP = ("write golden tensors (inputs, outputs, every tensor; with --expected the loss, "
        "dLoss/dTensor and the one-step update) in ONE's h5 layout")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    p.add_argument("--input", action="append", required=True, metavar="FILE",
                   help="the batch: .npy/.npz/raw (repeat per model input, or one .npz); "
                   "an integer input takes its own dtype (the stored integers), as run does "
                   "(default: none, required)")
    p.add_argument("--expected", metavar="FILE", help="the targets of --loss_output (default "
                   "output 0; .npy/.npz/raw): "
                   "also write the loss, gradients.h5 and updated.h5 (default: none)")
    p.add_argument("-o", "--output_dir", required=True, metavar="DIR",
                   help="where the files go (default: none, required)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="compute everything in this dtype; float64 is the arbiter's ground "
                   "truth (default: float32)")
    p.add_argument("--format", choices=["h5", "luci"], default="h5",
                   help="h5 only, or also luci-value-test's MODEL.inputN / .outputN raw files "
                   "(default: h5)")
    p.add_argument("--overlay", metavar="FILE", help="also write, per operator, the gradient "
                   "norm of its outputs (with --expected; else their largest |value|) as "
                   "Model Explorer node data (JSON; `circle-jax view MODEL --overlay FILE` "
                   "shows it; needs circle-jax[explorer]) (default: none)")
    g = p.add_argument_group("the training step (with --expected)")
    add_step_arguments(g)
    add_selection_arguments(g)
    add_load_arguments(g)


def run(args: argparse.Namespace) -> int:
    from circle_jax.losses import loss_name
    from circle_jax.oracle import golden, write_golden
    from circle_jax.oracle.golden import input_dtypes
    from circle_jax.train import TrainConfig
    from circle_jax.train.config import output_index

    from .common import check_output_dir
    from .config import step_config
    from .view import check_overlay

    if args.overlay:
        check_overlay(args.overlay, args.model)
    check_output_dir("-o", args.output_dir)
    if args.overlay:
        check_overlay_beside(args.overlay, args.output_dir, args.model)
    model = load_model(args.model, lowering="reference", **golden_load_options(args))
    xs = read_inputs(args.input, model, input_dtypes(model))
    y, config = None, TrainConfig(**step_config(args)).with_defaults(model)
    if args.expected:
        o = model.outputs[output_index(model, config.loss_output)]
        sparse = loss_name(config.loss) == "sparse_categorical_crossentropy"
        y = read_data(args.expected, [(o.shape[1:-1], np.int32) if sparse else
                                      (o.shape[1:], o.dtype)], None)[0]
        if len(y) != len(xs[0]):
            raise ValueError(f"--expected holds {len(y)} samples, --input {len(xs[0])}")
    data = golden(model, xs, y, config, dtype=args.dtype)
    name = os.path.basename(os.path.normpath(args.model)) if args.format == "luci" else None
    files = write_golden(data, args.output_dir, luci_name=name)
    if args.overlay:
        from circle_jax.oracle.overlay import golden_overlay, write_overlay

        write_overlay(golden_overlay(data, model), args.overlay)
    print(f"wrote {len(files)} files to {args.output_dir} ({args.dtype}, "
          f"{len(data.tensors)} tensors"
          + (f", loss {data.loss:.6g}, {len(data.gradients or [])} gradients)"
             if data.loss is not None else ")"))
    return 0


def golden_load_options(args: argparse.Namespace) -> dict[str, Any]:
    """`circle_jax.load` keywords for golden. A fully quantized model loads for
    quantization-aware training (--qat on, the default) only with --expected, where a step
    is taken; forward-only it runs the file's integer kernels (the tensors QAT's untrained
    export computes, LiteRT's), whatever --qat on / --qat_forward say; --qat off still loads
    the dequantized float model."""
    from .config import load_options

    options = load_options(args, qat="auto" if args.expected else None)
    if not args.expected and options["qat"] is not False:
        options.update(qat=None, qat_forward=None, qat_ranges=None, qat_range_decay=None)
    return options


def check_overlay_beside(overlay: str, directory: str, model: str) -> None:
    """Refuse, before any work, an --overlay path that is the -o directory or one of the
    files golden writes in it (the h5 files, index.json, luci-value-test's MODEL.* files)."""
    from circle_jax.oracle.golden import FILES

    from .common import CliError

    full, out = os.path.realpath(overlay), os.path.realpath(directory)
    if full == out:
        raise CliError(f"cannot write --overlay {overlay!r}: it is the -o directory; expected "
                       "a file path")
    name = os.path.basename(full)
    luci = os.path.basename(os.path.normpath(model)) + "."
    if os.path.dirname(full) == out and (name in (*FILES, "index.json")
                                         or name.startswith(luci)):
        raise CliError(f"cannot write --overlay {overlay!r}: golden writes {name!r} in -o "
                       f"{directory!r}; choose another name")
