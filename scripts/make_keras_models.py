"""Build the small Keras models of tests/data/keras/, convert them, record Keras's losses.

Run by hand, never by CI: it needs tensorflow-cpu, which the project does not depend on.
Use a virtualenv of its own (TensorFlow is large):

    python3 -m venv /work/tfvenv && /work/tfvenv/bin/pip install tensorflow-cpu numpy
    /work/tfvenv/bin/python scripts/make_keras_models.py [--out tests/data/keras]

For every case it builds a seeded Keras model, converts it with TensorFlow's own TFLite
converter (float32, no optimisations, batch dimension fixed to 1 in the signature as onert
requires) and writes `<case>.tflite`. The tests rewrite the identifier to `CIR0` themselves when
they want a .circle file. It then trains a fresh copy of the initial weights with Keras's own
`model.fit` (shuffle=False, lr 0.01, 3 epochs) for {mse, cce} x {sgd, adam} x batch {1, 16} and
records the per-epoch losses in `keras_losses.json`, together with the TF/Keras versions and what
the converter did to each model (shared constant tensors, dropped biases, subgraphs, operator
codes). The inputs, one-hot targets and Keras's initial weights go to `data.npz`.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.lite.python import schema_py_generated as tfl  # noqa: E402
from tensorflow.python.framework.convert_to_constants import (  # noqa: E402
    convert_variables_to_constants_v2,
)

N_SAMPLES = 32
N_CLASSES = 3
EPOCHS = 3
LR = 0.01
LOSSES = ("mse", "cce")
OPTIMIZERS = ("sgd", "adam")
BATCHES = (1, 16)
L = keras.layers


def branching_cnn() -> keras.Model:
    """Three Conv2Ds with equal zero biases of shape [4]: the converter keeps one shared tensor."""
    x = keras.Input((8, 8, 1))
    c1 = L.Conv2D(4, 3, padding="same", activation="relu")(x)
    c2 = L.Conv2D(4, 3, padding="same", activation="relu")(c1)
    c3 = L.Conv2D(4, 3, padding="same", activation="relu")(c1)
    y = L.MaxPooling2D(2)(L.Add()([c2, c3]))
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(L.Flatten()(y)))


def mlp_zero_bias() -> keras.Model:
    """Dense layers with use_bias=True whose biases start at zero: the converter drops them."""
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu")(x)
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(h))


def mlp_no_bias() -> keras.Model:
    """Dense(use_bias=False) layers: no bias anywhere, in Keras or in the file."""
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu", use_bias=False)(x)
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax", use_bias=False)(h))


def layernorm() -> keras.Model:
    """LayerNormalization: MEAN/SQUARED_DIFFERENCE/ADD(eps)/RSQRT/MUL(gamma)/ADD(beta).

    beta starts random: with Keras's default zero beta the converter folds the beta ADD away
    (as it drops zero FC biases) and no file-level rule could tell where it was.
    """
    x = keras.Input((6,))
    beta = keras.initializers.RandomNormal(stddev=0.1)
    h = L.LayerNormalization(beta_initializer=beta)(L.Dense(8, activation="relu")(x))
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(h))


def conv1d_stack() -> keras.Model:
    """Two Conv1Ds with equal zero biases (shared) over a [16, 2] sequence."""
    x = keras.Input((16, 2))
    h = L.Conv1D(4, 3, activation="relu")(x)
    h = L.Conv1D(4, 3, activation="relu")(h)
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(L.Flatten()(h)))


def lstm() -> keras.Model:
    """A small LSTM: converted to a WHILE loop whose zero initial states are constants."""
    x = keras.Input((5, 3))
    h = L.LSTM(4)(x)
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(h))


def three_consumers() -> keras.Model:
    """An activation read by three operators (two FULLY_CONNECTED and an ADD)."""
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu")(x)
    a = L.Dense(8, activation="relu")(h)
    b = L.Dense(8, activation="relu")(h)
    s = L.Add()([a, b, h])
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(s))


VOCAB = 20


def embedding() -> keras.Model:
    """Embedding(20, 8) over 6 int32 token ids, Flatten, Dense softmax: ids repeat within and
    across samples, so a row's gradient sums several occurrences."""
    x = keras.Input((6,), dtype="int32")
    h = L.Flatten()(L.Embedding(VOCAB, 8)(x))
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(h))


def residual_bias_free() -> keras.Model:
    """A residual block whose inner Dense has no bias (use_bias=False), between Denses whose
    biases start at zero: in the file none of the three has one."""
    x = keras.Input((6,))
    h = L.Dense(8, activation="relu")(x)
    s = L.Add()([h, L.Dense(8, use_bias=False)(h)])
    return keras.Model(x, L.Dense(N_CLASSES, activation="softmax")(s))


#: What the converter does to each case, and what a faithful trainer must do about it.
NOTES = {
    "branching_cnn": "the three zero [4] conv biases become ONE constant read by three CONV_2D "
                     "(Keras trains three); the Dense's zero bias is dropped; the first conv's "
                     "output has two consumers",
    "mlp_zero_bias": "both zero Dense biases are dropped (FULLY_CONNECTED bias input -1) while "
                     "Keras trains them: the file is identical in structure to mlp_no_bias",
    "mlp_no_bias": "no biases in Keras nor in the file; indistinguishable from mlp_zero_bias, so "
                   "adding missing biases (numerics 'keras') is wrong here: train it with "
                   "add_missing_bias=False",
    "layernorm": "LayerNorm lowered to MEAN/SQUARED_DIFFERENCE/ADD(scalar epsilon)/RSQRT/MUL "
                 "(gamma [1, 8] constant)/ADD(beta [1, 8] constant)/MUL/ADD; the epsilon is a "
                 "scalar constant Keras never trains; the FC output has three consumers; zero "
                 "Dense biases are dropped",
    "conv1d_stack": "Conv1D becomes RESHAPE + CONV_2D; the two zero [4] biases become one shared "
                    "constant; the Dense's zero bias is dropped",
    "lstm": "the LSTM becomes a WHILE loop (3 subgraphs); its zero initial states are float "
            "constants of subgraph 0 fed to WHILE (Keras never trains them); in the body the "
            "kernel and recurrent kernel are bias-free FULLY_CONNECTEDs and the LSTM bias is the "
            "[16] constant of an ADD; the final Dense's zero bias is dropped",
    "three_consumers": "the first Dense's output is read by three operators (RESHAPE feeding "
                       "the ADD, two FULLY_CONNECTED); every zero Dense bias is dropped",
    "embedding": "the Embedding becomes GATHER on the [20, 8] table, its ids wrapped by "
                 "LESS/ADD/SELECT for negative values; Keras trains the table with a sparse "
                 "gradient (IndexedSlices, one row per occurrence); the Dense's zero bias is "
                 "dropped",
    "residual_bias_free": "all three FULLY_CONNECTEDs lose their bias input: the two zero "
                          "biases Keras trains and the residual Dense that has none; train it "
                          "with add_missing_bias naming the first and last (op0,op2 when the "
                          "converter keeps Keras's order)",
}

CASES = {
    "branching_cnn": branching_cnn,
    "mlp_zero_bias": mlp_zero_bias,
    "mlp_no_bias": mlp_no_bias,
    "layernorm": layernorm,
    "conv1d_stack": conv1d_stack,
    "lstm": lstm,
    "three_consumers": three_consumers,
    "embedding": embedding,
    "residual_bias_free": residual_bias_free,
}


def make_data(index: int, shape: tuple[int, ...], ids: bool = False
              ) -> tuple[np.ndarray, np.ndarray]:
    """Seeded inputs and one-hot targets given by a fixed random projection's argmax
    (``ids``: int32 token ids in [0, VOCAB), projected through their one-hot counts)."""
    rng = np.random.default_rng(1000 + index)
    if ids:
        x = rng.integers(0, VOCAB, (N_SAMPLES, *shape)).astype(np.int32)
        feats = np.stack([np.bincount(r, minlength=VOCAB) for r in x]).astype(np.float64)
    else:
        x = rng.standard_normal((N_SAMPLES, *shape)).astype(np.float32)
        feats = x.reshape(N_SAMPLES, -1)
    proj = rng.standard_normal((feats.shape[1], N_CLASSES))
    labels = np.argmax(feats @ proj, axis=1)
    return x, np.eye(N_CLASSES, dtype=np.float32)[labels]


#: Cases also converted with batch 16 fixed in the signature (``<case>_b16.tflite``): their
#: batch-1 graphs hold RESHAPEs that no batch-following rule can stretch to another batch size
#: (the LSTM moves time first with a RESHAPE to [T, 1, F]; three_consumers reshapes the
#: [1, 8] activation to [8] before the ADD).
BATCH16_FILES = ("lstm", "three_consumers")


def convert(model: keras.Model, shape: tuple[int, ...], batch: int = 1) -> bytes:
    """TF's own converter: float32, no optimisations, batch 1 in the signature."""

    dtype = tf.as_dtype(model.inputs[0].dtype)

    @tf.function(input_signature=[tf.TensorSpec([batch, *shape], dtype)])
    def serve(x):
        return model(x, training=False)

    # Variables are frozen to constants first: left as resources, the LSTM's while-loop body
    # reads them with READ_VARIABLE ops that no interpreter can initialise.
    frozen = convert_variables_to_constants_v2(serve.get_concrete_function())
    conv = tf.lite.TFLiteConverter.from_concrete_functions([frozen], model)
    conv.optimizations = []
    return conv.convert()


OPNAMES = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}


def describe(flat: bytes) -> dict:
    """What the converter did: operator codes, shared constants, missing optional biases."""
    m = tfl.ModelT.InitFromObj(tfl.Model.GetRootAsModel(flat, 0))
    codes = []
    for oc in m.operatorCodes:
        code = oc.builtinCode if oc.deprecatedBuiltinCode == 127 else oc.deprecatedBuiltinCode
        codes.append(OPNAMES.get(code, str(code)))
    out: dict = {"subgraphs": len(m.subgraphs), "operators": [], "shared_constants": [],
                 "missing_bias": [], "multi_consumer_activations": []}
    for si, sg in enumerate(m.subgraphs):
        readers: dict[int, list[int]] = {}
        for oi, op in enumerate(sg.operators):
            name = codes[op.opcodeIndex]
            out["operators"].append([si, oi, name])
            inputs = [int(t) for t in op.inputs]
            for t in inputs:
                if t >= 0:
                    readers.setdefault(t, []).append(oi)
            weighted = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D")
            if name in weighted and (len(inputs) < 3 or inputs[2] < 0):
                out["missing_bias"].append({"subgraph": si, "op": oi, "code": name})
        for t, ops in readers.items():
            if len(ops) < 2:
                continue
            tensor = sg.tensors[t]
            buf = m.buffers[tensor.buffer]
            is_const = buf is not None and buf.data is not None and len(buf.data) > 0
            entry = {"subgraph": si, "tensor": int(t), "name": tensor.name.decode(),
                     "shape": [int(d) for d in tensor.shape], "readers": ops,
                     "reader_codes": [codes[sg.operators[o].opcodeIndex] for o in ops]}
            if is_const:
                vals = np.frombuffer(bytes(buf.data), np.uint8)
                entry["all_zero"] = bool(not vals.any())
                out["shared_constants"].append(entry)
            else:
                out["multi_consumer_activations"].append(entry)
    out["operator_counts"] = dict(Counter(o[2] for o in out["operators"]))
    return out


def forward_gap(flat: bytes, model: keras.Model, x: np.ndarray) -> float:
    """Largest |LiteRT(tflite) - Keras| on the first 4 samples (a check of the conversion)."""
    it = tf.lite.Interpreter(model_content=flat)
    it.allocate_tensors()
    inp, outp = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    gap = 0.0
    for i in range(4):
        it.set_tensor(inp, x[i : i + 1])
        it.invoke()
        ref = np.asarray(model(x[i : i + 1], training=False))
        gap = max(gap, float(np.abs(it.get_tensor(outp) - ref).max()))
    return gap


def make_optimizer(name: str) -> keras.optimizers.Optimizer:
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=LR)
    return keras.optimizers.Adam(learning_rate=LR)  # beta 0.9/0.999, epsilon 1e-7


def make_loss(name: str) -> keras.losses.Loss:
    if name == "mse":
        return keras.losses.MeanSquaredError()
    return keras.losses.CategoricalCrossentropy()  # from_logits=False, on the softmax output


def cce_on_softmax_probe() -> dict:
    """Show how Keras's CCE treats a Softmax output: from its logits, or clipped probabilities."""
    logits = np.array([[40.0, 0.0, -40.0]], np.float32)
    target = np.array([[0.0, 0.0, 1.0]], np.float32)
    probs = keras.activations.softmax(tf.constant(logits))
    keras_value = float(keras.losses.CategoricalCrossentropy()(target, probs))
    clipped = float(-np.log(np.clip(np.asarray(probs)[0, 2], 1e-7, 1 - 1e-7)))
    from_logits = float(80.0 + np.log1p(np.exp(-40.0) + np.exp(-80.0)))
    layer_probs = keras.Model(i := keras.Input((3,)), L.Activation("softmax")(i))(logits)
    via_layer = float(keras.losses.CategoricalCrossentropy()(target, layer_probs))
    mode = "from_logits" if abs(keras_value - from_logits) < 1e-3 else "clipped_probabilities"
    return {"logits": logits.tolist(), "target": target.tolist(), "keras_cce": keras_value,
            "keras_cce_through_model": via_layer, "clipped_1e-7": clipped,
            "from_logits": from_logits, "keras_uses": mode}


def sparse_adam_probe() -> dict:
    """Keras's Adam on a sparse (IndexedSlices) gradient: row 0 seen twice (g = 1 and 3), row 1
    never, two steps. Records v and the weights to show how occurrences combine and whether
    unseen rows move."""
    var = keras.Variable(np.zeros((3, 1), np.float32))
    opt = keras.optimizers.Adam(learning_rate=0.1)
    opt.build([var])
    grads = tf.IndexedSlices(tf.constant([[1.0], [3.0], [2.0]]), tf.constant([0, 0, 2]),
                             tf.constant([3, 1]))
    opt.apply_gradients([(grads, var)])
    after_one = np.asarray(var).ravel().tolist()
    opt.apply_gradients([(tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([2]),
                                           tf.constant([3, 1])), var)])
    v = np.asarray(opt._velocities[0]).ravel().tolist()
    return {"gradient": "step 1: rows [0, 0, 2] values [1, 3, 2]; step 2: row 2 value 1",
            "weights_after_step_1": after_one, "weights_after_step_2":
            np.asarray(var).ravel().tolist(), "v_after_step_2": v,
            "v_row0_sum_of_squares": float((1 + 9) * 0.001 * 0.999),
            "v_row0_square_of_sum": float(16 * 0.001 * 0.999)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/keras"))
    ap.add_argument("--only", nargs="*", help="case names (default: all); the other cases' "
                    "records and data are kept")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tf.config.experimental.enable_op_determinism()

    record: dict = {
        "tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__,
        "samples": N_SAMPLES, "epochs": EPOCHS, "learning_rate": LR, "shuffle": False,
        "losses": {"mse": "keras.losses.MeanSquaredError()",
                   "cce": "keras.losses.CategoricalCrossentropy() on the softmax output"},
        "optimizers": {"sgd": "keras.optimizers.SGD(0.01)",
                       "adam": "keras.optimizers.Adam(0.01), beta 0.9/0.999, epsilon 1e-7"},
        "epoch_loss": "Keras's history['loss']: mean of the pre-update batch losses",
        "cce_on_softmax": cce_on_softmax_probe(),
        "sparse_adam": sparse_adam_probe(),
        "cases": {},
    }
    arrays: dict[str, np.ndarray] = {}
    if args.only and (out / "keras_losses.json").exists():
        record["cases"] = json.loads((out / "keras_losses.json").read_text())["cases"]
        arrays = dict(np.load(out / "data.npz"))
    for index, (name, build) in enumerate(CASES.items()):
        if args.only and name not in args.only:
            continue
        keras.utils.set_random_seed(index)
        model = build()
        shape = tuple(int(d) for d in model.input_shape[1:])
        x, y = make_data(index, shape, ids=name == "embedding")
        arrays[f"{name}/x"], arrays[f"{name}/y"] = x, y
        init = model.get_weights()
        for w, v in zip(model.weights, init):
            arrays[f"{name}/init/{w.path}"] = v
        flat = convert(model, shape)
        (out / f"{name}.tflite").write_bytes(flat)
        files = {"1": f"{name}.tflite", "16": f"{name}.tflite"}
        if name in BATCH16_FILES:
            files["16"] = f"{name}_b16.tflite"
            (out / files["16"]).write_bytes(convert(model, shape, 16))
        case = {"doc": build.__doc__, "note": NOTES[name], "files_by_batch": files,
                "input_shape": [1, *shape],
                "keras_weights": [[w.path, list(w.shape)] for w in model.weights],
                "converter": describe(flat),
                "litert_vs_keras_forward_max_abs": forward_gap(flat, model, x), "runs": {}}
        for loss in LOSSES:
            for opt in OPTIMIZERS:
                for batch in BATCHES:
                    model.set_weights(init)
                    model.compile(optimizer=make_optimizer(opt), loss=make_loss(loss),
                                  jit_compile=False)
                    hist = model.fit(x, y, batch_size=batch, epochs=EPOCHS, shuffle=False,
                                     verbose=0)
                    key = f"{loss}/{opt}/{batch}"
                    case["runs"][key] = [float(v) for v in hist.history["loss"]]
                    print(name, key, case["runs"][key], flush=True)
        record["cases"][name] = case
    (out / "keras_losses.json").write_text(json.dumps(record, indent=1) + "\n")
    np.savez_compressed(out / "data.npz", **arrays)


if __name__ == "__main__":
    main()
