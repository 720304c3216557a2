"""The circle-schema bindings used everywhere, and the name/number tables derived from them.

Circle's schema (0.4 ... 0.10) is a superset of TFLite's with the same table layout, so the
newest bindings read every Circle version and every TFLite file.
"""

from __future__ import annotations

import functools
import re

import numpy as np
from circle_schema.v0_10 import circle as schema

CIRCLE_IDENTIFIER = b"CIR0"
TFLITE_IDENTIFIER = b"TFL3"

#: BuiltinOperator code -> name, including Circle's negative codes.
OPERATOR_NAMES: dict[int, str] = {
    v: k for k, v in vars(schema.BuiltinOperator.BuiltinOperator).items() if not k.startswith("_")
}
OPERATOR_CODES: dict[str, int] = {v: k for k, v in OPERATOR_NAMES.items()}

#: BuiltinOptions union tag -> options class name.
OPTIONS_NAMES: dict[int, str] = {
    v: k for k, v in vars(schema.BuiltinOptions.BuiltinOptions).items() if not k.startswith("_")
}

_CIRCLE_TYPE_NAMES: dict[int, str] = {
    v: k for k, v in vars(schema.TensorType.TensorType).items() if not k.startswith("_")
}
#: TensorType codes whose meaning differs between the schemas: TFLite's (TFL3 files) from 19
#: on; Circle's negative ones are Circle's own (CIR0 files). 0..18 mean the same in both.
_TFLITE_ONLY_TYPES = {19: "INT2", 20: "UINT4", 21: "FLOAT8_E4M3FN", 22: "FLOAT8_E5M2"}
TENSOR_TYPE_NAMES: dict[bytes, dict[int, str]] = {
    CIRCLE_IDENTIFIER: _CIRCLE_TYPE_NAMES,
    TFLITE_IDENTIFIER: {**{k: v for k, v in _CIRCLE_TYPE_NAMES.items() if 0 <= k <= 18},
                        **_TFLITE_ONLY_TYPES},
}
"""TensorType code -> name, per file identifier (each file read with its own schema)."""

_NUMPY_DTYPES = {
    "FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "UINT8": "uint8",
    "INT64": "int64", "BOOL": "bool", "INT16": "int16", "COMPLEX64": "complex64",
    "INT8": "int8", "FLOAT64": "float64", "COMPLEX128": "complex128", "UINT64": "uint64",
    "UINT32": "uint32", "UINT16": "uint16", "BFLOAT16": "bfloat16", "INT4": "int4",
    "UINT4": "uint4", "INT2": "int2", "FLOAT8_E4M3FN": "float8_e4m3fn",
    "FLOAT8_E5M2": "float8_e5m2", "RESOURCE": "resource", "VARIANT": "variant",
}
_TENSOR_TYPES = {ident: {_NUMPY_DTYPES.get(name, name.lower()): code
                         for code, name in names.items()}
                 for ident, names in TENSOR_TYPE_NAMES.items()}

#: QuantizationDetails union tags, per file identifier: TFLite's 2 is BlockwiseQuantization
#: (3 MultiAxisQuantization); Circle 0.10's 2 is MXQuantization and 3 BlockwiseQuantization.
#: The BlockwiseQuantization tables of both schemas have the same layout.
QUANTIZATION_DETAILS: dict[bytes, dict[int, str]] = {
    CIRCLE_IDENTIFIER: {1: "custom", 2: "mx", 3: "blockwise"},
    TFLITE_IDENTIFIER: {1: "custom", 2: "blockwise", 3: "multi_axis"},
}

#: The value ``deprecated_builtin_code`` holds when the code is in ``builtin_code`` alone.
PLACEHOLDER_FOR_GREATER_OP_CODES = 127


def builtin_code(deprecated: int, builtin: int) -> int:
    """An operator code's builtin operator, by the rule of both schemas: ``builtin`` when the
    deprecated byte is 127 (Circle's negative codes, TFLite's codes from 127 on), else the
    larger of the two (a file may leave either at 0: ai-edge-quantizer writes DEQUANTIZE as
    deprecated 0, builtin 6)."""
    if deprecated == PLACEHOLDER_FOR_GREATER_OP_CODES:
        return int(builtin)
    return max(int(deprecated), int(builtin))


def numpy_dtype(tensor_type: int, identifier: bytes = CIRCLE_IDENTIFIER) -> str:
    """The dtype name of a TensorType code in the schema of a file with ``identifier`` (numpy's
    or ml_dtypes' name; the schema's name, lower case, where neither has one)."""
    name = TENSOR_TYPE_NAMES[identifier].get(tensor_type, f"UNKNOWN_{tensor_type}")
    return _NUMPY_DTYPES.get(name, name.lower())


def tensor_type(dtype: str | np.dtype, identifier: bytes = CIRCLE_IDENTIFIER) -> int:
    """The TensorType code of a dtype in the schema of a file with ``identifier``; a
    ValueError when that schema has none (e.g. int2 in a Circle file)."""
    name = str(dtype) if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return _TENSOR_TYPES[identifier][name]
    except KeyError:
        schema_name = "Circle" if identifier == CIRCLE_IDENTIFIER else "TFLite"
        raise ValueError(f"no {schema_name} tensor type for dtype {name}") from None


# Operators whose options table is not simply "<CamelName>Options".
_OPTIONS_OF = {
    "MAX_POOL_2D": "Pool2DOptions", "AVERAGE_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions", "MEAN": "ReducerOptions", "SUM": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions", "REDUCE_ANY": "ReducerOptions",
    "REDUCE_ALL": "ReducerOptions", "L2_NORMALIZATION": "L2NormOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "LSTM": "LSTMOptions", "UNIDIRECTIONAL_SEQUENCE_RNN": "SequenceRNNOptions",
}
_OPTIONS_BY_LOWER = {name.lower(): tag for tag, name in OPTIONS_NAMES.items()}


def options_tag(op_type: str) -> int:
    """The BuiltinOptions union tag used by operator ``op_type`` (0 when it has none)."""
    name = _OPTIONS_OF.get(op_type, op_type.replace("_", "") + "Options")
    return _OPTIONS_BY_LOWER.get(name.lower(), 0)


def options_class(tag: int) -> type:
    """The object-API class (``...OptionsT``) of a BuiltinOptions union tag."""
    name = OPTIONS_NAMES[tag]
    return getattr(getattr(schema, name), name + "T")


@functools.cache  # a few hundred schema field names, converted per operator at every load
def snake_case(name: str) -> str:
    """``fusedActivationFunction`` -> ``fused_activation_function``; ``strideW`` -> ``stride_w``."""
    name = re.sub(r"(?<=[A-Z])([A-Z])(?=[a-z])", r"_\1", name)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def camel_case(name: str) -> str:
    """Inverse of :func:`snake_case`."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)
