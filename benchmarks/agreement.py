"""Measured agreement of circle-jax's numerics profiles with the frameworks and runtime they
reproduce, on the converted models of tests/data/keras and tests/data/torch.

    python benchmarks/agreement.py [--json FILE]

For every recorded run ({mse, cce} x {sgd, adam} x batch {1, 16}, 3 epochs, lr 0.01,
unshuffled) it trains the model with circle-jax and prints the largest per-epoch loss
difference from the peer, per model, profile and configuration:

- ``keras`` profile vs Keras's ``model.fit`` (tests/data/keras/keras_losses.json, recorded
  by scripts/make_keras_models.py), every case; the models whose Keras source has a
  bias-free Dense load with ``add_missing_bias`` naming the biases Keras has
  (tests/oracle/test_numerics.py's KERAS_BIASES);
- ``torch`` profile vs torch (tests/data/torch/torch_losses.json, scripts/make_torch_models.py);
- the default ``onert`` profile vs the onert wheel run now (tests/onert_peer.py), on the
  models onert 0.1.0 trains.

The tests assert a subset of these runs (tests/oracle/test_numerics.py, test_torch.py);
this script measures all of them. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import circle_jax as cj  # noqa: E402

KERAS, TORCH = ROOT / "tests/data/keras", ROOT / "tests/data/torch"
KEYS = [f"{loss}/{opt}/{batch}" for loss in ("mse", "cce") for opt in ("sgd", "adam")
        for batch in (1, 16)]
LOSS_CODE, OPT_CODE = {"mse": 1, "cce": 2}, {"sgd": 1, "adam": 2}
KERAS_BIASES = {"mlp_no_bias": "none", "residual_bias_free": "op0,op4"}
ONERT_TRAINS = {"keras": ["branching_cnn", "mlp_zero_bias", "mlp_no_bias", "conv1d_stack"],
                "torch": ["mlp", "residual"]}


def _fit(model: cj.Model, x: np.ndarray, y: np.ndarray, key: str) -> list[float]:
    loss, opt, batch = key.split("/")
    return cj.fit(model, x, y, epochs=3, batch_size=int(batch), learning_rate=0.01, loss=loss,
                  optimizer=opt).history.loss


def _circle(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[4:8] = b"CIR0"
    return bytes(data)


def _row(model: str, profile: str, peer: str, gaps: dict[str, float]) -> dict:
    return {"model": model, "profile": profile, "peer": peer, "gaps": gaps,
            "max": max(gaps.values())}


def keras_rows() -> list[dict]:
    ref = json.loads((KERAS / "keras_losses.json").read_text())
    data = np.load(KERAS / "data.npz")
    rows = []
    for case, rec in ref["cases"].items():
        kw = {"add_missing_bias": KERAS_BIASES[case]} if case in KERAS_BIASES else {}
        models = {b: cj.load(KERAS / rec["files_by_batch"][str(b)], numerics="keras", **kw)
                  for b in (1, 16)}
        gaps = {k: float(np.max(np.abs(np.subtract(
            _fit(models[int(k.split("/")[2])], data[f"{case}/x"], data[f"{case}/y"], k),
            rec["runs"][k])))) for k in KEYS}
        label = f"keras (add_missing_bias={kw['add_missing_bias']})" if kw else "keras"
        rows.append(_row(case, label, "Keras", gaps))
    return rows


def torch_rows() -> list[dict]:
    ref = json.loads((TORCH / "torch_losses.json").read_text())
    data = np.load(TORCH / "data.npz")
    rows = []
    for case, rec in ref["cases"].items():
        model = cj.load(_circle(TORCH / f"{case}.tflite"), numerics="torch")
        gaps = {k: float(np.max(np.abs(np.subtract(
            _fit(model, data[f"{case}/x"], data[f"{case}/y"], k), rec["runs"][k]))))
            for k in KEYS}
        rows.append(_row(case, "torch", "torch", gaps))
    return rows


def onert_rows() -> list[dict]:
    from tests.onert_peer import onert_fit

    rows = []
    for source, folder in (("keras", KERAS), ("torch", TORCH)):
        data = np.load(folder / "data.npz")
        for case in ONERT_TRAINS[source]:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "m.circle"
                path.write_bytes(_circle(folder / f"{case}.tflite"))
                model = cj.load(path)
                x, y = data[f"{case}/x"], data[f"{case}/y"]
                gaps = {}
                for k in KEYS:
                    loss, opt, batch = k.split("/")
                    want = onert_fit(path, x, y, epochs=3, batch_size=int(batch),
                                     learning_rate=0.01, loss=LOSS_CODE[loss],
                                     optimizer=OPT_CODE[opt]).loss
                    gaps[k] = float(np.max(np.abs(np.subtract(_fit(model, x, y, k), want))))
            rows.append(_row(f"{case} ({source})", "onert (default)", "onert 0.1.0", gaps))
    return rows


def table(rows: list[dict]) -> str:
    head = "| model | profile | peer | " + " | ".join(KEYS) + " | max |"
    lines = [head, "|" + "---|" * (len(KEYS) + 4)]
    for r in rows:
        cells = " | ".join(f"{r['gaps'][k]:.1e}" for k in KEYS)
        lines.append(f"| {r['model']} | {r['profile']} | {r['peer']} | {cells} | "
                     f"{r['max']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rows = keras_rows() + torch_rows() + onert_rows()
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
