"""``circle-jax`` (subcommands: train, eval, info, run, export, traininfo, golden, compare,
view) and
``onert-train-jax`` (onert_train's command line verbatim: ``sed s/onert_train/onert-train-jax/``
migrates a script).

Each subcommand is a module with ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``, listed once in `COMMANDS`. Errors print one line ``E: <what is
wrong>`` and exit non-zero; no output file is left half-written (every write is atomic).
Ctrl-C prints ``E: interrupted`` and exits 130, as a shell reports SIGINT; SIGTERM (``kill``,
a job scheduler's stop) prints ``E: terminated`` and exits 143. Either way a file being
written is not left behind, not even as its temporary file.
A reader that closes the output early (``circle-jax info M | head -1``) silences the rest of
it: the work goes on (a training run still writes its files) and the command exits with its
own status (compare's verdict), without an error.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NoReturn, TextIO

from . import compare, evaluate, export, golden, info, run, train, traininfo, view
from .common import CliError, Parser

#: the subcommands of ``circle-jax``, in --help order (one module each)
COMMANDS: tuple[ModuleType, ...] = (train, evaluate, info, run, export, traininfo, golden,
                                     compare, view)

__all__ = ["COMMANDS", "CliError", "build_parser", "main", "onert_train_main"]


def _version(prog: str) -> str:
    from circle_jax import __version__

    return f"{prog} {__version__}"


def build_parser() -> argparse.ArgumentParser:
    """``circle-jax``'s parser: one subparser per module of `COMMANDS`."""
    parser = Parser(prog="circle-jax", allow_abbrev=False, description=(
        "Train and run Circle/TFLite models with JAX; `train` takes onert_train's command "
        "line (so does the onert-train-jax program)."))
    parser.add_argument("--version", action="version", version=_version("circle-jax"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=Parser)
    for command in COMMANDS:
        p = sub.add_parser(command.NAME, help=command.HELP, description=command.HELP,
                           allow_abbrev=False)
        command.add_arguments(p)
        p.set_defaults(handler=command.run)
    return parser


def build_onert_train_parser(prog: str = "onert-train-jax") -> argparse.ArgumentParser:
    """onert_train's command line (``MODEL [options]``), no subcommand."""
    parser = Parser(prog=prog, allow_abbrev=False, description=(
        "onert_train's command line and output, trained by circle-jax (JAX/XLA)."))
    parser.add_argument("--version", action="version",
                        version=_version(prog) + " (circle-jax; onert_train's command line)")
    train.add_arguments(parser)
    parser.set_defaults(handler=train.run)
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    from circle_jax.errors import CircleJaxError

    handler: Callable[[argparse.Namespace], int] = args.handler
    stdout = sys.stdout  # None when the process started with it closed (``>&-``)
    sys.stdout = stdout if stdout is None else _DiscardWhenClosed(stdout)
    on_sigterm = _catch_sigterm()
    try:
        status = handler(args)
    except (CliError, CircleJaxError, ValueError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"E: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT
        if (getattr(args, "verbose_level", None) or 0) >= 2:
            traceback.print_exc()
        print("E: interrupted", file=sys.stderr)
        return 130
    except _Terminated:  # SIGTERM: the same, with the shell's status for it
        print("E: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except Exception as e:  # noqa: BLE001 - a bug: one line, the traceback under -v 2
        if (getattr(args, "verbose_level", None) or 0) >= 2:
            traceback.print_exc()
        msg = (str(e).splitlines() or [""])[0][:200]
        print(f"E: internal error: {type(e).__name__}: {msg} (a bug in circle-jax; "
              "-v 2 prints the traceback)", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)
    _flush_stdout()  # a closed pipe shows here, not at exit; the work is done: its status
    return status


class _Terminated(BaseException):
    """SIGTERM, raised where the main thread runs Python, so that what is being written is
    cleaned up (`circle_jax.formats.atomic_write`) and the command ends with one line."""


def _terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def _catch_sigterm() -> Any:
    """Turn SIGTERM into `_Terminated` while a command runs; the handler it replaces (to
    restore), or None where no handler can be set (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _terminated)


class _DiscardWhenClosed:
    """A command's standard output: once its reader has gone (``... | head -1``) the rest
    is discarded, and the work goes on instead of stopping at the next line it prints."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_gone()

    def _reader_gone(self) -> None:
        """Called while a BrokenPipeError is handled: silence standard output when the
        reader has gone, else let the error be."""
        if not _stdout_closed():
            raise  # the BrokenPipeError being handled
        _silence_stdout()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _flush_stdout() -> None:
    """Flush standard output; a reader that has gone silences it instead of an error."""
    if sys.stdout is not None:  # None: started with it closed, nothing was printed
        _DiscardWhenClosed(sys.stdout).flush()


def _stdout_closed() -> bool:
    """True when standard output is a pipe whose reader has gone (``... | head -1``)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no real file descriptor
        return False


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that the exit's flush of what is left
    buffered neither fails nor prints (Unix tools end quietly on a closed pipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args(argv)``; --help and --version into a closed pipe end quietly. A
    usage error exits 2 (argparse's status), or the command's own ``USAGE_STATUS`` where
    2 means something else (compare: 2 is "the peer refuses", bad flags are 3)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        _flush_stdout()
        if e.code == 2:
            words = sys.argv[1:] if argv is None else argv
            command = next((c for c in COMMANDS if c.NAME in words[:1]), None)
            raise SystemExit(getattr(command, "USAGE_STATUS", 2)) from None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    """``circle-jax COMMAND ...``; returns the exit status."""
    return _dispatch(_parse(build_parser(), argv))


def onert_train_main(argv: Sequence[str] | None = None) -> int:
    """``onert-train-jax MODEL [onert_train options]``; returns the exit status."""
    return _dispatch(_parse(build_onert_train_parser(), argv))


def exit_with(status: int) -> NoReturn:
    """End the process with ``status`` (the console scripts' and ``python -m``'s end).

    After a signal (130, 143) XLA may still be compiling on its own threads, and the
    interpreter's teardown under them crashes (a segmentation fault, status 139, where a
    job scheduler expects 143): the process then ends at once, its output flushed, what it
    was writing already removed by `_dispatch`."""
    if status in (130, 128 + signal.SIGTERM):
        _flush_stdout()
        sys.stderr.flush()
        os._exit(status)
    raise SystemExit(status)


def console_main() -> NoReturn:
    """The ``circle-jax`` script: :func:`main`, then :func:`exit_with` its status."""
    exit_with(main())


def onert_train_console_main() -> NoReturn:
    """The ``onert-train-jax`` script: :func:`onert_train_main`, then :func:`exit_with`."""
    exit_with(onert_train_main())
