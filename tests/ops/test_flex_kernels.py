"""The Flex kernels (circle_jax.ops.flex) against TensorFlow's numbers: flex_ops.npz (TF eager
on each signature of flex_ops.tflite, run here from the file's own NodeDefs) and
flex_kernels_tf.npz (scripts/record_flex_kernels.py: ties, EXPLICIT padding, dilations,
groups, edge values). These are float32 ops: tolerances are float32 rounding (1e-6 of the
output's largest magnitude); selection ops (ReluGrad, MaxPoolGrad, BroadcastGradientArgs,
EnsureShape) match exactly."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
from flatbuffers import flexbuffers

from circle_jax.errors import CircleFormatError, DataError, UnsupportedOperatorError
from circle_jax.formats import read_model
from circle_jax.formats.tf_checkpoint import read_checkpoint
from circle_jax.formats.tf_proto import NodeDef
from circle_jax.ops.flex import FLEX_KERNELS, FLEX_OPS, flex_op_name, unknown_flex_ops
from circle_jax.ops.flex.nodedef import attributes
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")
EXACT = {"ReluGrad", "Relu6Grad", "MaxPoolGrad", "MaxPoolGradV2", "BroadcastGradientArgs",
         "EnsureShape"}
REQUIRED = {"ReluGrad", "Relu6Grad", "TanhGrad", "SigmoidGrad", "MaxPoolGrad", "AvgPoolGrad",
            "Conv2DBackpropFilter", "Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
            "DepthwiseConv2dNativeBackpropInput", "BiasAddGrad", "BroadcastGradientArgs",
            "EnsureShape", "Save", "Restore"}


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text and text
    return text


def _close(op: str, got, want, what: str) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if op in EXACT:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        scale = max(1.0, float(np.max(np.abs(want), initial=0)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale, err_msg=what)


def _flex_signatures():
    model = read_model(os.path.join(DATA, "flex_ops.tflite"))
    out = []
    for sig in model.signature_defs:
        sg = model.subgraphs[sig.subgraph_index]
        ops = [op for op in sg.operators if op.custom_code]
        if ops:
            out.append((sig, sg, ops[0]))
    return out


FLEX_SIGNATURES = _flex_signatures()


def test_registry_covers_the_required_ops():
    assert REQUIRED <= set(FLEX_KERNELS)
    assert FLEX_OPS["Conv2DBackpropFilter"].static_inputs == {1}
    assert FLEX_OPS["Save"].host and not FLEX_OPS["ReluGrad"].host
    assert unknown_flex_ops(["FlexReluGrad", "ReluGrad", "FlexFoo", "Bar", "FlexFoo"]) == [
        "Bar", "FlexFoo"]
    assert flex_op_name("FlexMaxPoolGrad") == "MaxPoolGrad" and flex_op_name("Relu") is None


@pytest.mark.parametrize("sig, sg, op", FLEX_SIGNATURES, ids=[s.key for s, _, _ in
                                                               FLEX_SIGNATURES])
def test_kernels_on_the_files_nodedefs_equal_tf(sig, sg, op):
    name, attrs = attributes(op.custom_options, op.custom_code)
    npz = np.load(os.path.join(DATA, "flex_ops.npz"))
    by_tensor = {i: n for n, i in sig.inputs.items()}
    args = [sg.tensors[i].data if sg.tensors[i].data is not None
            else npz[f"{sig.key}/in/{by_tensor[i]}"] for i in op.inputs]
    fn = FLEX_KERNELS[name]
    out = fn(attrs, *args)
    outs = out if isinstance(out, tuple) else (out,)
    names = {i: n for n, i in sig.outputs.items()}
    assert len(outs) == len(op.outputs)
    for k, t in enumerate(op.outputs):
        _close(name, outs[k], npz[f"{sig.key}/out/{names[t]}"], f"{sig.key} output {k}")
    static = FLEX_OPS[name].static_inputs
    if not static:  # a pure function of its arrays: the same under jit
        jitted = jax.jit(lambda *a: fn(attrs, *a))(*args)
        for a, b in zip(jitted if isinstance(jitted, tuple) else (jitted,), outs):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    elif len(static) < len(args):
        fixed = {i: args[i] for i in static}
        free = [i for i in range(len(args)) if i not in static]

        def call(*a):
            full = {**fixed, **dict(zip(free, a))}
            return fn(attrs, *(full[i] for i in range(len(args))))

        np.testing.assert_array_equal(np.asarray(jax.jit(call)(*(args[i] for i in free))),
                                      np.asarray(outs[0]))


# TF's defaults and the README's geometry (strides 2) for the signatures the converter made
# builtins of, whose NodeDefs the file therefore lacks.
BUILTIN_SIGNATURES = {
    "tanh_grad": ("TanhGrad", {"T": "float32"}, ["y", "dy"]),
    "sigmoid_grad": ("SigmoidGrad", {"T": "float32"}, ["y", "dy"]),
    "bias_add_grad": ("BiasAddGrad", {"T": "float32", "data_format": "NHWC"}, ["out_backprop"]),
    **{f"conv2d_backprop_input_{p.lower()}": (
        "Conv2DBackpropInput", {"T": "float32", "data_format": "NHWC", "padding": p,
                                "strides": [1, 2, 2, 1], "dilations": [1, 1, 1, 1]},
        [np.asarray([2, 7, 7, 3], np.int32), "filter", "out_backprop"]) for p in ("SAME",
                                                                                 "VALID")},
}


@pytest.mark.parametrize("sig", sorted(BUILTIN_SIGNATURES))
def test_kernels_of_the_signatures_made_builtin_equal_tf(sig):
    op, attrs, inputs = BUILTIN_SIGNATURES[sig]
    npz = np.load(os.path.join(DATA, "flex_ops.npz"))
    args = [npz[f"{sig}/in/{i}"] if isinstance(i, str) else i for i in inputs]
    _close(op, FLEX_KERNELS[op](attrs, *args), npz[f"{sig}/out/output"], sig)


def _recorded():
    with open(os.path.join(DATA, "flex_kernels_tf.json")) as f:
        return json.load(f)["cases"]


RECORDED = _recorded()


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_kernels_equal_tf_on_recorded_cases(case):
    c = RECORDED[case]
    npz = np.load(os.path.join(DATA, "flex_kernels_tf.npz"))
    out = FLEX_KERNELS[c["op"]](c["attrs"], *(npz[f"{case}/in/{i}"] for i in range(c["inputs"])))
    outs = out if isinstance(out, tuple) else (out,)
    assert len(outs) == c["outputs"]
    for k, o in enumerate(outs):
        _close(c["op"], o, npz[f"{case}/out/{k}"], f"{case} output {k}")


def test_max_pool_grad_gives_each_window_to_its_first_maximum():
    x = np.ones((1, 4, 4, 1), np.float32)
    attrs = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID"}
    g = np.arange(1, 5, dtype=np.float32).reshape(1, 2, 2, 1)
    got = np.asarray(FLEX_KERNELS["MaxPoolGrad"](attrs, x, None, g))[0, :, :, 0]
    np.testing.assert_array_equal(got, [[1, 0, 2, 0], [0, 0, 0, 0], [3, 0, 4, 0], [0, 0, 0, 0]])


def test_attributes_of_the_tutorial_file():
    model = read_model(os.path.join(DATA, "tutorial_cnn.tflite"))
    found = {}
    for sg in model.subgraphs:
        for op in sg.operators:
            if op.custom_code:
                name, attrs = attributes(op.custom_options, op.custom_code)
                found.setdefault(name, attrs)
    assert found["MaxPoolGrad"] == {"T": "float32", "data_format": "NHWC",
                                    "explicit_paddings": [], "ksize": [1, 2, 2, 1],
                                    "padding": "VALID", "strides": [1, 2, 2, 1]}
    assert found["Conv2DBackpropFilter"]["use_cudnn_on_gpu"] is True
    assert found["Restore"]["preferred_shard"] == -1
    assert found["Save"]["T"] == ["float32"] * 4 + ["int64", "float32"]
    ensure = [op for sig, sg, op in FLEX_SIGNATURES if op.custom_code == "FlexEnsureShape"][0]
    assert attributes(ensure.custom_options)[1]["shape"] == (3, 5)


def _options(name: str, nodedef: bytes) -> bytes:
    """Flex custom_options [name, NodeDef] as TF writes them (FlexBuffers' builder takes str
    only: a placeholder of the NodeDef's length is written, then its bytes put in its place)."""
    b = flexbuffers.Builder()
    placeholder = "\x01" * len(nodedef)
    with b.Vector():
        b.String(name)
        b.String(placeholder)
    return bytes(b.Finish()).replace(placeholder.encode(), nodedef)


def test_tensor_attributes_decode_and_are_bounded():
    node = NodeDef(op="Const")
    t = node.attr["value"].tensor
    t.dtype = 1
    for d in (2, 2):
        t.tensor_shape.dim.add(size=d)
    t.float_val.append(0.5)
    node.attr["dtype"].type = 9
    node.attr["shape"].shape.unknown_rank = True
    node.attr["names"].list.s.extend([b"a", b"\xff"])
    name, attrs = attributes(_options("Const", node.SerializeToString()), "FlexConst")
    assert name == "Const" and attrs["dtype"] == "int64" and attrs["shape"] is None
    assert attrs["names"] == ["a", b"\xff"]
    np.testing.assert_array_equal(attrs["value"], np.full((2, 2), 0.5, np.float32))
    t.tensor_shape.dim[0].size = 1 << 30
    with pytest.raises(CircleFormatError) as e:
        attributes(_options("Const", node.SerializeToString()), "FlexConst")
    assert "FlexConst" in _one_line(e) and "larger than its file allows" in str(e.value)


def test_malformed_custom_options_are_one_line_naming_the_op():
    with pytest.raises(CircleFormatError) as e:
        attributes(b"\x00\x01garbage", "FlexReluGrad")
    assert "FlexReluGrad" in _one_line(e)
    node = NodeDef(op="ReluGrad").SerializeToString()
    assert attributes(_options("ReluGrad", node), "FlexReluGrad") == ("ReluGrad", {})
    with pytest.raises(CircleFormatError) as e:
        attributes(_options("ReluGrad", b"\x12\x05abc"), "FlexReluGrad")
    assert "does not parse as a TensorFlow NodeDef" in _one_line(e)
    with pytest.raises(CircleFormatError) as e:
        attributes(_options("Relu6Grad", node), "FlexRelu6Grad")
    assert "NodeDef is of op 'ReluGrad'" in _one_line(e)
    with pytest.raises(CircleFormatError) as e:
        attributes(_options("ReluGrad", node), "FlexRelu6Grad")
    assert "custom_code 'Relu6Grad'" in _one_line(e)


def test_unsupported_attributes_are_refused_in_one_line():
    x = np.zeros((1, 4, 4, 2), np.float32)
    g = np.zeros((1, 2, 2, 2), np.float32)
    base = {"ksize": [1, 2, 2, 1], "strides": [1, 2, 2, 1], "padding": "VALID"}
    with pytest.raises(UnsupportedOperatorError) as e:
        FLEX_KERNELS["MaxPoolGrad"](dict(base, data_format="NCHW"), x, None, g)
    assert "NCHW" in _one_line(e)
    with pytest.raises(UnsupportedOperatorError, match="batch or channel"):
        FLEX_KERNELS["MaxPoolGrad"](dict(base, padding="EXPLICIT",
                                         explicit_paddings=[1, 0, 0, 0, 0, 0, 0, 0]), x, None, g)
    with pytest.raises(CircleFormatError, match="padding 'FULL'"):
        FLEX_KERNELS["MaxPoolGrad"](dict(base, padding="FULL"), x, None, g)
    with pytest.raises(CircleFormatError, match="grad has shape"):
        FLEX_KERNELS["MaxPoolGrad"](base, x, None, np.zeros((1, 3, 3, 2), np.float32))
    with pytest.raises(CircleFormatError, match="out_backprop has shape"):
        FLEX_KERNELS["Conv2DBackpropFilter"](
            {"strides": [1, 1, 1, 1], "padding": "VALID"}, x, np.asarray([3, 3, 2, 4]),
            np.zeros((1, 4, 4, 4), np.float32))
    with pytest.raises(UnsupportedOperatorError) as e:
        jax.jit(lambda s, d: FLEX_KERNELS["Conv2DBackpropFilter"](
            {"strides": [1, 1, 1, 1], "padding": "SAME"}, x, s, d))(
            np.asarray([3, 3, 2, 4]), np.zeros((1, 4, 4, 4), np.float32))
    assert "filter_sizes must be a constant" in _one_line(e)


def test_shape_ops_refuse_bad_shapes():
    with pytest.raises(DataError) as e:
        FLEX_KERNELS["BroadcastGradientArgs"]({}, np.asarray([2, 3]), np.asarray([4, 3]))
    assert "do not broadcast" in _one_line(e)
    with pytest.raises(DataError) as e:
        FLEX_KERNELS["EnsureShape"]({"shape": (3, 5)}, np.zeros((2, 5)))
    assert "[2, 5] is not compatible with [3, 5]" in _one_line(e)
    assert FLEX_KERNELS["EnsureShape"]({"shape": (-1, 5)}, np.zeros((2, 5))).shape == (2, 5)
    assert FLEX_KERNELS["EnsureShape"]({"shape": None}, np.zeros(2)).shape == (2,)


def test_save_and_restore_kernels(tmp_path):
    src = os.path.join(DATA, "tutorial_cnn.init.ckpt")
    npz = np.load(os.path.join(DATA, "tutorial_cnn.npz"))
    restore = FLEX_KERNELS["Restore"]
    k = restore({"dt": "float32", "preferred_shard": -1}, np.asarray(src.encode(), object),
                np.asarray(b"cnn/conv/kernel", object))
    np.testing.assert_array_equal(k, npz["init/cnn/conv/kernel"])
    step = restore({"dt": "int64"}, src, "sgd/iteration")
    assert step.dtype == np.int64 and step.shape == ()
    with pytest.raises(DataError) as e:
        restore({"dt": "float32"}, src, "sgd/iteration")
    assert "is int64, Restore expects float32" in _one_line(e)
    with pytest.raises(DataError) as e:
        restore({"dt": "float32"}, src, "nope")
    assert "no tensor 'nope'" in _one_line(e)
    out = str(tmp_path / "saved.ckpt")
    names = np.asarray([b"a", b"b"], object)
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.asarray(3, np.int64)
    assert FLEX_KERNELS["Save"]({"T": ["float32", "int64"]}, out, names, a, b) == ()
    got = read_checkpoint(out)
    np.testing.assert_array_equal(got["a"], a)
    assert got["b"] == 3 and got["b"].dtype == np.int64
    with pytest.raises(DataError, match="its type T says"):
        FLEX_KERNELS["Save"]({"T": ["float32", "float32"]}, out, names, a, b)
    with pytest.raises(DataError, match="2 tensor names for 1 tensors"):
        FLEX_KERNELS["Save"]({}, out, names, a)
