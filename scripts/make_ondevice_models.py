"""Make the on-device training files of tests/data/ondevice/ and record TensorFlow's own numbers.

Run by hand, never by CI: it needs tensorflow-cpu, which the project does not depend on. Use a
virtualenv of its own (TensorFlow is large):

    python3 -m venv /work/tfenv && /work/tfenv/bin/pip install tensorflow-cpu==2.21.0
    /work/tfenv/bin/python scripts/make_ondevice_models.py [--out tests/data/ondevice]

Then, to record what stock LiteRT does with the files (no TensorFlow needed):

    /work/main/.venv/bin/python scripts/make_ondevice_models.py --check-only

Every model is a `tf.Module` whose `@tf.function`s become SignatureDefs; TF's converter turns it
into a `.tflite` file with resource variables enabled and Flex ops allowed
(TFLITE_BUILTINS + SELECT_TF_OPS). The files:

- `mlp_sgd.tflite`: MLP 8 -> 16 -> 4 (relu as tf.maximum(x, 0)), `train(x, y)` one SGD step on
  the MSE (lr 0.1) through tf.GradientTape and assign_sub, `infer(x)`, `save` / `restore`.
- `mlp_adam.tflite`: the same MLP trained on softmax cross-entropy (via tf.nn.log_softmax) with
  Adam written out by hand (m, v, step are tf.Variables; bias correction as in Keras/optax).
- `frozen_head.tflite`: a frozen extractor (non-trainable tf.Variables and one constant) and a
  trainable Dense head; `train` updates the head only, with SGD on softmax cross-entropy.
- `tutorial_cnn.tflite`: TF's "On-device training" tutorial pattern: a Keras model (Conv2D relu,
  MaxPool2D, Flatten, Dense) in a tf.Module, Keras's SGD, Keras's cross-entropy from logits;
  its gradients hold Flex ops. `save` / `restore` cover the model's and the optimizer's variables.
- `tutorial_cnn_adam.tflite`: the same (same initial weights and data) with Keras's Adam(0.01).
- `flex_ops.tflite`: one signature per TF gradient/shape op, each calling exactly one raw op.

Batch 4 everywhere (fixed). All seeds are fixed. For every model TF eager (not the converted file)
records into `<model>.npz`: the inputs `x`, `y`, the variables' initial values `init/<name>`,
`losses` (20 train steps), `infer_before`, `infer_after`, the variables after training
`final/<name>`; for `flex_ops.npz` each signature's inputs `<sig>/in/<name>` and TF's outputs
`<sig>/out/<name>`. Each trainable model also gets two TF V1 checkpoints written by
tf.raw_ops.Save in eager: `<model>.init.ckpt` (initial variables) and `<model>.trained.ckpt`,
keyed by the tensor names listed in `summary.json`. `summary.json` records per file: size, TF
version, signatures with their input/output names, operator codes, Flex ops with their NodeDef
attributes, the variables' shared_names, which variables the converter gave an initialiser, and
what tf.lite.Interpreter does with each signature. `--check-only` adds what ai-edge-litert does.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

BATCH = 4
STEPS = 20
N_IN, N_HIDDEN, N_OUT = 8, 16, 4
SEED = 0
MODELS = ("mlp_sgd", "mlp_adam", "frozen_head", "tutorial_cnn", "tutorial_cnn_adam")


def build_modules():
    """Return {name: tf.Module} for the four trainable models (TensorFlow imported here)."""
    import keras
    import tensorflow as tf

    def const(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    string_spec = tf.TensorSpec([], tf.string)

    class Trainable(tf.Module):
        """Shared save/restore over `self.checkpointed` ({tensor name: variable})."""

        checkpointed: dict

        @tf.function(input_signature=[string_spec])
        def save(self, checkpoint_path):
            names = list(self.checkpointed)
            tf.raw_ops.Save(
                filename=checkpoint_path,
                tensor_names=names,
                data=[v.read_value() for v in self.checkpointed.values()],
                name="save",
            )
            return {"checkpoint_path": checkpoint_path}

        @tf.function(input_signature=[string_spec])
        def restore(self, checkpoint_path):
            out = {}
            for name, var in self.checkpointed.items():
                value = tf.raw_ops.Restore(
                    file_pattern=checkpoint_path, tensor_name=name, dt=var.dtype, name="restore"
                )
                var.assign(tf.reshape(value, var.shape))
                out[name] = value
            return out

    class MLP(Trainable):
        """8 -> 16 -> 4, relu as tf.maximum(x, 0) (its gradient lowers to builtins)."""

        def __init__(self, seed: int, adam: bool):
            super().__init__()
            rng = np.random.default_rng(seed)
            self.adam = adam
            self.w1 = tf.Variable(const(rng, (N_IN, N_HIDDEN), 0.5), name="w1")
            self.b1 = tf.Variable(const(rng, (N_HIDDEN,), 0.1), name="b1")
            self.w2 = tf.Variable(const(rng, (N_HIDDEN, N_OUT), 0.5), name="w2")
            self.b2 = tf.Variable(const(rng, (N_OUT,), 0.1), name="b2")
            self.params = [self.w1, self.b1, self.w2, self.b2]
            self.checkpointed = {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}
            if adam:
                self.m = [tf.Variable(tf.zeros_like(p), name="m_" + n) for n, p in
                          zip(("w1", "b1", "w2", "b2"), self.params)]
                self.v = [tf.Variable(tf.zeros_like(p), name="v_" + n) for n, p in
                          zip(("w1", "b1", "w2", "b2"), self.params)]
                self.step = tf.Variable(0.0, name="step")
                for n, m, v in zip(("w1", "b1", "w2", "b2"), self.m, self.v):
                    self.checkpointed["m_" + n] = m
                    self.checkpointed["v_" + n] = v
                self.checkpointed["step"] = self.step

        def forward(self, x):
            h = tf.maximum(tf.matmul(x, self.w1) + self.b1, 0.0)
            return tf.matmul(h, self.w2) + self.b2

        @tf.function(input_signature=[tf.TensorSpec([BATCH, N_IN], tf.float32)])
        def infer(self, x):
            return {"output": self.forward(x)}

        @tf.function(input_signature=[tf.TensorSpec([BATCH, N_IN], tf.float32),
                                      tf.TensorSpec([BATCH, N_OUT], tf.float32)])
        def train(self, x, y):
            with tf.GradientTape() as tape:
                out = self.forward(x)
                if self.adam:
                    loss = -tf.reduce_mean(tf.reduce_sum(y * tf.nn.log_softmax(out), axis=1))
                else:
                    loss = tf.reduce_mean(tf.square(out - y))
            grads = tape.gradient(loss, self.params)
            if not self.adam:
                for p, g in zip(self.params, grads):
                    p.assign_sub(0.1 * g)
                return {"loss": loss}
            lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
            self.step.assign_add(1.0)
            t = self.step.read_value()
            lr_t = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
            for p, g, m, v in zip(self.params, grads, self.m, self.v):
                m.assign(b1 * m + (1.0 - b1) * g)
                v.assign(b2 * v + (1.0 - b2) * tf.square(g))
                p.assign_sub(lr_t * m / (tf.sqrt(v) + eps))
            return {"loss": loss}

    class FrozenHead(Trainable):
        """Frozen 8 -> 16 extractor (tanh of a constant-scaled layer) and a trained 16 -> 4 head."""

        def __init__(self, seed: int):
            super().__init__()
            rng = np.random.default_rng(seed)
            self.scale = tf.constant(const(rng, (N_IN,), 1.0))  # a plain constant
            self.fw = tf.Variable(const(rng, (N_IN, N_HIDDEN), 0.5), trainable=False, name="fw")
            self.fb = tf.Variable(const(rng, (N_HIDDEN,), 0.1), trainable=False, name="fb")
            self.hw = tf.Variable(const(rng, (N_HIDDEN, N_OUT), 0.5), name="hw")
            self.hb = tf.Variable(np.zeros(N_OUT, np.float32), name="hb")
            self.checkpointed = {"fw": self.fw, "fb": self.fb, "hw": self.hw, "hb": self.hb}

        def forward(self, x):
            feat = tf.stop_gradient(tf.tanh(tf.matmul(x * self.scale, self.fw) + self.fb))
            return tf.matmul(feat, self.hw) + self.hb

        @tf.function(input_signature=[tf.TensorSpec([BATCH, N_IN], tf.float32)])
        def infer(self, x):
            return {"output": self.forward(x)}

        @tf.function(input_signature=[tf.TensorSpec([BATCH, N_IN], tf.float32),
                                      tf.TensorSpec([BATCH, N_OUT], tf.float32)])
        def train(self, x, y):
            with tf.GradientTape() as tape:
                loss = -tf.reduce_mean(
                    tf.reduce_sum(y * tf.nn.log_softmax(self.forward(x)), axis=1))
            grads = tape.gradient(loss, [self.hw, self.hb])
            for p, g in zip((self.hw, self.hb), grads):
                p.assign_sub(0.5 * g)
            return {"loss": loss}

    class TutorialCNN(Trainable):
        """TF's on-device training tutorial pattern: Keras layers and Keras SGD in a tf.Module."""

        def __init__(self, seed: int, adam: bool):
            super().__init__()
            keras.utils.set_random_seed(seed)
            L = keras.layers
            self.model = keras.Sequential([
                keras.Input((8, 8, 1)),
                L.Conv2D(4, 3, padding="same", activation="relu", name="conv"),
                L.MaxPool2D(2, name="pool"),
                L.Flatten(name="flatten"),
                L.Dense(3, name="dense"),
            ], name="cnn")
            self.model.compile(
                optimizer=keras.optimizers.Adam(learning_rate=0.01) if adam
                else keras.optimizers.SGD(learning_rate=0.1),
                loss=keras.losses.CategoricalCrossentropy(from_logits=True),
            )
            self.model.optimizer.build(self.model.trainable_variables)

        @property
        def checkpointed(self) -> dict:
            """The model's and the optimizer's variables by Keras path, read at trace time as
            the tutorial does (so the tf.Module itself tracks them only through the model)."""
            return {v.path: v.value for v in
                    [*self.model.weights, *self.model.optimizer.variables]}

        @tf.function(input_signature=[tf.TensorSpec([BATCH, 8, 8, 1], tf.float32)])
        def infer(self, x):
            return {"output": self.model(x)}

        @tf.function(input_signature=[tf.TensorSpec([BATCH, 8, 8, 1], tf.float32),
                                      tf.TensorSpec([BATCH, 3], tf.float32)])
        def train(self, x, y):
            with tf.GradientTape() as tape:
                loss = self.model.loss(y, self.model(x))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.model.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            return {"loss": loss}

    return {
        "mlp_sgd": MLP(SEED, adam=False),
        "mlp_adam": MLP(SEED, adam=True),
        "frozen_head": FrozenHead(SEED + 1),
        "tutorial_cnn": TutorialCNN(SEED + 2, adam=False),
        "tutorial_cnn_adam": TutorialCNN(SEED + 2, adam=True),
    }


def model_data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Fixed inputs and one-hot / regression targets for a model."""
    same_data = "tutorial_cnn" if name.startswith("tutorial_cnn") else name
    rng = np.random.default_rng(100 + MODELS.index(same_data))
    if name.startswith("tutorial_cnn"):
        x = rng.standard_normal((BATCH, 8, 8, 1)).astype(np.float32)
        y = np.eye(3, dtype=np.float32)[rng.integers(0, 3, BATCH)]
        return x, y
    x = rng.standard_normal((BATCH, N_IN)).astype(np.float32)
    if name == "mlp_sgd":
        return x, rng.standard_normal((BATCH, N_OUT)).astype(np.float32)
    return x, np.eye(N_OUT, dtype=np.float32)[rng.integers(0, N_OUT, BATCH)]


def flex_module():
    """A tf.Module with one signature per raw op; returns (module, {sig: {input: array}})."""
    import tensorflow as tf

    rng = np.random.default_rng(7)

    def arr(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def spec(name: str, a: np.ndarray, dynamic: bool) -> tf.TensorSpec:
        shape = (None, *a.shape[1:]) if dynamic else a.shape
        return tf.TensorSpec(shape, tf.as_dtype(a.dtype), name=name)

    inputs: dict[str, dict[str, np.ndarray]] = {}
    fns: dict[str, object] = {}

    def add(sig: str, fn, dynamic: bool = False, **ins: np.ndarray) -> None:
        names = list(ins)
        inputs[sig] = ins

        def body(*args):
            out = fn(**dict(zip(names, args)))
            if isinstance(out, tuple):
                return {f"output_{i}": o for i, o in enumerate(out)}
            return {"output": out}

        fns[sig] = tf.function(body, input_signature=[spec(n, ins[n], dynamic) for n in names])

    raw = tf.raw_ops
    feat = arr(2, 6, 6, 3)
    add("relu_grad", lambda gradients, features: raw.ReluGrad(
        gradients=gradients, features=features), gradients=arr(2, 6, 6, 3), features=feat)
    add("relu6_grad", lambda gradients, features: raw.Relu6Grad(
        gradients=gradients, features=features),
        gradients=arr(2, 6, 6, 3), features=(feat * 4.0).astype(np.float32))
    add("tanh_grad", lambda y, dy: raw.TanhGrad(y=y, dy=dy),
        y=np.tanh(arr(3, 5)).astype(np.float32), dy=arr(3, 5))
    add("sigmoid_grad", lambda y, dy: raw.SigmoidGrad(y=y, dy=dy),
        y=(1 / (1 + np.exp(-arr(3, 5)))).astype(np.float32), dy=arr(3, 5))

    x7 = arr(2, 7, 7, 3)
    for padding in ("SAME", "VALID"):
        p = padding.lower()
        pooled = tf.nn.max_pool2d(x7, 3, 2, padding).numpy()
        add(f"max_pool_grad_{p}", lambda orig_input, orig_output, grad, padding=padding:
            raw.MaxPoolGrad(orig_input=orig_input, orig_output=orig_output, grad=grad,
                            ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding=padding,
                            data_format="NHWC"),
            orig_input=x7, orig_output=pooled, grad=arr(*pooled.shape))
        pooled_shape = tf.nn.avg_pool2d(x7, 3, 2, padding).shape
        add(f"avg_pool_grad_{p}", lambda grad, padding=padding: raw.AvgPoolGrad(
            orig_input_shape=tf.constant(x7.shape, tf.int32), grad=grad, ksize=[1, 3, 3, 1],
            strides=[1, 2, 2, 1], padding=padding, data_format="NHWC"),
            grad=arr(*pooled_shape))

        filt = arr(3, 3, 3, 5)
        conv_shape = tf.nn.conv2d(x7, filt, 2, padding).shape
        add(f"conv2d_backprop_filter_{p}", lambda input, out_backprop, padding=padding:
            raw.Conv2DBackpropFilter(
                input=input, filter_sizes=tf.constant([3, 3, 3, 5], tf.int32),
                out_backprop=out_backprop, strides=[1, 2, 2, 1], padding=padding,
                data_format="NHWC", dilations=[1, 1, 1, 1]),
            input=x7, out_backprop=arr(*conv_shape))
        add(f"conv2d_backprop_input_{p}", lambda filter, out_backprop, padding=padding:
            raw.Conv2DBackpropInput(
                input_sizes=tf.constant(x7.shape, tf.int32), filter=filter,
                out_backprop=out_backprop, strides=[1, 2, 2, 1], padding=padding,
                data_format="NHWC", dilations=[1, 1, 1, 1]),
            filter=filt, out_backprop=arr(*conv_shape))

        dfilt = arr(3, 3, 3, 2)
        dw_shape = tf.nn.depthwise_conv2d(x7, dfilt, [1, 2, 2, 1], padding).shape
        add(f"depthwise_backprop_filter_{p}", lambda input, out_backprop, padding=padding:
            raw.DepthwiseConv2dNativeBackpropFilter(
                input=input, filter_sizes=tf.constant([3, 3, 3, 2], tf.int32),
                out_backprop=out_backprop, strides=[1, 2, 2, 1], padding=padding,
                data_format="NHWC", dilations=[1, 1, 1, 1]),
            input=x7, out_backprop=arr(*dw_shape))
        add(f"depthwise_backprop_input_{p}", lambda filter, out_backprop, padding=padding:
            raw.DepthwiseConv2dNativeBackpropInput(
                input_sizes=tf.constant(x7.shape, tf.int32), filter=filter,
                out_backprop=out_backprop, strides=[1, 2, 2, 1], padding=padding,
                data_format="NHWC", dilations=[1, 1, 1, 1]),
            filter=dfilt, out_backprop=arr(*dw_shape))

    add("bias_add_grad", lambda out_backprop: raw.BiasAddGrad(
        out_backprop=out_backprop, data_format="NHWC"), out_backprop=arr(2, 4, 4, 5))
    add("broadcast_gradient_args", lambda s0, s1: raw.BroadcastGradientArgs(s0=s0, s1=s1),
        s0=np.array([4, 1, 5], np.int32), s1=np.array([3, 1], np.int32))
    # A dynamic first dimension, or the converter drops the EnsureShape as a no-op.
    add("ensure_shape", lambda input: raw.EnsureShape(input=input, shape=[3, 5]),
        dynamic=True, input=arr(3, 5))

    module = tf.Module()
    for sig, fn in fns.items():
        setattr(module, sig, fn)
    return module, inputs


def convert(module, signatures: dict, path: Path) -> None:
    """SavedModel with the given {key: concrete function}, then TF's converter -> path."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures=signatures)
        conv = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=list(signatures))
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS,
                                          tf.lite.OpsSet.SELECT_TF_OPS]
        conv.experimental_enable_resource_variables = True
        path.write_bytes(conv.convert())


def describe(path: Path) -> dict:
    """What the converted file holds: operator codes, Flex ops (with NodeDef attrs), variables."""
    from flatbuffers import flexbuffers
    from google.protobuf import text_format
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.lite.python import schema_py_generated as tfl

    buf = path.read_bytes()
    model = tfl.ModelT.InitFromObj(tfl.Model.GetRootAsModel(buf, 0))
    names = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}
    codes = []
    for c in model.operatorCodes:
        code = max(c.builtinCode, c.deprecatedBuiltinCode)
        codes.append(c.customCode.decode() if code == tfl.BuiltinOperator.CUSTOM
                     else names[code])
    subgraphs, flex, shared_names, initialised = [], {}, set(), set()
    init_indices = set()
    for sg in model.subgraphs:
        for op in sg.operators:
            if codes[op.opcodeIndex] == "CALL_ONCE":
                init_indices.add(op.builtinOptions.initSubgraphIndex)
    for index, sg in enumerate(model.subgraphs):
        handles = {}
        ops = []
        for op in sg.operators:
            code = codes[op.opcodeIndex]
            ops.append(code)
            if code == "VAR_HANDLE":
                name = op.builtinOptions.sharedName.decode()
                handles[op.outputs[0]] = name
                shared_names.add(name)
            if code == "ASSIGN_VARIABLE" and index in init_indices:
                initialised.add(handles.get(op.inputs[0], "?"))
            if code.startswith("Flex"):
                # flexbuffers.Loads fails on some: the NodeDef is a FlexBuffer STRING (not a
                # BLOB), often not UTF-8, so read the vector's elements as raw bytes.
                root = flexbuffers.GetRoot(bytes(op.customOptions))
                vec = root.AsVector
                node = node_def_pb2.NodeDef.FromString(vec[1].AsStringBytes)
                entry = flex.setdefault(code, {
                    "custom_options": {
                        "root": "untyped vector" if root.IsVector and not root.IsTypedVector
                                else "other",
                        "length": len(vec),
                        "elements_are_strings": [vec[i].IsString for i in range(len(vec))],
                        "element_0": vec[0].AsString,
                        "custom_options_format": op.customOptionsFormat,
                    },
                    "nodedef_op": node.op,
                    "nodedef_inputs": list(node.input),
                    "count": 0,
                    "attr_variants": [],
                })
                entry["count"] += 1
                attrs = {k: text_format.MessageToString(v, as_one_line=True)
                         for k, v in sorted(node.attr.items())}
                if attrs not in entry["attr_variants"]:
                    entry["attr_variants"].append(attrs)
        subgraphs.append({"name": (sg.name or b"").decode(), "operators": ops})
    sigs = {}
    for s in model.signatureDefs:
        sigs[s.signatureKey.decode()] = {
            "subgraph": s.subgraphIndex,
            "inputs": [t.name.decode() for t in s.inputs],
            "outputs": [t.name.decode() for t in s.outputs],
        }
    return {
        "bytes": len(buf),
        "operator_codes": codes,
        "signatures": sigs,
        "subgraphs": subgraphs,
        "flex_ops": flex,
        "variables_shared_names": sorted(shared_names),
        "variables_with_initialiser": sorted(initialised),
        "variables_without_initialiser": sorted(shared_names - initialised),
    }


def interpreter_check(path: Path, feeds: dict, expected: dict, which: str) -> dict:
    """Run every signature on a fresh stock interpreter (so from the file's initial state); record
    each output's shape and its largest difference from TF's number in `expected`
    ({sig: {output: array}}), or the interpreter's error."""
    import re

    if which == "ai_edge_litert":
        from ai_edge_litert.interpreter import Interpreter
    else:
        import tensorflow as tf
        Interpreter = tf.lite.Interpreter
    result: dict = {}
    try:
        result["signatures"] = sorted(Interpreter(model_path=str(path)).get_signature_list())
    except Exception as e:  # noqa: BLE001 - recording the interpreter's own message
        result["load_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"
        return result
    for sig, ins in feeds.items():
        try:  # a fresh interpreter per signature: its error text is its own
            out = Interpreter(model_path=str(path)).get_signature_runner(sig)(**ins)
        except Exception as e:  # noqa: BLE001
            text = str(e)
            nodes = re.findall(r"Node number \d+ \(\w+\) failed to (?:prepare|invoke)", text)
            first = text.strip().split(". ")[0].split("Node number")[0]
            result[sig] = f"{type(e).__name__}: {first} ... {nodes[-1] if nodes else text[-200:]}"
            continue
        result[sig] = {}
        for k, v in out.items():
            v = np.asarray(v)
            entry: dict = {"shape": list(v.shape), "dtype": str(v.dtype)}
            ref = expected.get(sig, {}).get(k)
            if ref is not None and v.dtype.kind == "f":
                entry["finite"] = bool(np.all(np.isfinite(v)))
                if entry["finite"]:
                    entry["max_abs_diff_vs_tf"] = float(np.max(np.abs(v - ref), initial=0.0))
            elif ref is not None:
                entry["equal_to_tf"] = bool(np.array_equal(v, ref))
            result[sig][k] = entry
    return result


def check_inputs(name: str, out: Path) -> tuple[dict, dict]:
    """Inputs for every signature of a file and TF's expected outputs, read back from its npz.

    For a trainable model: infer (initial variables), train (its first loss), restore, save."""
    data = np.load(out / f"{name}.npz")
    if name == "flex_ops":
        feeds: dict = {}
        expected: dict = {}
        for key in data.files:
            sig, kind, io = key.split("/")
            (feeds if kind == "in" else expected).setdefault(sig, {})[io] = data[key]
        return feeds, expected
    feeds = {"infer": {"x": data["x"]}, "train": {"x": data["x"], "y": data["y"]},
             "restore": {"checkpoint_path": np.array(str(out / f"{name}.init.ckpt"))},
             "save": {"checkpoint_path": np.array(str(Path(tempfile.gettempdir()) / "ck"))}}
    expected = {"infer": {"output": data["infer_before"]}, "train": {"loss": data["losses"][0]}}
    return feeds, expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/data/ondevice"))
    parser.add_argument("--check-only", action="store_true",
                        help="only record ai-edge-litert's behaviour into summary.json")
    args = parser.parse_args()
    out: Path = args.out
    summary_path = out / "summary.json"
    if args.check_only:
        summary = json.loads(summary_path.read_text())
        for name in (*MODELS, "flex_ops"):
            summary[name]["ai_edge_litert"] = interpreter_check(
                out / f"{name}.tflite", *check_inputs(name, out), "ai_edge_litert")
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
        return

    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    tf.random.set_seed(SEED)
    summary: dict = {"tensorflow": tf.__version__}
    for name, module in build_modules().items():
        x, y = model_data(name)
        arrays = {"x": x, "y": y}
        for k, v in module.checkpointed.items():
            arrays[f"init/{k}"] = v.numpy()
        module.save(tf.constant(str(out / f"{name}.init.ckpt")))
        sigs = {"train": module.train.get_concrete_function(),
                "infer": module.infer.get_concrete_function(),
                "save": module.save.get_concrete_function(),
                "restore": module.restore.get_concrete_function()}
        convert(module, sigs, out / f"{name}.tflite")
        arrays["infer_before"] = module.infer(x)["output"].numpy()
        arrays["losses"] = np.array(
            [module.train(x, y)["loss"].numpy() for _ in range(STEPS)], np.float32)
        arrays["infer_after"] = module.infer(x)["output"].numpy()
        for k, v in module.checkpointed.items():
            arrays[f"final/{k}"] = v.numpy()
        module.save(tf.constant(str(out / f"{name}.trained.ckpt")))
        np.savez(out / f"{name}.npz", **arrays)
        for stage in ("init", "trained"):  # TF's own reader agrees with the recorded values
            reader = tf.compat.v1.train.NewCheckpointReader(str(out / f"{name}.{stage}.ckpt"))
            key = "init" if stage == "init" else "final"
            for k in module.checkpointed:
                np.testing.assert_array_equal(reader.get_tensor(k), arrays[f"{key}/{k}"])
        summary[name] = describe(out / f"{name}.tflite")
        summary[name]["checkpoint_tensor_names"] = list(module.checkpointed)
        summary[name]["losses_first_last"] = [float(arrays["losses"][0]),
                                              float(arrays["losses"][-1])]
        print(name, summary[name]["bytes"], "bytes, losses",
              summary[name]["losses_first_last"], flush=True)

    module, inputs = flex_module()
    arrays = {}
    sigs = {}
    for sig, ins in inputs.items():
        fn = getattr(module, sig)
        outs = fn(*[tf.constant(v) for v in ins.values()])
        for k, v in ins.items():
            arrays[f"{sig}/in/{k}"] = v
        for k, v in outs.items():
            arrays[f"{sig}/out/{k}"] = v.numpy()
        sigs[sig] = fn.get_concrete_function()
    convert(module, sigs, out / "flex_ops.tflite")
    np.savez(out / "flex_ops.npz", **arrays)
    summary["flex_ops"] = describe(out / "flex_ops.tflite")

    for name in (*MODELS, "flex_ops"):
        summary[name]["tf_lite_interpreter"] = interpreter_check(
            out / f"{name}.tflite", *check_inputs(name, out), "tf")
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
