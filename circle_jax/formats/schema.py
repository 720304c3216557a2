"""The circle-schema bindings used everywhere, and the name/number tables derived from them.

Circle's schema (0.4 ... 0.10) is a superset of TFLite's with the same table layout, so the
newest bindings read every Circle version and every TFLite file.
"""

from __future__ import annotations

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

TENSOR_TYPE_NAMES: dict[int, str] = {
    v: k for k, v in vars(schema.TensorType.TensorType).items() if not k.startswith("_")
}

_NUMPY_DTYPES = {
    "FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "UINT8": "uint8",
    "INT64": "int64", "BOOL": "bool", "INT16": "int16", "COMPLEX64": "complex64",
    "INT8": "int8", "FLOAT64": "float64", "COMPLEX128": "complex128", "UINT64": "uint64",
    "UINT32": "uint32", "UINT16": "uint16", "BFLOAT16": "bfloat16",
}
_TENSOR_TYPES = {v: schema.TensorType.TensorType.__dict__[k] for k, v in _NUMPY_DTYPES.items()}

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


def numpy_dtype(tensor_type: int) -> str:
    """The numpy dtype name of a TensorType code, or the schema's name if numpy has none."""
    name = TENSOR_TYPE_NAMES.get(tensor_type, f"UNKNOWN_{tensor_type}")
    return _NUMPY_DTYPES.get(name, name.lower())


def tensor_type(dtype: str | np.dtype) -> int:
    """The TensorType code of a numpy dtype."""
    name = np.dtype(dtype).name if str(dtype) != "bfloat16" else "bfloat16"
    try:
        return _TENSOR_TYPES[name]
    except KeyError:
        raise ValueError(f"no Circle tensor type for dtype {name}") from None


def options_tag(op_type: str) -> int:
    """The BuiltinOptions union tag used by operator ``op_type`` (0 when it has none)."""
    name = _OPTIONS_OF.get(op_type, op_type.replace("_", "") + "Options")
    return _OPTIONS_BY_LOWER.get(name.lower(), 0)


def options_class(tag: int) -> type:
    """The object-API class (``...OptionsT``) of a BuiltinOptions union tag."""
    name = OPTIONS_NAMES[tag]
    return getattr(getattr(schema, name), name + "T")


def snake_case(name: str) -> str:
    """``fusedActivationFunction`` -> ``fused_activation_function``; ``strideW`` -> ``stride_w``."""
    name = re.sub(r"(?<=[A-Z])([A-Z])(?=[a-z])", r"_\1", name)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def camel_case(name: str) -> str:
    """Inverse of :func:`snake_case`."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)
