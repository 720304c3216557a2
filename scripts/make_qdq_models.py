"""Write the QDQ files of tests/data/qdq/: tfmot's QAT models converted without optimizations.

Run by hand, never by CI (it needs tensorflow-cpu, tf-keras and tensorflow-model-optimization):

    python3 -m venv /work/tfenv && /work/tfenv/bin/pip install tensorflow-cpu==2.21.0 \\
        tf-keras==2.21.0 tensorflow-model-optimization==0.8.1
    TF_USE_LEGACY_KERAS=1 /work/tfenv/bin/python scripts/make_qdq_models.py

The model (seeded, Keras 2 through tf-keras, as tfmot needs): Conv2D(8, 3x3, ReLU) ->
DepthwiseConv2D(3x3) -> ReLU -> Flatten -> Dense(10) on the bundled 8x8 digits,
``tfmot.quantization.keras.quantize_model`` and one epoch of QAT (Adam 1e-3, batch 32).
``TFLiteConverter.from_keras_model`` without ``optimizations`` keeps the fake quantization
as QUANTIZE/DEQUANTIZE pairs around float operators, the weights int8 constants read through
DEQUANTIZE: ``qat_cnn_qdq.tflite``. ``qat_cnn_qdq.npz`` holds 8 digits (``x``) and TF's
output on them (``y``, the QAT Keras model in inference mode) and the file's output under
TF's own interpreter (``y_tflite``).
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_model_optimization as tfmot  # noqa: E402
import tf_keras as keras  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "qdq"


def main() -> None:
    data = np.load(ROOT / "circle_jax" / "examples" / "digits.npz")
    x = data["images"].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    y = data["labels"].astype(np.int64)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.layers.Input((8, 8, 1), batch_size=1),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.DepthwiseConv2D(3, padding="same"),
        keras.layers.ReLU(),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    qat = tfmot.quantization.keras.quantize_model(model)
    qat.compile(keras.optimizers.Adam(1e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    qat.fit(x[:512], y[:512], batch_size=32, epochs=1, verbose=0, shuffle=False)
    converter = tf.lite.TFLiteConverter.from_keras_model(qat)
    data_bytes = converter.convert()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "qat_cnn_qdq.tflite").write_bytes(data_bytes)
    sample = x[1000:1008]
    interp = tf.lite.Interpreter(model_content=data_bytes)
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0], interp.get_output_details()[0]
    y_tflite = []
    for v in sample:
        interp.set_tensor(i["index"], v[None])
        interp.invoke()
        y_tflite.append(interp.get_tensor(o["index"])[0])
    np.savez(OUT / "qat_cnn_qdq.npz", x=sample, y=qat.predict(sample, batch_size=1, verbose=0),
             y_tflite=np.stack(y_tflite))
    ops = sorted({d["op_name"] for d in interp._get_ops_details()})
    print(len(data_bytes), "bytes;", ops)


if __name__ == "__main__":
    main()
