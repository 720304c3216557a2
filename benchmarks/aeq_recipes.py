"""Every ai-edge-quantizer recipe on the tests' float models and the shared float models:
forward against LiteRT, then a short training and export, LiteRT on the export against
circle-jax on it (by hand, not CI; the table is in benchmarks/README.md).

    python benchmarks/aeq_recipes.py [--models PATH ...] [--recipes NAME ...]

Per cell: ``fwd`` the largest absolute difference from LiteRT on the quantizer's file over
the output's largest value (0 = equal), ``exp`` the same on the export after one epoch of
``fit`` on 32 random samples (static recipes by QAT, ``qat=True``); or the one-line
refusal (the quantizer's, LiteRT's or circle-jax's). Blockwise cells are measured on a copy
whose blockwise operators have no fused activation (LiteRT's blockwise kernel drops it,
`tests.aeq_files.blockwise_without_activation`), marked ``*`` where the file has one.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.aeq_files import RECIPES, blockwise_without_activation, quantized  # noqa: E402
from tests.conformance import run_litert  # noqa: E402

MODELS = [ROOT / "tests/data/torch/mlp.tflite", ROOT / "tests/data/torch/cnn.tflite",
          ROOT / "tests/data/keras/branching_cnn.tflite",
          ROOT / "tests/data/keras/layernorm.tflite",
          ROOT / "../shared/models/aeq_conv_fc_mnist.tflite",
          ROOT / "../shared/models/mobilenet_v1_0.25_128_float.tflite"]


def _feeds(data: bytes, seed: int = 1, batch: int | None = None) -> list[np.ndarray]:
    from circle_jax.formats.reader import read_model

    rng = np.random.default_rng(seed)
    main = read_model(data).main
    out = []
    for t in (main.tensors[i] for i in main.inputs):
        shape = t.shape if batch is None else (batch, *t.shape[1:])
        if t.dtype == "float32":
            out.append(rng.standard_normal(shape).astype(np.float32))
        else:
            info = np.iinfo(t.dtype)
            out.append(rng.integers(info.min, info.max + 1, shape).astype(t.dtype))
    return out


def _blockwise_activation(data: bytes) -> bool:
    """Whether an operator reading a blockwise weight has a fused activation."""
    from circle_jax.formats.reader import read_model

    sg = read_model(data).main
    return any(op.options.get("fused_activation_function", 0) and any(
        i >= 0 and (q := sg.tensors[i].quantization) is not None and q.blockwise is not None
        for i in op.inputs) for op in sg.operators)


def _relative(ours: list, ref: list) -> float:
    scale = max(max(float(np.abs(r).max()) for r in ref), 1e-12)
    return max(float(np.abs(np.asarray(a, np.float64) - r).max()) for a, r in zip(ours, ref)) \
        / scale


def _run(model, data: bytes, feeds: list) -> list:
    out = model.apply(model.params, *feeds)
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def cell(path: Path, recipe: str) -> str:
    import circle_jax as cj

    try:
        data = quantized(str(path), recipe)
    except Exception as e:  # noqa: BLE001 - the quantizer's refusal is the cell
        return f"quantizer: {str(e).splitlines()[0][:60]}"
    feeds = _feeds(data)
    plain = blockwise_without_activation if "b32" in recipe else (lambda d: d)
    mark = "*" if "b32" in recipe and _blockwise_activation(data) else ""
    try:
        ref = run_litert(plain(data), feeds)
    except Exception as e:  # noqa: BLE001
        return f"LiteRT: {str(e).splitlines()[0][:60]}"
    try:
        model = cj.load(data, qat=True) if recipe.startswith("static") else cj.load(data)
        fwd = _relative(_run(cj.load(plain(data)), data, feeds), ref)
        x = _feeds(data, 2, batch=32)  # a QAT model reads int8 data as the stored integers
        y = np.asarray(_run(model, data, x)[0])
        target = (y + 0.1 * np.random.default_rng(3).standard_normal(y.shape)).astype(y.dtype)
        if target.dtype != np.float32:
            target = target.astype(np.float32)
        result = cj.fit(model, x[0] if len(x) == 1 else x, target, loss="mse",
                        optimizer="adam", learning_rate=1e-3, epochs=1, batch_size=8)
        out = model.export(result.params, "tflite")
        out = plain(out)
        exp = _relative(_run(cj.load(out), out, feeds), run_litert(out, feeds))
    except Exception as e:  # noqa: BLE001
        return f"circle-jax: {type(e).__name__}: {str(e).splitlines()[0][:60]}"
    return f"fwd {fwd:.1e}, exp {exp:.1e}{mark}"


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[str(m) for m in MODELS])
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES))
    args = ap.parse_args()
    print("| model | " + " | ".join(args.recipes) + " |")
    print("|---" * (len(args.recipes) + 1) + "|")
    for m in args.models:
        cells = [cell(Path(m), r) for r in args.recipes]
        print(f"| {Path(m).stem} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
