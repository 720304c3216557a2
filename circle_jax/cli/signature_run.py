"""``run`` on a file with resource variables (LiteRT's on-device training files): a
signature run as LiteRT runs it (`circle_jax.Interpreter`), ``--steps`` times.

Inputs by the signature's names: ``--input NAME=FILE`` per input (.npy, a one-array .npz or
raw data, holding the whole tensor; a string input, such as a checkpoint path, is given as
its text: ``--input checkpoint_path=/tmp/ckpt``), or one ``--input FILE.npz`` holding an
array per input under its name. ``--variables FILE.npz`` gives variables values first
(shared_names as keys: a file without initialisers, before its ``restore`` runs);
``--restore CKPT`` runs the file's restore signature on a TF V1 checkpoint before them
(`circle_jax.signatures.restore`: its tensor names, shapes and types checked first),
``--save_variables FILE.npz`` writes them all after the last step. Every step prints its
outputs (a scalar's value, else its shape); the last step's are saved as
``output_<k>.npy`` in the signature's output order.
"""

from __future__ import annotations

import argparse
import functools
import os
from typing import Any

import numpy as np

from .common import CliError, check_output_dir, read_data


def has_variables(path: str) -> bool:
    """Whether the model file at ``path`` holds resource variables (a VAR_HANDLE operator
    code; the model is not parsed)."""
    from circle_jax.formats.reader import operator_codes, read_bytes

    return "VAR_HANDLE" in operator_codes(read_bytes(path)[0])


def _inputs(items: list[str], signature: Any) -> dict[str, Any]:
    """The signature's inputs from ``--input`` items (see the module docstring)."""
    tensors = signature.inputs
    names = ", ".join(repr(n) for n in tensors) or "none"
    if len(items) == 1 and "=" not in items[0] and items[0].lower().endswith(".npz"):
        specs = [(t.shape, t.dtype) for t in tensors.values()]
        arrays = read_data(items[0], [(s[1:] if s else (), d) for s, d in specs],
                           list(tensors), finite=False)
        return {n: _whole(a, t, items[0]) for (n, t), a in zip(tensors.items(), arrays)}
    out: dict[str, Any] = {}
    for item in items:
        name, eq, file = item.partition("=")
        if not eq or not name or not file:
            raise CliError(f"--input {item!r}: expected NAME=FILE, NAME one of the signature "
                           f"{signature.key!r}'s inputs ({names}), or one .npz named by them")
        if name not in tensors:
            raise CliError(f"--input {item!r}: signature {signature.key!r} has no input "
                           f"{name!r} (its inputs: {names})")
        if name in out:
            raise CliError(f"--input {name}= is given twice")
        t = tensors[name]
        out[name] = file.encode() if t.dtype == "string" else _whole(
            read_data(file, [(t.shape[1:] if t.shape else (), t.dtype)], None,
                      finite=False)[0], t, file)
    missing = [n for n in tensors if n not in out]
    if missing:
        raise CliError(f"signature {signature.key!r} needs --input for "
                       + ", ".join(repr(n) for n in missing) + f" (its inputs: {names})")
    return out


def _whole(array: np.ndarray, t: Any, file: str) -> np.ndarray:
    """A file's array as the whole tensor ``t``: a scalar's file holds one value."""
    if t.shape == ():
        if array.size != 1:
            raise CliError(f"{file!r} holds {array.size} values for the scalar input "
                           f"{t.name!r} (expected 1)")
        return array.reshape(())
    return array


def _variables(path: str) -> dict[str, np.ndarray]:
    """The arrays of a .npz file by name (one line when it is not one)."""
    if not os.path.isfile(path):
        raise CliError(f"--variables file {path!r} does not exist")
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise CliError(f"--variables {path!r} is not a .npz archive of arrays ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise CliError(f"--variables {path!r} is not a .npz archive (one array per variable, "
                       "named by its shared_name)")
    with z:
        return {name: z[name] for name in z.files}


def _shown(value: np.ndarray) -> str:
    return f"{value.item():.7g}" if value.size == 1 and value.dtype.kind in "fiub" \
        else f"{value.dtype}{list(value.shape)}"


def run_signature(args: argparse.Namespace) -> int:
    """``circle-jax run`` on a file with variables (see the module docstring)."""
    import circle_jax as cj
    from circle_jax.formats.atomic import atomic_write

    check_output_dir("--output_dir", args.output_dir)
    if args.steps < 1:
        raise CliError(f"--steps {args.steps}: expected at least 1")
    it = cj.Interpreter(model_path=args.model)
    keys = list(it.get_signature_list())
    if args.signature is None and len(keys) != 1:
        raise CliError(f"the model has {len(keys)} signatures; expected --signature KEY, one "
                       f"of {', '.join(map(repr, keys)) or 'none'}")
    runner = it.get_signature_runner(args.signature)
    if args.restore:
        from circle_jax.signatures.restore import (
            check_checkpoint,
            restore_map,
            restore_signature,
        )

        key = restore_signature(it.program.model)
        check_checkpoint(args.restore, restore_map(it.program.model, key))
        restore = it.get_signature_runner(key)
        restore(**{name: np.array(args.restore.encode(), object)
                   for name in restore.signature.inputs})
    if args.variables:
        it.set_variables(_variables(args.variables))
    inputs = _inputs(args.input, runner.signature)
    for step in range(1, args.steps + 1):
        outputs = runner(**inputs)
        shown = ", ".join(f"{n} {_shown(v)}" for n, v in outputs.items())
        print(f"step {step}: {shown}" if args.steps > 1 else shown)
    os.makedirs(args.output_dir, exist_ok=True)
    for k, (name, value) in enumerate(outputs.items()):
        path = os.path.join(args.output_dir, f"output_{k}.npy")
        atomic_write(path, functools.partial(np.save, arr=value))
        print(f"output {k} {name!r}: {list(np.shape(value))} -> {path}")
    if args.save_variables:
        values = it.variables
        atomic_write(args.save_variables, lambda f: np.savez(f, **values))
        print(f"{len(values)} variables -> {args.save_variables}")
    return 0
