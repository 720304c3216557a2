"""Each file is read with its own schema's meanings (formats.md, "Circle model files"): the
opcode rule, TFLite's and Circle's TensorType codes that differ, and their
QuantizationDetails tags; packed int4/int2 in LiteRT's order. One test per divergence, on
files written both ways (ai-edge-quantizer's .tflite output, and circle-jax's writer's
.circle of it)."""

from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert import interpreter as litert

import circle_jax as cj
from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.schema import (
    CIRCLE_IDENTIFIER,
    TFLITE_IDENTIFIER,
    numpy_dtype,
    schema,
    tensor_type,
)
from circle_jax.formats.writer import pack, write_model
from circle_jax.passes.dequantize import dequantized_values
from tests.aeq_files import quantized
from tests.conformance import refused_at_load
from tests.paths import TESTS

MLP = f"{TESTS}/data/torch/mlp.tflite"


def _both_ways(data: bytes) -> dict[str, bytes]:
    return {"tflite": data, "circle": write_model(read_model(data), "circle")}


@pytest.mark.parametrize("fmt", ["tflite", "circle"])
def test_dequantize_written_as_deprecated_zero_builtin_six_is_dequantize(fmt: str) -> None:
    source = quantized(MLP, "weight_only_wi8_afp32")
    codes = unpack(source).operatorCodes
    assert any(c.deprecatedBuiltinCode == 0 and c.builtinCode == 6 for c in codes)
    m = unpack(source)  # the circle twin written with the quantizer's coding, by hand
    data = source if fmt == "tflite" else pack(m, "circle")
    types = [op.type for op in read_model(data).main.operators]
    assert types.count("DEQUANTIZE") == 2 and "ADD" not in types


def test_the_opcode_rule() -> None:
    from circle_jax.formats.schema import builtin_code

    assert builtin_code(0, 6) == 6 and builtin_code(6, 0) == 6  # either field may be 0
    assert builtin_code(127, 150) == 150 and builtin_code(127, -7) == -7  # extended codes
    assert builtin_code(3, 3) == 3


def test_tensor_type_codes_by_schema() -> None:
    assert numpy_dtype(19, TFLITE_IDENTIFIER) == "int2"
    assert numpy_dtype(20, TFLITE_IDENTIFIER) == "uint4"
    assert numpy_dtype(21, TFLITE_IDENTIFIER) == "float8_e4m3fn"
    assert numpy_dtype(-1, CIRCLE_IDENTIFIER) == "uint4"
    assert numpy_dtype(19, CIRCLE_IDENTIFIER).startswith("unknown")
    assert numpy_dtype(-1, TFLITE_IDENTIFIER).startswith("unknown")
    for dtype in ("int4", "bfloat16", "int8", "float32"):  # the codes both share
        assert tensor_type(dtype, CIRCLE_IDENTIFIER) == tensor_type(dtype, TFLITE_IDENTIFIER)
    assert (tensor_type("uint4", CIRCLE_IDENTIFIER), tensor_type("uint4", TFLITE_IDENTIFIER)) \
        == (-1, 20)
    with pytest.raises(ValueError, match="no Circle tensor type for dtype int2"):
        tensor_type("int2", CIRCLE_IDENTIFIER)


def test_int2_weights_of_a_tflite_file_are_int2() -> None:
    model = read_model(quantized(MLP, "dynamic_wi2c_afp32"))
    int2 = [t for t in model.main.tensors if t.dtype == "int2"]
    assert int2 and all(t.data.min() >= -2 and t.data.max() <= 1 for t in int2)
    with pytest.raises(ValueError, match="int2"):  # Circle has no int2
        write_model(model, "circle")


@pytest.mark.parametrize("fmt", ["tflite", "circle"])
def test_blockwise_details_are_blockwise_in_both_schemas(fmt: str) -> None:
    data = _both_ways(quantized(MLP, "dynamic_wi4b32_afp32"))[fmt]
    raw = unpack(data)
    tags = {t.quantization.detailsType for t in raw.subgraphs[0].tensors
            if t.quantization is not None and t.quantization.detailsType}
    assert tags == {2 if fmt == "tflite" else 3}  # TFLite's tag 2, Circle's 3
    main = read_model(data).main
    blocks = [t for t in main.tensors if t.quantization and t.quantization.blockwise]
    assert len(blocks) == 2
    for t in blocks:
        b = t.quantization.blockwise
        assert b.block_size == 32 and b.zero_points == -1
        assert main.tensors[b.scales].dtype == "float16"
        assert main.tensors[b.scales].shape == (t.shape[0], t.shape[1] // 32)


def test_blockwise_round_trips_through_the_other_format() -> None:
    tflite = quantized(MLP, "dynamic_wi4b32_afp32")
    back = write_model(read_model(write_model(read_model(tflite), "circle")), "tflite")
    a, b = read_model(tflite).main, read_model(back).main
    for s, t in zip(a.tensors, b.tensors):
        assert (s.dtype, s.quantization) == (t.dtype, t.quantization)
        if s.data is not None:
            np.testing.assert_array_equal(s.data, t.data)


def test_circle_mx_details_are_refused_in_one_line() -> None:
    m = unpack(_both_ways(quantized(MLP, "dynamic_wi4b32_afp32"))["circle"])
    for t in m.subgraphs[0].tensors:
        if t.quantization is not None and t.quantization.detailsType == 3:
            t.quantization.detailsType = 2  # Circle's MXQuantization
            t.quantization.details = schema.MXQuantization.MXQuantizationT()
    msg = refused_at_load(pack(m, "circle"), cj.UnsupportedOperatorError)
    assert "mx quantization details are not supported" in msg


def test_packed_int4_order_is_litert_s() -> None:
    data = quantized(MLP, "weight_only_wi4_afp32")
    interp = litert.Interpreter(
        model_content=data, experimental_preserve_all_tensors=True,
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    interp.set_tensor(d["index"], np.zeros(d["shape"], np.float32))
    interp.invoke()
    main = read_model(data).main
    dequantized = [op for op in main.operators if op.type == "DEQUANTIZE"]
    assert dequantized and all(main.tensors[op.inputs[0]].dtype == "int4"
                               for op in dequantized)
    for op in dequantized:
        w = main.tensors[op.inputs[0]]
        assert w.data.min() < 0 < w.data.max()
        np.testing.assert_array_equal(dequantized_values(w, main),
                                      interp.get_tensor(op.outputs[0]))


def test_packed_values_round_trip() -> None:
    from circle_jax.formats.packed import pack_values, unpack_values

    rng = np.random.default_rng(0)
    for dtype, lo, hi in (("int4", -8, 8), ("uint4", 0, 16), ("int2", -2, 2)):
        for n in (1, 2, 3, 5, 8):
            v = rng.integers(lo, hi, n)
            packed = pack_values(v, dtype)
            assert len(packed) == -(-n * (2 if dtype == "int2" else 4) // 8)
            np.testing.assert_array_equal(unpack_values(packed.tobytes(), dtype, (n,))
                                          .astype(np.int64), v)
