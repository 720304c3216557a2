"""Record TensorFlow's results of the Flex kernels' ops on cases flex_ops.tflite lacks.

Run by hand, never by CI (it needs tensorflow-cpu; see scripts/make_ondevice_models.py):

    /work/tfenv/bin/python scripts/record_flex_kernels.py [--out tests/data/ondevice]

Each case calls one ``tf.raw_ops`` op in eager on fixed-seed inputs: MaxPoolGrad on inputs full
of ties (small integers), with SAME, VALID and EXPLICIT padding and overlapping windows;
AvgPoolGrad with other windows; Conv2DBackpropInput / Filter with dilations, EXPLICIT padding
and groups; the depthwise ones with dilations and multiplier 3; BiasAddGrad of rank 2 and 5;
ReluGrad / Relu6Grad at exactly 0 and 6; TanhGrad; SigmoidGrad; BroadcastGradientArgs on
shapes with 1s, empty shapes and zero sizes; LeakyReluGrad, EluGrad, SeluGrad, SoftplusGrad,
SoftsignGrad; (Sparse)SoftmaxCrossEntropyWithLogits; MaxPoolGradV2. Writes
``flex_kernels_tf.npz`` (``<case>/in/<i>`` the op's inputs in order, ``<case>/out/<i>`` its
outputs) and ``flex_kernels_tf.json`` (per case: the op, its attributes as ``FLEX_KERNELS``
takes them, its input and output count; TF's message for a case TF refuses).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def _cases(rng: np.random.Generator) -> list[tuple[str, str, dict, list]]:
    """(case name, TF op, attrs (TF's keyword arguments), inputs)."""
    f32 = np.float32
    ties = rng.integers(0, 3, (2, 7, 8, 2)).astype(f32)
    out = []

    def pool(name: str, ksize: int, stride: int, padding: str, explicit=()):
        attrs = {"ksize": [1, ksize, ksize, 1], "strides": [1, stride, stride, 1],
                 "padding": padding, "data_format": "NHWC"}
        if padding == "EXPLICIT":
            attrs["explicit_paddings"] = list(explicit)
        out.append((f"max_pool_grad_{name}", "MaxPoolGrad", attrs, ["pool", ties]))

    pool("ties_same_k3s2", 3, 2, "SAME")
    pool("ties_valid_k3s1", 3, 1, "VALID")
    pool("ties_same_k2s2", 2, 2, "SAME")
    pool("ties_explicit", 3, 2, "EXPLICIT", (0, 0, 1, 2, 2, 0, 0, 0))
    for name, k, s, pad in (("k2s1_same", 2, 1, "SAME"), ("k3s3_valid", 3, 3, "VALID"),
                            ("k4s2_same", 4, 2, "SAME")):
        attrs = {"ksize": [1, k, k, 1], "strides": [1, s, s, 1], "padding": pad,
                 "data_format": "NHWC"}
        out.append((f"avg_pool_grad_{name}", "AvgPoolGrad", attrs, ["avg", (2, 7, 8, 2)]))
    x = rng.standard_normal((1, 8, 7, 4)).astype(f32)
    for name, w_shape, s, d, pad, explicit in (
            ("dilated_same", (3, 3, 4, 5), 1, 2, "SAME", ()),
            ("dilated_valid_s2", (2, 3, 4, 6), 2, 2, "VALID", ()),
            ("explicit", (3, 2, 4, 5), 2, 1, "EXPLICIT", (0, 0, 2, 1, 0, 3, 0, 0)),
            ("grouped", (3, 3, 2, 6), 1, 1, "SAME", ())):
        attrs = {"strides": [1, s, s, 1], "dilations": [1, d, d, 1], "padding": pad,
                 "data_format": "NHWC"}
        if explicit:
            attrs["explicit_paddings"] = list(explicit)
        w = rng.standard_normal(w_shape).astype(f32)
        out.append((f"conv2d_backprop_filter_{name}", "Conv2DBackpropFilter", attrs,
                    ["conv_filter", x, w]))
        out.append((f"conv2d_backprop_input_{name}", "Conv2DBackpropInput", attrs,
                    ["conv_input", x, w]))
    for name, w_shape, s, d, pad in (("dilated_same", (3, 3, 4, 3), 1, 2, "SAME"),
                                     ("s2_valid", (2, 3, 4, 1), 2, 1, "VALID")):
        attrs = {"strides": [1, s, s, 1], "dilations": [1, d, d, 1], "padding": pad,
                 "data_format": "NHWC"}
        w = rng.standard_normal(w_shape).astype(f32)
        out.append((f"depthwise_backprop_filter_{name}", "DepthwiseConv2dNativeBackpropFilter",
                    attrs, ["dw_filter", x, w]))
        out.append((f"depthwise_backprop_input_{name}", "DepthwiseConv2dNativeBackpropInput",
                    attrs, ["dw_input", x, w]))
    for shape in ((6, 5), (2, 3, 2, 2, 4)):
        out.append((f"bias_add_grad_rank{len(shape)}", "BiasAddGrad", {"data_format": "NHWC"},
                    [rng.standard_normal(shape).astype(f32)]))
    feats = np.asarray([-1.0, 0.0, 1e-8, 3.0, 6.0, 6.5, -0.0, 5.999999], f32)
    grads = rng.standard_normal(feats.shape).astype(f32)
    out.append(("relu_grad_edges", "ReluGrad", {}, [grads, feats]))
    out.append(("relu6_grad_edges", "Relu6Grad", {}, [grads, feats]))
    y = np.tanh(rng.standard_normal((4, 6))).astype(f32)
    out.append(("tanh_grad", "TanhGrad", {}, [y, rng.standard_normal((4, 6)).astype(f32)]))
    y = (1 / (1 + np.exp(-rng.standard_normal((4, 6))))).astype(f32)
    out.append(("sigmoid_grad", "SigmoidGrad", {}, [y, rng.standard_normal((4, 6)).astype(f32)]))
    for i, (a, b) in enumerate((([1, 3, 1], [1, 1, 5]), ([1], [1]), ([], [2, 3]), ([2, 1], [1]),
                                ([1, 1], [1, 1, 1]), ([5], [5]), ([2, 3], []),
                                ([0, 1], [1, 4]), ([4, 1, 5], [3, 1]))):
        out.append((f"broadcast_gradient_args_{i}", "BroadcastGradientArgs", {},
                    [np.asarray(a, np.int32), np.asarray(b, np.int32)]))
    # appended last, so the cases above keep their inputs
    feats = np.concatenate([feats, rng.standard_normal(8).astype(f32) * 3])
    grads = rng.standard_normal(feats.shape).astype(f32)
    out.append(("leaky_relu_grad", "LeakyReluGrad", {"alpha": 0.3}, [grads, feats]))
    out.append(("softplus_grad", "SoftplusGrad", {}, [grads, feats]))
    out.append(("softsign_grad", "SoftsignGrad", {}, [grads, feats]))
    elu = np.where(feats > 0, feats, np.expm1(feats)).astype(f32)
    out.append(("elu_grad", "EluGrad", {}, [grads, elu]))
    selu = (1.0507009873554805 * np.where(feats > 0, feats, 1.6732632423543772
                                           * np.expm1(feats))).astype(f32)
    out.append(("selu_grad", "SeluGrad", {}, [grads, selu]))
    logits = (rng.standard_normal((5, 7)) * 4).astype(f32)
    probs = rng.dirichlet(np.ones(7), 5).astype(f32)
    out.append(("softmax_xent", "SoftmaxCrossEntropyWithLogits", {}, [logits, probs]))
    out.append(("softmax_xent_broadcast_labels", "SoftmaxCrossEntropyWithLogits", {},
                [logits, probs[:1]]))
    out.append(("sparse_softmax_xent", "SparseSoftmaxCrossEntropyWithLogits", {},
                [logits, np.asarray([0, 6, 3, 3, 1], np.int32)]))
    out.append(("max_pool_grad_v2", "MaxPoolGradV2", {"padding": "SAME", "data_format": "NHWC"},
                ["pool_v2", ties]))
    return out


def _run(tf, op: str, attrs: dict, inputs: list) -> tuple[list, list]:
    """The op's TF inputs (in its order) and outputs."""
    raw = getattr(tf.raw_ops, op)
    kind = inputs[0] if isinstance(inputs[0], str) else None
    if kind == "pool":
        x = inputs[1]
        fwd = {k: v for k, v in attrs.items()}
        y = tf.raw_ops.MaxPool(input=x, **fwd).numpy()
        g = np.random.default_rng(1).standard_normal(y.shape).astype(np.float32)
        args = [x, y, g]
        res = raw(orig_input=x, orig_output=y, grad=g, **attrs)
    elif kind == "pool_v2":
        x, ksize, strides = inputs[1], np.asarray([1, 3, 2, 1], np.int32), np.asarray(
            [1, 2, 1, 1], np.int32)
        y = tf.raw_ops.MaxPool(input=x, ksize=ksize.tolist(), strides=strides.tolist(),
                               **attrs).numpy()
        g = np.random.default_rng(4).standard_normal(y.shape).astype(np.float32)
        args = [x, y, g, ksize, strides]
        res = raw(orig_input=x, orig_output=y, grad=g, ksize=ksize, strides=strides, **attrs)
    elif kind == "avg":
        shape = np.asarray(inputs[1], np.int32)
        y = tf.raw_ops.AvgPool(value=np.zeros(inputs[1], np.float32), **attrs).numpy()
        g = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
        args = [shape, g]
        res = raw(orig_input_shape=shape, grad=g, **attrs)
    elif kind in ("conv_filter", "conv_input", "dw_filter", "dw_input"):
        x, w = inputs[1], inputs[2]
        fwd = tf.raw_ops.Conv2D if kind.startswith("conv") else tf.raw_ops.DepthwiseConv2dNative
        y = fwd(input=x, filter=w, **attrs).numpy()
        g = np.random.default_rng(3).standard_normal(y.shape).astype(np.float32)
        if kind.endswith("filter"):
            args = [x, np.asarray(w.shape, np.int32), g]
            res = raw(input=x, filter_sizes=args[1], out_backprop=g, **attrs)
        else:
            args = [np.asarray(x.shape, np.int32), w, g]
            res = raw(input_sizes=args[0], filter=w, out_backprop=g, **attrs)
    else:
        args = inputs
        names = {"BiasAddGrad": ["out_backprop"], "ReluGrad": ["gradients", "features"],
                 "Relu6Grad": ["gradients", "features"], "TanhGrad": ["y", "dy"],
                 "SigmoidGrad": ["y", "dy"], "BroadcastGradientArgs": ["s0", "s1"],
                 "LeakyReluGrad": ["gradients", "features"],
                 "SoftplusGrad": ["gradients", "features"],
                 "SoftsignGrad": ["gradients", "features"],
                 "EluGrad": ["gradients", "outputs"], "SeluGrad": ["gradients", "outputs"],
                 "SoftmaxCrossEntropyWithLogits": ["features", "labels"],
                 "SparseSoftmaxCrossEntropyWithLogits": ["features", "labels"]}[op]
        res = raw(**dict(zip(names, args)), **attrs)
    outs = list(res) if isinstance(res, (list, tuple)) else [res]
    return args, [np.asarray(o) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/ondevice")
    args = ap.parse_args()
    import tensorflow as tf

    arrays: dict[str, np.ndarray] = {}
    report: dict = {"tensorflow": tf.__version__, "cases": {}}
    for name, op, attrs, inputs in _cases(np.random.default_rng(0)):
        rec: dict = {"op": op, "attrs": attrs}
        try:
            ins, outs = _run(tf, op, attrs, inputs)
        except Exception as e:  # noqa: BLE001  (record what TF says)
            rec["tf_error"] = str(e).splitlines()[0][:300]
        else:
            rec["inputs"], rec["outputs"] = len(ins), len(outs)
            arrays.update({f"{name}/in/{i}": np.asarray(a) for i, a in enumerate(ins)})
            arrays.update({f"{name}/out/{i}": a for i, a in enumerate(outs)})
        report["cases"][name] = rec
        print(name, {k: v for k, v in rec.items() if k != "attrs"})
    out = Path(args.out)
    np.savez_compressed(out / "flex_kernels_tf.npz", **arrays)
    (out / "flex_kernels_tf.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
