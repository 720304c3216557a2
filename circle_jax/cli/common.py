"""What every subcommand shares: the one-line error, the parser, model/data loading, checks
on output paths and verbosity-gated messages on stderr."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np


class CliError(Exception):
    """A user error: printed as one ``E:`` line."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``E:`` line naming the --help to read."""

    def error(self, message: str) -> NoReturn:
        print(f"E: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


class Log:
    """Messages on stderr for verbosity ``level`` and above (onert_train's -v: 0 results
    only, 1 also messages between phases, 2 everything)."""

    def __init__(self, verbosity: int) -> None:
        self.verbosity = verbosity

    def __call__(self, level: int, message: str) -> None:
        if self.verbosity >= level:
            print(message, file=sys.stderr, flush=True)


def load_model(path: str, **options: Any) -> Any:
    """The loaded model at ``path`` (a .circle/.tflite file or an nnpackage directory);
    ``options`` are `circle_jax.load`'s keywords (numerics, tie_shared_weights, ...)."""
    import circle_jax as cj

    if not os.path.exists(path):
        raise CliError(f"model file {path!r} does not exist")
    return cj.load(path, **options)


def read_data(path: str, specs: list[tuple[tuple[int, ...], Any]], names: Sequence[Any] | None,
              raw: bool = False, log: Log | None = None, finite: bool = True
              ) -> list[np.ndarray]:
    """Arrays for ``specs`` from a raw (onert_train's layout), .npy or .npz file, cast only
    where that loses nothing (``log`` hears of a cast at -v 1); with ``finite``, refused
    before any compiling when a sample holds NaN or infinity (`check_finite_data`)."""
    from circle_jax.formats.rawdata import load_array_file, read_raw

    if not os.path.exists(path):
        raise CliError(f"data file {path!r} does not exist")
    notice = None if log is None else (lambda line: log(1, line))
    arrays = read_raw(path, specs) if raw else load_array_file(path, specs, names, notice)
    if finite:
        check_finite_data(path, arrays, specs)
    return arrays


def check_finite_data(path: str, arrays: list[np.ndarray],
                      specs: list[tuple[tuple[int, ...], Any]], counted: bool = False) -> None:
    """Refuse data holding NaN or infinity; for a file read as raw bytes, say what its size
    would fit instead (a raw file has no dtype: uint8 bytes read as float32 hold NaNs),
    unless its sample count already matched another file's (``counted``): then its size
    fits the model's dtype, and another dtype's would not."""
    from circle_jax.errors import DataError
    from circle_jax.formats.rawdata import check_finite, size_hint

    try:
        check_finite(arrays, f"data file {path!r}")
    except DataError as e:
        hint = ""
        if not counted and os.path.splitext(path)[1].lower() not in (".npy", ".npz"):
            hint = size_hint(os.path.getsize(path), specs)
        raise DataError(f"{e}; its {hint}" if hint else str(e)) from None


def check_outputs(outputs: dict[str, str | None], inputs: Sequence[str | None],
                  allowed: dict[str, str | None] | None = None) -> None:
    """Refuse, before any work, outputs that are empty paths, are inputs, repeat, or lie in
    no directory (None: the output was not asked for).

    ``allowed[flag]`` is an input that output ``flag`` may rewrite (a checkpoint it resumes).
    """
    allowed = allowed or {}
    seen: dict[str, str] = {}
    for flag, path in outputs.items():
        if path is None:
            continue
        if not path.strip():
            raise CliError(f"{flag} {path!r} is an empty path; expected a file path")
        for src in inputs:
            if src and src != allowed.get(flag) and _same_path(src, path):
                raise CliError(f"refusing to write {flag} {path!r}: it is the input file "
                               f"{src!r}; choose a different output path")
        full = os.path.realpath(path)
        if full in seen:
            raise CliError(f"{seen[full]} and {flag} both write {path!r}; give different paths")
        seen[full] = flag
        _check_writable(flag, path, full)


def _check_writable(flag: str, path: str, full: str) -> None:
    if os.path.isdir(path):
        raise CliError(f"cannot write {flag} {path!r}: it is a directory, expected a file")
    directory = os.path.dirname(full)
    if not os.path.isdir(directory):
        _refuse_file_above(flag, path)
        raise CliError(f"cannot write {flag} {path!r}: directory {directory!r} does not exist")
    _probe(flag, path, directory)


def _refuse_file_above(flag: str, path: str) -> None:
    """Refuse ``path`` when a directory it lies in exists as a file, naming that file as
    the user wrote it (``afile`` of ``afile/out``)."""
    above = os.path.dirname(os.path.normpath(path))
    while above and not os.path.exists(above):
        above = os.path.dirname(above)
    if above and not os.path.isdir(above):
        raise CliError(f"cannot write {flag} {path!r}: {above!r} is a file, expected a "
                       "directory")


def _probe(flag: str, path: str, directory: str) -> None:
    """Refuse, naming the path the user gave, a directory where the atomic write of
    ``path`` could not create its file (`circle_jax.formats.atomic.cannot_create_in`)."""
    from circle_jax.formats.atomic import cannot_create_in

    why = cannot_create_in(directory)
    if why is not None:
        raise CliError(f"cannot write {flag} {path!r}: cannot create a file in {directory!r} "
                       f"({why})")


def check_output_dir(flag: str, directory: str) -> None:
    """Refuse, before any work, an output directory that is a file or where no file can be
    created (one that does not exist yet is made later: its nearest existing parent must
    take a new directory)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CliError(f"cannot write {flag} {directory!r}: it is a file, expected a directory")
    _refuse_file_above(flag, directory)
    existing = os.path.realpath(directory)
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    _probe(flag, directory, existing)


def _same_path(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def input_names(model: Any) -> list[list[str]]:
    """Each model input's names, as a .npz file's keys may give them: its tensor name, then
    its name in the signature of the model's main subgraph (``tokens``), if any."""
    main = model.ir.main
    signed = {i: name for sig in model.ir.signature_defs if sig.subgraph_index == main.index
              for name, i in sig.inputs.items()}
    return [[spec.name, *([signed[i]] if i in signed else [])]
            for spec, i in zip(model.inputs, main.inputs)]


def read_inputs(files: Sequence[str], model: Any, dtypes: Sequence[Any] | None = None
                ) -> list[np.ndarray]:
    """The model's inputs from ``files``: one .npz (arrays named after the inputs, or in
    order), or one .npy/.npz/raw file per model input; each in its input's dtype, or in
    ``dtypes[k]`` where given (data casts only where that loses nothing)."""
    specs = [(s.shape[1:], s.dtype if dtypes is None else dtypes[k])
             for k, s in enumerate(model.inputs)]
    if len(files) == 1:
        return read_data(files[0], specs, input_names(model))
    if len(files) == len(specs):
        return [read_data(f, [s], None)[0] for f, s in zip(files, specs)]
    raise CliError(f"the model has {len(specs)} inputs, got {len(files)} --input files")
