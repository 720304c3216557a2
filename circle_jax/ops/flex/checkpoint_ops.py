"""TF's Save and Restore on V1 checkpoints (:mod:`circle_jax.formats.tf_checkpoint`): host
kernels, run on numpy values outside ``jax.jit``.

- ``Save(filename, tensor_names, *data)`` (attr ``T``: the data's types): writes the tensors
  under their names to ``filename`` (a scalar string), replacing the file; returns nothing.
- ``Restore(file_pattern, tensor_name)`` (attr ``dt``; ``preferred_shard`` ignored: one
  file): the named tensor, which must be of type ``dt``. ``file_pattern`` is a file's path.

Strings arrive as ``bytes``, ``str`` or numpy arrays of them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from circle_jax.errors import DataError

from .registry import flex_kernel


def _widened(a: np.ndarray, t: str | None) -> np.ndarray:
    """``a`` in the 64-bit type ``t`` names when it holds its 32-bit counterpart (JAX
    without x64 computes a variable declared int64 or float64 in 32 bits; widening is
    exact), else as it is."""
    wide = {"int64": np.int32, "uint64": np.uint32, "float64": np.float32}
    if t in wide and a.dtype == wide[t]:
        return a.astype(t)
    return a


def _text(x: Any, op: str, what: str) -> str:
    v = np.asarray(x)
    if v.ndim != 0:
        raise DataError(f"Flex {op}: {what} must be a scalar string, got shape {list(v.shape)}")
    v = v.item()
    return v.decode() if isinstance(v, bytes) else str(v)


def _texts(x: Any) -> list[str]:
    return [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(x).reshape(-1)]


@flex_kernel("Save", host=True)
def save(attrs: dict, filename: Any, tensor_names: Any, *data: Any) -> tuple:
    from circle_jax.formats.tf_checkpoint import write_checkpoint
    from circle_jax.formats.tf_proto import numpy_dtype

    path = _text(filename, "Save", "filename")
    names = _texts(tensor_names)
    types = attrs.get("T") or []
    if len(names) != len(data) or len(types) not in (0, len(data)):
        raise DataError(f"Flex Save: {len(names)} tensor names for {len(data)} tensors "
                        f"({len(types)} types)")
    if len(set(names)) != len(names):
        raise DataError(f"Flex Save: tensor names repeat: {names}")
    arrays = [_widened(np.asarray(d), t) for d, t in zip(data, types or [None] * len(data))]
    for name, t, a in zip(names, types, arrays):
        if t != "string" and a.dtype != numpy_dtype(t):
            raise DataError(f"Flex Save: tensor {name!r} is {a.dtype.name}, its type T says "
                            f"{t}")
    write_checkpoint(path, dict(zip(names, arrays)))
    return ()


@flex_kernel("Restore", host=True)
def restore(attrs: dict, file_pattern: Any, tensor_name: Any) -> np.ndarray:
    from circle_jax.formats.tf_checkpoint import read_checkpoint
    from circle_jax.formats.tf_proto import numpy_dtype

    path = _text(file_pattern, "Restore", "file_pattern")
    name = _text(tensor_name, "Restore", "tensor_name")
    held = read_checkpoint(path)
    if name not in held:
        raise DataError(f"checkpoint {path!r} holds no tensor {name!r} (it holds "
                        f"{', '.join(map(repr, held)) or 'none'})")
    a = held[name]
    dt = attrs.get("dt")
    if dt is not None and a.dtype != numpy_dtype(dt):
        raise DataError(f"checkpoint {path!r}: tensor {name!r} is {a.dtype.name}, Restore "
                        f"expects {dt}")
    narrow = {np.dtype(np.int64): np.int32, np.dtype(np.uint64): np.uint32}.get(a.dtype)
    if narrow is not None and a.size and not _wide_ints() and (
            a.min() < np.iinfo(narrow).min or a.max() > np.iinfo(narrow).max):
        raise DataError(f"checkpoint {path!r}: tensor {name!r} ({a.dtype.name}) holds "
                        f"{a.max() if a.max() > np.iinfo(narrow).max else a.min()}, which "
                        f"JAX computes as {np.dtype(narrow).name} without 64-bit mode: "
                        "enable jax_enable_x64 to run it exactly")
    return a


def _wide_ints() -> bool:
    """Whether JAX computes 64-bit integers (``jax_enable_x64``)."""
    import jax

    return bool(jax.config.jax_enable_x64)
