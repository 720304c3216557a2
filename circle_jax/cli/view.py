"""``view``: a model in Google's Model Explorer on localhost, with overlays (`compare` and
`golden` write them with ``--overlay``). Needs the optional package: without it, one line
says how to install it (``pip install "circle-jax[explorer]"``) and the exit status is 1."""

from __future__ import annotations

import argparse

NAME = "view"
HELP = ("show a model's graph in Model Explorer on http://127.0.0.1 with overlays from "
        "`compare --overlay` / `golden --overlay` (needs circle-jax[explorer])")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help=".circle/.tflite file or nnpackage directory")
    p.add_argument("--overlay", action="append", default=[], metavar="FILE",
                   help="Model Explorer node data to show on the graph; repeat for several "
                   "(default: none)")
    p.add_argument("--port", type=int, default=8080, metavar="N",
                   help="the port on 127.0.0.1; 8080 takes the first free one of "
                   "8080..8099 (default: 8080)")
    p.add_argument("--no_browser", action="store_true",
                   help="do not open a browser tab, only print the address (default: open)")


def check_overlay(path: str, model: str | None) -> None:
    """Before any work: Model Explorer is installed and ``path`` can be written (one line
    otherwise)."""
    from circle_jax.interop.model_explorer import explorer

    from .common import check_outputs

    explorer()
    check_outputs({"--overlay": path}, [model])


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl+C or SIGTERM (both stop the server cleanly: exit 0, the TFL3 copy
    of a Circle file removed)."""
    import os
    import signal

    from circle_jax.interop.model_explorer import explorer, view

    from .common import CliError

    explorer()
    for path in [args.model, *args.overlay]:
        if not os.path.exists(path):
            raise CliError(f"{path!r} does not exist")
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        view(args.model, args.overlay, port=args.port, open_browser=not args.no_browser)
    except KeyboardInterrupt:
        pass
    return 0
