"""Files ai-edge-quantizer (a test dependency: it needs LiteRT, not TensorFlow) writes from
the tests' float models at test time, one per recipe, cached for the run."""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from dataclasses import replace

import numpy as np

#: The recipes of ai-edge-quantizer 0.10 that the tests' models take: weight-only, dynamic
#: (hybrid) per channel and blockwise, full integer with int8 and int16 activations.
RECIPES = ("weight_only_wi8_afp32", "weight_only_wi4_afp32", "dynamic_wi8_afp32",
           "dynamic_wi4_afp32", "dynamic_wi4b32_afp32", "dynamic_wi2c_afp32",
           "static_wi8_ai8", "static_wi8_ai16")


def calibration(path: str, samples: int = 8, seed: int = 0) -> dict[str, list[dict]]:
    """Random standard-normal calibration data for every input of the file's first
    signature, as the quantizer's ``calibrate`` takes it."""
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=path)
    key = next(iter(interp.get_signature_list()))
    inputs = interp.get_signature_runner(key).get_input_details()
    rng = np.random.default_rng(seed)
    return {key: [{n: rng.standard_normal(d["shape"]).astype(d["dtype"])
                   for n, d in inputs.items()} for _ in range(samples)]}


@functools.cache
def quantized(path: str, recipe_name: str) -> bytes:
    """The bytes ai-edge-quantizer writes for float model ``path`` under ``recipe_name``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from ai_edge_quantizer import quantizer, recipe

        q = quantizer.Quantizer(path)
        q.load_quantization_recipe(getattr(recipe, recipe_name)())
        result = q.quantize(q.calibrate(calibration(path))) if recipe_name.startswith(
            "static") else q.quantize()
    return bytes(result.quantized_model)


def quantized_path(path: str, recipe_name: str) -> str:
    """:func:`quantized`'s bytes in a file of the run's temporary directory."""
    name = f"{os.path.basename(path).rsplit('.', 1)[0]}__{recipe_name}.tflite"
    out = os.path.join(tempfile.gettempdir(), f"circle-jax-aeq-{os.getpid()}", name)
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "wb") as f:
            f.write(quantized(path, recipe_name))
    return out


def blockwise_without_activation(data: bytes) -> bytes:
    """A copy of ``data`` whose operators reading blockwise weights have no fused
    activation (written by circle-jax's writer, which keeps the blockwise details)."""
    from circle_jax.formats.reader import read_model
    from circle_jax.formats.writer import write_model
    from circle_jax.graph import ir

    model = read_model(data)
    sg = model.main
    ops = tuple(
        replace(op, options=ir.Options({**op.options, "fused_activation_function": 0}))
        if any(i >= 0 and (q := sg.tensors[i].quantization) is not None
               and q.blockwise is not None for i in op.inputs) else op
        for op in sg.operators)
    return write_model(replace(model, subgraphs=(replace(sg, operators=ops),
                                                 *model.subgraphs[1:])))
