"""The HDF5 layout ONE's tools read for golden tensors.

One file per role. Group ``value`` holds one dataset per tensor; group ``name`` holds, under
the same key, the tensor's name as a string attribute. nnpackage tests (``metadata/tc/
input.h5``, ``expected.h5``) and onert_run's dumps key tensors ``"0"``…``"n-1"`` in model
order; circle-jax's per-tensor files key them by tensor index. Root attributes carry
scalars such as the loss; a quantized tensor's dataset carries its ``scale`` and
``zero_point`` (float32 and int64 arrays, one value per tensor or per channel) and
``quantized_dimension`` as attributes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..formats.atomic import atomic_write


@dataclass(frozen=True)
class Entry:
    """One tensor of a golden file: its key, its name, its value and the dataset's
    attributes (a quantized tensor's ``scale``, ``zero_point``, ``quantized_dimension``)."""

    key: str
    name: str
    value: np.ndarray
    attrs: Mapping[str, Any] = field(default_factory=dict)


def write_h5(path: str | os.PathLike, entries: Sequence[Entry],
             attrs: Mapping[str, Any] | None = None) -> None:
    """Write ``entries`` in ONE's layout, atomically (readers never see half a file)."""
    import h5py

    def write(f: Any) -> None:
        with h5py.File(f, "w") as h5:
            values, names = h5.create_group("value"), h5.create_group("name")
            for e in entries:
                dataset = values.create_dataset(e.key, data=np.asarray(e.value))
                for k, v in e.attrs.items():
                    dataset.attrs[k] = v
                names.attrs[e.key] = e.name
            for k, v in (attrs or {}).items():
                h5.attrs[k] = v

    atomic_write(path, write)


def read_h5(path: str | os.PathLike) -> tuple[list[Entry], dict[str, Any]]:
    """(the entries of a file in ONE's layout, in key order — numeric keys by number — and
    its root attributes)."""
    import h5py

    with h5py.File(path, "r") as h5:
        keys = sorted(h5["value"].keys(), key=lambda k: (not k.isdigit(), int(k)
                                                         if k.isdigit() else 0, k))
        names = h5["name"].attrs if "name" in h5 else {}
        entries = [Entry(k, str(names.get(k, "")), np.asarray(h5["value"][k]),
                         {a: np.asarray(v) for a, v in h5["value"][k].attrs.items()})
                   for k in keys]
        return entries, {k: v.item() if hasattr(v, "item") else v
                         for k, v in h5.attrs.items()}
