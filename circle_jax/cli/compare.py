"""``compare``: train with onert and with circle-jax step by step and say where they part.
``--with file``: an on-device training file's own ``train`` signature is the peer
(`circle_jax.oracle.ondevice`: its gradients and updates against circle-jax's autodiff of
``--signature`` (default ``infer``) under the flags' loss and optimizer).

Exit status: 0 the runtimes agree, 1 they disagree, 2 the peer cannot run the case (its
own message quoted), 3 circle-jax cannot (one ``E:`` line, as every command).
"""

from __future__ import annotations

import argparse
import json
import sys

from . import train

NAME = "compare"
HELP = ("train with onert and circle-jax from the same weights on the same batches, step by "
        "step; report where they part (exit 0 agree, 1 disagree, 2 the peer refuses, 3 "
        "circle-jax cannot: bad flags, files or model)")

AGREE, DISAGREE, PEER_REFUSES, FAILED = 0, 1, 2, 3
#: a bad flag is "circle-jax cannot" (3), not argparse's 2, which here means the peer refuses
USAGE_STATUS = FAILED


def add_arguments(p: argparse.ArgumentParser) -> None:
    train.add_arguments(p)
    g = p.add_argument_group("compare")
    g.add_argument("--with", dest="peer", choices=["onert", "file"], default="onert",
                   help="the peer: the onert wheel's train backend, or an on-device training "
                   "file's own train signature (file; --rtol its relative tolerance on "
                   "gradients and updates) (default: onert)")
    g.add_argument("--steps", type=int, metavar="N",
                   help="steps to compare (default: --epoch epochs, one when not given)")
    g.add_argument("--report", metavar="FILE", help="write the report as JSON (default: none)")
    g.add_argument("--overlay", metavar="FILE", help="write, per operator, the largest weight "
                   "difference as Model Explorer node data (JSON; `circle-jax view MODEL "
                   "--overlay FILE` shows it; needs circle-jax[explorer]) (default: none)")
    g.add_argument("--arbiter", choices=["float64"],
                   help="also train in float64 and say which runtime is nearer (default: off)")
    g.add_argument("--atol", type=float, metavar="F",
                   help="absolute tolerance on weights and losses, >= 0 (default: 1e-05; "
                   "--with file: 1e-07)")
    g.add_argument("--rtol", type=float, metavar="F",
                   help="tolerance relative to the peer's value, >= 0 (default: 0.0001; "
                   "--with file: 1e-05)")


def _check_numbers(ns: argparse.Namespace) -> None:
    """CliError for a step count below 1 or a tolerance that is not a number >= 0."""
    from .common import CliError

    if ns.steps is not None and ns.steps < 1:
        raise CliError(f"--steps must be >= 1, got {ns.steps}")
    for flag, value in (("--atol", ns.atol), ("--rtol", ns.rtol)):
        if value is not None and not value >= 0:  # NaN too
            raise CliError(f"{flag} must be a number >= 0, got {value}")


def run(ns: argparse.Namespace) -> int:
    from circle_jax.errors import CircleJaxError
    from circle_jax.formats.atomic import atomic_write
    from circle_jax.oracle.compare import PeerRefused, Tolerance, compare_with_onert
    from circle_jax.train import TrainConfig

    from .common import CliError, check_outputs
    from .config import train_run
    from .view import check_overlay

    try:
        if ns.peer == "file":
            ns.signature = ns.signature or "infer"
        cfg = train_run(ns)
        check_outputs({"--report": ns.report, "--overlay": ns.overlay,
                       **cfg.outputs.by_flag()}, cfg.input_files())
        _check_numbers(ns)
        if ns.overlay:
            check_overlay(ns.overlay, ns.model)
        model = train.training_model(cfg)
        xs, y = train.training_data(cfg, model)
        if ns.peer == "file":
            return _with_file(ns, cfg, xs, y)
        source = cfg.model if not cfg.example else model.export(file_format="circle")
        report = compare_with_onert(
            source, xs, y, TrainConfig(**cfg.train), steps=ns.steps,
            tolerance=Tolerance(1e-5 if ns.atol is None else ns.atol,
                                1e-4 if ns.rtol is None else ns.rtol),
            arbiter=ns.arbiter == "float64",
            **cfg.load)
    except PeerRefused as e:
        print(f"onert cannot run this case: {e}", file=sys.stderr)
        return PEER_REFUSES
    except (CliError, CircleJaxError, ValueError, OSError) as e:
        print(f"E: {(str(e).splitlines() or [type(e).__name__])[0]}", file=sys.stderr)
        return FAILED
    print(report.table())
    if ns.report:
        try:
            atomic_write(ns.report, json.dumps(report.as_json(), indent=1).encode())
        except OSError as e:
            print(f"E: cannot write --report {ns.report!r}: {e.strerror or e}", file=sys.stderr)
            return FAILED
        if (ns.verbose_level or 0) >= 1:
            print(f"wrote {ns.report}", file=sys.stderr)
    if ns.overlay:
        from circle_jax.oracle.overlay import compare_overlay, write_overlay

        write_overlay(compare_overlay(report, model), ns.overlay)
    return AGREE if report.agree else DISAGREE


def _with_file(ns: argparse.Namespace, cfg: object, xs: list, y: object) -> int:
    """``--with file``: the file's train signature against circle-jax (module docstring)."""
    from circle_jax.formats.atomic import atomic_write
    from circle_jax.oracle.ondevice import compare_train_signature
    from circle_jax.train import TrainConfig

    from .common import CliError

    if ns.overlay or ns.arbiter:
        raise CliError("--overlay and --arbiter apply to --with onert")
    load = dict(cfg.load)  # type: ignore[attr-defined]
    infer, restore = load.pop("signature"), load.pop("restore", None)
    report = compare_train_signature(cfg.model, xs, y,  # type: ignore[attr-defined]
                                     TrainConfig(**cfg.train),  # type: ignore[attr-defined]
                                     steps=ns.steps or 1, restore=restore, infer=infer,
                                     rtol=1e-5 if ns.rtol is None else ns.rtol,
                                     atol=1e-7 if ns.atol is None else ns.atol, **load)
    print(report.table())
    if ns.report:
        atomic_write(ns.report, json.dumps(report.as_json(), indent=1).encode())
    return AGREE if report.agree else DISAGREE
