"""fake_quantize_pairs: a QDQ file's QUANTIZE/DEQUANTIZE pairs (tfmot's QAT model converted
without optimizations, tests/data/qdq/) are fake quantizations with straight-through
gradients: the forward is unchanged (= LiteRT), every weight trains, and the export is the
file's own layout again, which LiteRT runs."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

import circle_jax as cj
from circle_jax.formats.reader import read_model
from tests.conformance import run_litert

QDQ = Path(__file__).parents[1] / "data" / "qdq" / "qat_cnn_qdq.tflite"


def _digits(n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    d = np.load(Path(cj.__file__).parent / "examples" / "digits.npz")
    x = d["images"][start:start + n].astype(np.float32).reshape(-1, 8, 8, 1) / 16.0
    return x, d["labels"][start:start + n].astype(np.int32)


def test_pairs_become_fake_quantizations_stored_as_before() -> None:
    model = cj.load(QDQ)
    record = next(p for p in model.passes if p.name == "fake_quantize_pairs")
    assert record.changes and set(record.changes.values()) == {"uint8"}
    middle = [t for t in model.ir.main.tensors
              if t.quantization is not None and t.quantization.storage]
    assert len(middle) == 6 and all(t.dtype == "float32" for t in middle)


def test_every_weight_trains_and_gradients_pass_the_pairs() -> None:
    model = cj.load(QDQ)
    assert all(r.trainable for r in model.param_roles.values())
    x, _ = _digits(4)
    grads = jax.grad(lambda p: model.apply(p, x[:1])[0].sum())(model.params)
    assert all(float(np.abs(np.asarray(g)).max()) > 0 for g in grads.values())


def test_qat_of_the_qdq_file_learns_and_exports_in_its_own_layout(tmp_path) -> None:
    model = cj.load(QDQ)
    x, y = _digits(256)
    result = cj.fit(model, x, np.eye(10, dtype=np.float32)[y], loss="mse", optimizer="adam",
                    learning_rate=1e-3, epochs=3, batch_size=1)
    losses = [float(v) for v in result.history.loss]
    assert losses[-1] < losses[0]
    out = model.export(result.params, "tflite")
    before, after = read_model(QDQ).main, read_model(out).main
    assert [t.dtype for t in after.tensors] == [t.dtype for t in before.tensors]
    assert [op.type for op in after.operators] == [op.type for op in before.operators]
    back = cj.load(out)
    xs, _ = _digits(8, 1000)
    for v in xs:
        want = run_litert(out, [v[None]])[0]
        got = np.asarray(back(v[None])[0])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))
