"""``traininfo``: print a model's circle+ training metadata, or write a copy with new values."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import CliError, check_outputs

NAME = "traininfo"
HELP = "print or set circle+ training metadata"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    p.add_argument("--set", metavar="JSON",
                   help="a circle_plus_gen-style hyper-parameter file to write (default: print)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where --set writes the model (default: none; required with --set)")


def format_traininfo(m: Any) -> str:
    """The metadata's fields, one a line, and its circle_plus_gen JSON."""
    from circle_jax.formats.traininfo import decode_traininfo, traininfo_to_json

    info = decode_traininfo(m.metadata["CIRCLE_TRAINING"])
    lines = [f"{k:20} = {v}" for k, v in vars(info).items()]
    lines.append("circle_plus_gen JSON = " + json.dumps(
        traininfo_to_json(info, len(m.main.operators))))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from circle_jax.formats.reader import read_model

    m = read_model(args.model)
    if args.set is None:
        if "CIRCLE_TRAINING" not in m.metadata:
            print(f"{args.model}: no CIRCLE_TRAINING metadata")
        else:
            print(format_traininfo(m))
        return 0
    if not args.output:
        raise CliError("--set needs -o OUT (the input model is never modified)")
    check_outputs({"-o": args.output}, [args.model, args.set])
    _write(m, args)
    print(f"wrote {args.output}")
    return 0


def _write(m: Any, args: argparse.Namespace) -> None:
    from circle_jax.formats.atomic import atomic_write
    from circle_jax.formats.traininfo import encode_traininfo, traininfo_from_json
    from circle_jax.formats.writer import export_model

    with open(args.set) as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise CliError(f"{args.set}: not valid JSON ({e})") from None
    info = traininfo_from_json(obj, len(m.main.operators))
    data = export_model(m, metadata={"CIRCLE_TRAINING": encode_traininfo(info)})
    atomic_write(args.output, data, protect=args.model)
