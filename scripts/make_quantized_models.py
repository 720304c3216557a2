"""Convert a small Keras CNN into TensorFlow's quantized variants for tests/data/quantized/.

Run by hand, never by CI: it needs tensorflow-cpu, which the project does not depend on.
Use a virtualenv of its own:

    python3 -m venv /work/venv-tf && /work/venv-tf/bin/pip install tensorflow-cpu
    /work/venv-tf/bin/python scripts/make_quantized_models.py [--out tests/data/quantized]

The model (seeded, trained 3 epochs on the bundled 8x8 digits so its activations have
realistic ranges): Conv2D(8, 3x3, ReLU) -> DepthwiseConv2D(3x3, ReLU6) -> a 1x1 Conv2D
whose output is added to the first convolution's (a branch) -> MaxPool 2x2 ->
AveragePool 2x2 -> Reshape -> Dense(64, ReLU; its 2048 weights are enough for the
dynamic-range converter to quantize them) -> Concatenate with the spatial mean (MEAN) ->
Dense(10) -> Softmax. It is converted with TensorFlow's TFLite converter into:

- ``full_int8.tflite``: full integer, int8 inputs and outputs (representative dataset: 64
  digits);
- ``full_int8_float_io.tflite``: full integer with float32 inputs and outputs (QUANTIZE and
  DEQUANTIZE at the ends);
- ``int16x8.tflite``: 16x8 (int16 activations, int8 weights, float32 inputs and outputs);
- ``dynamic_range.tflite``: int8 weights, float activations (hybrid kernels);
- ``float16.tflite``: float16 weights dequantized at load (DEQUANTIZE operators).

A second model exercises the integer operators of attention and normalization blocks on the
same digits: Flatten -> Dense(16) -> tanh -> Dense(16) -> sigmoid -> hard_swish(6 s - 3) ->
two Dense(8) whose outer product is a BATCH_MATMUL -> SQUARED_DIFFERENCE with 0.5 -> ADD 1 ->
RSQRT (untrained, seeded). ``ops_full_int8.tflite`` is its full-integer int8 variant;
``ops_int16x8.tflite`` its 16x8 variant without HARD_SWISH and SQUARED_DIFFERENCE (the
converter has no 16x8 HARD_SWISH, LiteRT no int16 SQUARED_DIFFERENCE; a RELU takes the
latter's place). ``--only NAME ...`` writes only the named files (the others as they are).

``mobilenet_full_int8.tflite``: Keras's MobileNet v1 (alpha 0.25, 96x96x3, 10 classes,
untrained, seeded; its head's GlobalAveragePooling2D keeps dims: the 4-d MEAN over axes 1 and
2 of 256 channels LiteRT runs with its specialised kernel), full integer int8, calibrated on
64 seeded uniform [0, 1) images.

``inputs.npz`` holds 8 float32 digits (``x``, [8, 8, 8, 1]); ``versions.json`` the
TensorFlow version and each file's operators.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def digits() -> tuple[np.ndarray, np.ndarray]:
    data = np.load(ROOT / "circle_jax" / "examples" / "digits.npz")
    x = data["images"].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    return x, data["labels"].astype(np.int64)


def build(seed: int = 0) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    x = tf.keras.Input((8, 8, 1), batch_size=1, name="image")
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
    return tf.keras.Model(x, y)


def build_ops(int16: bool, seed: int = 0) -> tf.keras.Model:
    """The operators model (see the module docstring); ``int16`` drops what 16x8 lacks."""
    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    x = tf.keras.Input((8, 8, 1), batch_size=1, name="image")
    t = layers.Activation("tanh")(layers.Dense(16)(layers.Flatten()(x)))
    s = layers.Activation("sigmoid")(layers.Dense(16)(t))
    if not int16:
        s = layers.Activation("hard_swish")(s * 6.0 - 3.0)
    q, k = layers.Dense(8)(s), layers.Dense(8)(s)
    qk = layers.Lambda(lambda ab: tf.matmul(tf.expand_dims(ab[0], 2),
                                            tf.expand_dims(ab[1], 1)))([q, k])
    d = layers.ReLU()(qk) if int16 else layers.Lambda(
        lambda v: tf.math.squared_difference(v, 0.5))(qk)
    r = layers.Lambda(lambda v: tf.math.rsqrt(v + 1.0))(d)
    return tf.keras.Model(x, layers.Flatten()(r))


def convert(model: tf.keras.Model, variant: str, rep: np.ndarray) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    if variant == "float16":
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        conv.target_spec.supported_types = [tf.float16]
        return conv.convert()
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if variant == "dynamic_range":
        return conv.convert()

    def dataset():
        for v in rep:
            yield [v[None]]

    conv.representative_dataset = dataset
    if variant == "int16x8":
        conv.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        return conv.convert()
    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    if variant == "full_int8":
        conv.inference_input_type = tf.int8
        conv.inference_output_type = tf.int8
    return conv.convert()


def build_mobilenet(seed: int = 0) -> tf.keras.Model:
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.applications.MobileNet(input_shape=(96, 96, 3), alpha=0.25, weights=None,
                                           classes=10)


def operators(data: bytes) -> list[str]:
    interp = tf.lite.Interpreter(model_content=data)
    return sorted({d["op_name"] for d in interp._get_ops_details()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "quantized"))
    ap.add_argument("--only", nargs="*", help="write only these models (names without "
                    ".tflite); default: every model and inputs.npz")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    x, y = digits()
    model = build()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[:512], y[:512], batch_size=1, epochs=3, verbose=0, shuffle=False)
    versions = out / "versions.json"
    info = json.loads(versions.read_text()) if args.only and versions.exists() else {
        "tensorflow": tf.__version__, "models": {}}
    jobs = [(variant, model, variant, x[:64]) for variant in (
        "full_int8", "full_int8_float_io", "int16x8", "dynamic_range", "float16")]
    jobs += [("ops_full_int8", build_ops(int16=False), "full_int8", x[:64]),
             ("ops_int16x8", build_ops(int16=True), "int16x8", x[:64])]
    images = np.random.default_rng(0).uniform(0, 1, (64, 96, 96, 3)).astype(np.float32)
    jobs.append(("mobilenet_full_int8", build_mobilenet(), "full_int8", images))
    for name, keras_model, variant, rep in jobs:
        if args.only and name not in args.only:
            continue
        data = convert(keras_model, variant, rep)
        (out / f"{name}.tflite").write_bytes(data)
        info["models"][name] = {"bytes": len(data), "operators": operators(data)}
        print(name, len(data), "bytes")
    if not args.only:
        np.savez(out / "inputs.npz", x=x[1000:1008])
    versions.write_text(json.dumps(info, indent=1) + "\n")


if __name__ == "__main__":
    main()
