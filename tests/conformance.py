"""Test oracles: one-operator models run by LiteRT and by circle-jax on the same bytes.

``check_op`` is the conformance row used by every operator test: the builder writes a one-op
model, LiteRT's reference kernels run the .tflite bytes, circle-jax runs the same bytes and
the .circle twin, and the float32 outputs must agree. ``check_op_grads`` compares circle-jax's
gradients with float64 finite differences.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ai_edge_litert import interpreter as litert
from jax.test_util import check_grads

import circle_jax as cj
from circle_jax.build import Builder

# Relative and absolute float32 tolerances: LiteRT's reference kernels and XLA both
# accumulate in float32 but in different orders, so agreement is to a few ulps of the
# largest partial sums (~1e-6 relative for short reductions, 1e-5 covers long ones).
RTOL, ATOL = 1e-5, 1e-5


class Const:
    """Marks an input of ``check_op`` as a constant tensor of the model."""

    def __init__(self, value: Any, dtype: str | None = None) -> None:
        self.value = np.asarray(value, dtype=dtype)


def one_op_model(
    op_type: str,
    inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    **op_kwargs: Any,
) -> tuple[Builder, list[np.ndarray]]:
    """A builder holding one operator; non-Const inputs become graph inputs (None = omitted)."""
    b = Builder()
    idx, feeds = [], []
    for j, v in enumerate(inputs):
        if v is None:
            idx.append(-1)
        elif isinstance(v, Const):
            idx.append(b.constant(f"c{j}", v.value))
        else:
            arr = np.asarray(v)
            idx.append(b.input(f"x{j}", arr.shape, arr.dtype.name))
            feeds.append(arr)
    out = b.op(op_type, idx, options, **op_kwargs)
    b.output(*(out if isinstance(out, tuple) else (out,)))
    return b, feeds


def run_litert(tflite: bytes, feeds: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run .tflite bytes with LiteRT's builtin (reference, no-delegate) kernels."""
    interp = litert.Interpreter(
        model_content=tflite,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
    )
    details = interp.get_input_details()
    for d, x in zip(details, feeds):
        if tuple(d["shape"]) != x.shape:
            interp.resize_tensor_input(d["index"], x.shape)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def run_litert_all(tflite: bytes, feeds: Sequence[np.ndarray]
                   ) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """LiteRT's outputs (builtin kernels, no delegate) and every tensor it computed, by name
    (``experimental_preserve_all_tensors``; tensors without data, scratch, left out)."""
    interp = litert.Interpreter(
        model_content=tflite, experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    tensors = {}
    for d in interp.get_tensor_details():
        try:
            tensors[d["name"]] = interp.get_tensor(d["index"]).copy()
        except ValueError:
            pass
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()], tensors


def run_circle_jax(data: bytes, feeds: Sequence[np.ndarray], jit: bool = True,
                   lowering: Any = None) -> list[np.ndarray]:
    model = cj.load(data, lowering=lowering)
    fn = jax.jit(model.apply) if jit else model.apply
    return [np.asarray(o) for o in fn(model.params, *feeds)]


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, what: str) -> None:
    assert got.shape == want.shape, f"{what}: shape {got.shape} != LiteRT {want.shape}"
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def check_op(
    op_type: str,
    inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    *,
    rtol: float = RTOL,
    atol: float = ATOL,
    lowering: Any = None,
    **op_kwargs: Any,
) -> list[np.ndarray]:
    """One conformance row: LiteRT vs circle-jax (jit and eager, .tflite and .circle bytes)."""
    b, feeds = one_op_model(op_type, inputs, options, **op_kwargs)
    tflite, circle = b.to_bytes("tflite"), b.to_bytes("circle")
    want = run_litert(tflite, feeds)
    for data, label, jit in ((tflite, "tflite/jit", True), (tflite, "tflite/eager", False),
                             (circle, "circle/jit", True)):
        got = run_circle_jax(data, feeds, jit=jit, lowering=lowering)
        assert len(got) == len(want), f"{label}: {len(got)} outputs, LiteRT has {len(want)}"
        for k, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype, f"{label} output {k}: dtype {g.dtype} != LiteRT {w.dtype}"
            assert_close(g, w, rtol, atol, f"{op_type} {label} output {k}")
    return want


def check_op_grads(
    op_type: str,
    inputs: Sequence[Any],
    options: Mapping[str, Any] | None = None,
    *,
    eps: float = 1e-4,
    tol: float = 1e-5,
    output_index: int = 0,
    lowering: Any = None,
    **op_kwargs: Any,
) -> None:
    """Gradients of the op (w.r.t. float inputs and constants) vs float64 finite differences,
    jitted (see :func:`check_model_grads`)."""
    b, feeds = one_op_model(op_type, inputs, options, **op_kwargs)
    check_model_grads(cj.load(b.to_bytes("circle"), lowering=lowering), feeds, output_index,
                      eps=eps, tol=tol)


def check_model_grads(
    model: cj.Model,
    feeds: Sequence[np.ndarray],
    output_index: int = 0,
    *,
    eps: float = 1e-4,
    tol: float = 1e-5,
    eager: bool = False,
) -> None:
    """jax.grad of a cosine-weighted sum of one output w.r.t. the params and the float inputs
    vs float64 finite differences (x64 enabled), jitted and, with ``eager``, eager.

    Eager gradients run the jitted program's primitives one compile each (two thirds of a
    gradient test's time), so they are checked where Python follows concrete values: the
    control-flow and recurrent operators (:func:`check_grads_x64`) and the bundled example's
    branches (tests/train/test_branching.py). Every operator's eager forward is checked by
    :func:`check_op`."""
    with jax.enable_x64(True):
        params = {k: jnp.asarray(v, jnp.float64) for k, v in model.params.items()}
        xs = [jnp.asarray(x, jnp.float64) if np.issubdtype(x.dtype, np.floating) else x
              for x in feeds]
        float_inputs = [j for j, x in enumerate(xs) if jnp.issubdtype(x.dtype, jnp.floating)]

        def f(p: dict, *fx: Any) -> Any:
            args = list(xs)
            for j, v in zip(float_inputs, fx):
                args[j] = v
            out = model.apply(p, *args)[output_index]
            return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

        primal = [params, *(xs[j] for j in float_inputs)]
        for fn in (jax.jit(f), f) if eager else (jax.jit(f),):
            check_grads(fn, primal, order=1, modes=["rev"], eps=eps, atol=tol, rtol=tol)


def check_grads_x64(
    model: cj.Model, feeds: Sequence[np.ndarray], out: int = 0, eager: bool = True
) -> None:
    """The gradient check with the finer step and tolerance of the control-flow and
    recurrent tests."""
    check_model_grads(model, feeds, out, eps=1e-5, tol=1e-6, eager=eager)


def refused_at_load(data: bytes, error: type[Exception] = cj.CircleFormatError) -> str:
    """The message with which ``cj.load`` refuses ``data``: one line, of bounded length."""
    with pytest.raises(error) as e:
        cj.load(data)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 1200, msg
    return msg
