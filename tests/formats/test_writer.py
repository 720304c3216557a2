"""The writer: every shared model read and written back with no pass is equal to its source
field by field (external buffers moved inside the FlatBuffer, the one change allowed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.writer import _inline_external_buffers, write_model
from tests.paths import shared_model, shared_model_names


def differences(a: Any, b: Any, path: str = "model") -> list[str]:
    """Where two circle-schema object trees differ (empty when equal field by field)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if a is None or b is None:
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        return [] if np.array_equal(np.asarray(a), np.asarray(b)) else [f"{path}: values"]
    if isinstance(a, list) or isinstance(b, list):
        if a is None or b is None or len(a) != len(b):
            return [f"{path}: {a if a is None else len(a)} vs {b if b is None else len(b)}"]
        return [d for j, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{j}]")]
    if hasattr(a, "__dict__") or hasattr(b, "__dict__"):
        if type(a) is not type(b):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        return [d for k in vars(a) for d in differences(getattr(a, k), getattr(b, k),
                                                        f"{path}.{k}")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def source_tree(data: bytes) -> Any:
    m = unpack(data)
    _inline_external_buffers(m, data)
    return m


def test_differences_finds_a_changed_field() -> None:
    data = open(shared_model("tflm_hello_world_sine_float.tflite"), "rb").read()
    a, b = source_tree(data), source_tree(data)
    b.subgraphs[0].tensors[1].shape = np.array([7])
    b.signatureDefs = None
    assert differences(a, a) == []
    assert differences(a, b) == ["model.subgraphs[0].tensors[1].shape: values",
                                 "model.signatureDefs: 1 vs None"]


@pytest.mark.parametrize("name", shared_model_names())
def test_a_round_trip_with_no_pass_keeps_every_field(name: str) -> None:
    data = open(shared_model(name), "rb").read()
    written = write_model(read_model(data))
    assert differences(source_tree(data), source_tree(written)) == []


def test_shared_equal_buffers_merge_constants_and_keep_variables_apart() -> None:
    """``share_equal_buffers``: two constants of equal bytes read one buffer; a variable
    of the same bytes keeps its own (a runtime may write it); a different constant its own."""
    from circle_jax.formats.schema import OPERATOR_CODES
    from circle_jax.graph import ir

    ones, twos = np.ones(4, np.float32), np.full(4, 2, np.float32)
    tensors = (ir.Tensor(0, "x", (4,), "float32", 0),
               *(ir.Tensor(k, n, (4,), "float32", ir.NEW_BUFFER, d, is_variable=n == "v")
                 for k, (n, d) in enumerate([("a", ones), ("b", ones), ("v", ones),
                                             ("c", twos)], start=1)),
               *(ir.Tensor(k, f"y{k}", (4,), "float32", 0) for k in range(5, 9)))
    ops = tuple(ir.Operator(k, "ADD", OPERATOR_CODES["ADD"], (0, k + 1), (k + 5,))
                for k in range(4))
    model = ir.Model((ir.Subgraph(0, "main", tensors, ops, (0,), (5, 6, 7, 8)),),
                     "TFL3", 3, "shared", {})
    apart, shared = (unpack(write_model(model, "tflite", share_equal_buffers=s))
                     for s in (False, True))
    buffer = {t.name.decode(): t.buffer for t in shared.subgraphs[0].tensors}
    assert buffer["a"] == buffer["b"] and len({buffer["a"], buffer["v"], buffer["c"]}) == 3
    assert len(shared.buffers) == len(apart.buffers) - 1
    read = read_model(write_model(model, "tflite", share_equal_buffers=True)).main.tensors
    for t, written in zip(tensors[1:5], read[1:5]):
        np.testing.assert_array_equal(written.data, t.data)
