"""TF's quantization-aware training (tensorflow-model-optimization) of the digits CNN, for
tests/data/quantized/: the reference circle-jax's QAT is compared with.

Run by hand, never by CI: it needs TensorFlow, tf-keras (Keras 2, which tfmot needs) and
tensorflow-model-optimization, which the project does not depend on:

    python3 -m venv /work/tfenv && /work/tfenv/bin/pip install tensorflow-cpu tf-keras \
        tensorflow-model-optimization
    TF_USE_LEGACY_KERAS=1 /work/tfenv/bin/python scripts/qat_tfmot_reference.py

The model is `make_quantized_models.build`'s architecture (Conv2D 3x3 ReLU ->
DepthwiseConv2D 3x3 -> ReLU6 -> 1x1 Conv2D added to the first convolution -> MaxPool 2x2 ->
AveragePool 2x2 -> Reshape -> Dense(64, ReLU), concatenated with the first convolution's
spatial mean -> Dense(10) -> Softmax), seeded and untrained: its starting point is Keras's
initialization, so every run below starts from the same weights. The data: the bundled 8x8
digits / 16, the first 1536 for training (48 batches of 32, in order, no shuffling), the
other 261 for testing.

From that one Keras model it writes:

- ``qat_cnn_tfmot.tflite``: tfmot's ``quantize_model`` of it before any training (weights
  the initialization's; every activation range tfmot's initial ``[-6, 6]``), converted to
  full int8 (int8 input and output): the starting point of tfmot's QAT as a file;
- ``qat_cnn_ptq.tflite``: the float model converted to full int8 with a representative
  dataset (the first 64 training digits): the file a user of the converter has;
- ``qat_reference.json``: for each optimizer (SGD lr 0.01, Adam lr 0.001), 10 epochs at
  batch 32 of Keras float training and of tfmot's QAT from that start: per-epoch losses
  (Keras's: the mean of the batches' losses before each update, sparse categorical cross
  entropy on the softmax's probabilities), training accuracy, and the test accuracy after
  10 epochs (tfmot's: of its QAT Keras model, and of its export converted to full int8 and
  run by TF's LiteRT interpreter).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_model_optimization as tfmot  # noqa: E402
import tf_keras as keras  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TRAIN = 1536
BATCH = 32
EPOCHS = 10
OPTIMIZERS = {"sgd": ("SGD", 0.01), "adam": ("Adam", 0.001)}


def digits() -> tuple[np.ndarray, np.ndarray]:
    data = np.load(ROOT / "circle_jax" / "examples" / "digits.npz")
    x = data["images"].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    return x, data["labels"].astype(np.int64)


def build(batch: int | None = None, seed: int = 0) -> keras.Model:
    """`make_quantized_models.build` in tf-keras (``batch``: the input's fixed batch size,
    1 for the converter, so its RESHAPE has a constant shape as in the other files)."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    x = keras.Input((8, 8, 1), batch_size=batch, name="image")
    a = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    d = layers.DepthwiseConv2D(3, padding="same")(a)
    d = layers.ReLU(6.0)(d)
    p = layers.Conv2D(8, 1)(d)
    s = layers.Add()([a, p])
    s = layers.MaxPooling2D(2)(s)
    s = layers.AveragePooling2D(2)(s)
    f = layers.Reshape((32,))(s)
    h = layers.Dense(64, activation="relu")(f)
    g = layers.GlobalAveragePooling2D()(a)
    c = layers.Concatenate()([h, g])
    y = layers.Dense(10)(c)
    y = layers.Softmax()(y)
    return keras.Model(x, y)


def fresh(weights: list[np.ndarray], qat: bool, batch: int | None = None) -> keras.Model:
    """The model with ``weights`` (tfmot's ``quantize_model`` of it with ``qat``: then
    ``weights`` are the float model's or, as ``get_weights`` gives them, a QAT model's)."""
    model = build(batch)
    if not qat:
        model.set_weights(weights)
        return model
    model = tfmot.quantization.keras.quantize_model(model)
    model.set_weights(weights)
    return model


def convert(model: keras.Model, rep: np.ndarray | None) -> bytes:
    """``model`` (batch size free) rebuilt at batch size 1 and converted to full int8 (int8
    input and output); ``rep``: a representative dataset (PTQ), None for a QAT model (its
    own ranges)."""
    qat = rep is None
    model = fresh(model.get_weights(), qat, batch=1)
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if rep is not None:
        conv.representative_dataset = lambda: ([v[None]] for v in rep)
        conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    conv.inference_input_type = tf.int8
    conv.inference_output_type = tf.int8
    return conv.convert()


def litert_accuracy(data: bytes, x: np.ndarray, y: np.ndarray) -> float:
    interp = tf.lite.Interpreter(model_content=data)
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    interp.resize_tensor_input(inp["index"], [1, 8, 8, 1])
    interp.allocate_tensors()
    s, z = inp["quantization"]
    hits = 0
    for v, label in zip(x, y):
        q = np.clip(np.round(v / s) + z, -128, 127).astype(np.int8)
        interp.set_tensor(inp["index"], q[None])
        interp.invoke()
        hits += int(np.argmax(interp.get_tensor(out["index"])[0]) == label)
    return hits / len(x)


def train(weights: list[np.ndarray], qat: bool, optimizer: str, x: np.ndarray,
          y: np.ndarray, xt: np.ndarray, yt: np.ndarray) -> tuple[dict, keras.Model]:
    model = fresh(weights, qat=False)
    if qat:
        model = tfmot.quantization.keras.quantize_model(model)
    name, lr = OPTIMIZERS[optimizer]
    model.compile(getattr(keras.optimizers, name)(learning_rate=lr),
                  "sparse_categorical_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    _, test_acc = model.evaluate(xt, yt, batch_size=BATCH, verbose=0)
    return {"loss": [round(float(v), 6) for v in hist.history["loss"]],
            "accuracy": [round(float(v), 6) for v in hist.history["accuracy"]],
            "test_accuracy": round(float(test_acc), 6)}, model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "quantized"))
    out = Path(ap.parse_args().out)
    x, y = digits()
    xs, ys, xt, yt = x[:TRAIN], y[:TRAIN], x[TRAIN:], y[TRAIN:]
    weights = build().get_weights()
    start = tfmot.quantization.keras.quantize_model(fresh(weights, qat=False))
    start(xs[:BATCH], training=True)  # sets the weights' ranges (their min/max), moves the
    # activations' 0.1% from [-6, 6] toward the batch's and the input's to the batch's
    files = {"qat_cnn_tfmot": convert(start, None),
             "qat_cnn_ptq": convert(fresh(weights, qat=False), xs[:64])}
    for name, data in files.items():
        (out / f"{name}.tflite").write_bytes(data)
    info: dict = {"tensorflow": tf.__version__, "tfmot": tfmot.__version__,
                  "keras": keras.__version__, "train": TRAIN, "test": len(xt),
                  "batch_size": BATCH, "epochs": EPOCHS,
                  "optimizers": {k: {"name": n, "learning_rate": lr}
                                 for k, (n, lr) in OPTIMIZERS.items()}}
    for opt in OPTIMIZERS:
        floats, _ = train(weights, False, opt, xs, ys, xt, yt)
        qat, model = train(weights, True, opt, xs, ys, xt, yt)
        qat["export_test_accuracy"] = round(litert_accuracy(convert(model, None), xt, yt), 6)
        info[opt] = {"float": floats, "tfmot_qat": qat}
        print(opt, "float", floats["loss"], "\n    tfmot", qat["loss"], flush=True)
    (out / "qat_reference.json").write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
