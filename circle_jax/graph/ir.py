"""The intermediate representation: immutable dataclasses describing a Circle/TFLite model.

The IR is what the reader produces, what graph passes rewrite (`circle_jax.passes`) and what
lowering consumes. It holds everything needed to run the model. ``Model.source`` keeps the
bytes the model was read from, and every subgraph, tensor and operator read from them
records its position there (``origin``; None for what a pass added), so the writer
(`circle_jax.formats.writer.write_model`) writes the IR back with every field of the source
the IR does not model (custom fields, sparsity, buffers no tensor reads) preserved.

A tensor's ``buffer`` is its buffer index in the source; a constant a pass adds has
``buffer == NEW_BUFFER`` and is written with a buffer of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_TENSOR_ELEMENTS = 1 << 28
"""The most elements one tensor may hold (1 GiB of float32): a file declaring a larger tensor
is refused at load (zero dimensions counted as 1), and a loop growing a value past it is
stopped, so no file makes circle-jax allocate without bound (``load(max_elements=)``)."""

# Fused activation codes (ActivationFunctionType) and padding codes (Padding).
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6, ACT_TANH, ACT_SIGN_BIT = range(6)
PAD_SAME, PAD_VALID = 0, 1

NEW_BUFFER = -1
"""``Tensor.buffer`` of a constant that has no buffer in the source (a pass made it)."""


#: IR dtypes numpy lacks, which ml_dtypes (JAX's own dependency) provides.
ML_DTYPES = frozenset({"bfloat16", "int4", "uint4", "int2", "float8_e4m3fn", "float8_e5m2"})

#: Bits per value of the sub-byte integer types, which files store packed (the first value in
#: the low bits of the first byte).
PACKED_BITS = {"int4": 4, "uint4": 4, "int2": 2}


def as_numpy_dtype(name: str) -> np.dtype:
    """numpy dtype for an IR dtype name (:data:`ML_DTYPES` through ml_dtypes: numpy itself
    would read "int4" as int32)."""
    if name in ML_DTYPES:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


class Options(Mapping[str, Any]):
    """Read-only operator options with snake_case keys, readable as attributes.

    ``op.options.fused_activation_function`` and ``op.options["stride_w"]`` both work;
    a missing option reads as ``None`` through attribute access.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getattr__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            return None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("Options are read-only")

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._items.items())
        return f"Options({inner})"


@dataclass(frozen=True)
class Blockwise:
    """Blockwise quantization (BlockwiseQuantization details): the tensor's last dimension is
    cut into blocks of ``block_size`` values, each with its own scale; ``scales`` is the index
    of the tensor holding them (float16, the tensor's shape with the last dimension divided by
    ``block_size``), ``zero_points`` the index of theirs (-1: none, all 0)."""

    scales: int
    zero_points: int
    block_size: int


@dataclass(frozen=True)
class Quantization:
    """Affine quantization parameters of a tensor (per-tensor or per-axis), or blockwise
    ones (``blockwise``; ``scale`` and ``zero_point`` then empty). ``other_details`` names
    details the IR does not model ("custom", "mx", "multi_axis"; "" for none).
    ``storage``: on a float tensor, the integer type the file stores it in, its values the
    real values of those integers (a QUANTIZE/DEQUANTIZE pair's middle tensor as
    `circle_jax.passes.fake_quantize_pairs` makes it); "" otherwise."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    quantized_dimension: int = 0
    blockwise: Blockwise | None = None
    other_details: str = ""
    storage: str = ""


@dataclass(frozen=True, eq=False)
class Tensor:
    """One tensor of a subgraph; ``data`` is set (read-only numpy) for constants."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    buffer: int
    data: np.ndarray | None = field(default=None, repr=False)
    quantization: Quantization | None = None
    shape_signature: tuple[int, ...] | None = None
    is_variable: bool = False
    origin: int | None = None
    """Index of the source tensor this one was read from (None: a pass added it)."""

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def is_float(self) -> bool:
        return self.dtype in ("float16", "float32", "float64", "bfloat16")


@dataclass(frozen=True)
class Operator:
    """One operator: ``type`` is the builtin name (``CONV_2D``) or ``CUSTOM``."""

    index: int
    type: str
    code: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: Options = field(default_factory=Options)
    custom_code: str | None = None
    custom_options: bytes | None = field(default=None, repr=False)
    version: int = 1
    origin: int | None = None
    """Index of the source operator this one was read from (None: a pass added it)."""

    @property
    def key(self) -> str:
        """The registry key: the builtin name, or ``CUSTOM:<custom_code>``."""
        return f"CUSTOM:{self.custom_code}" if self.type == "CUSTOM" else self.type


@dataclass(frozen=True)
class Subgraph:
    index: int
    name: str
    tensors: tuple[Tensor, ...]
    operators: tuple[Operator, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    origin: int | None = None
    """Index of the source subgraph this one was read from (None: a pass added it)."""


@dataclass(frozen=True)
class SignatureDef:
    key: str
    subgraph_index: int
    inputs: Mapping[str, int]
    outputs: Mapping[str, int]


@dataclass(frozen=True)
class PassRecord:
    """What one graph pass changed: ``changes`` maps each changed or added element (a tensor
    name, an operator) to what it is now; ``legend`` says what the keys and values are
    (``"copy: shared tensor"``). ``circle-jax info`` prints it; tests check it."""

    name: str
    changes: Mapping[str, str] = field(default_factory=dict)
    legend: str = ""

    def describe(self) -> list[str]:
        """One line naming the pass, then one line per change."""
        legend = f" ({self.legend})" if self.legend and self.changes else ""
        count = f"{len(self.changes)} change(s)" if self.changes else "no change"
        return [f"pass {self.name}{legend}: {count}",
                *(f"  {what}: {how}" for what, how in self.changes.items())]


@dataclass(frozen=True, eq=False)
class Model:
    """A whole model file. ``source`` keeps the bytes it was read from (for the writer);
    ``passes`` records the graph passes that rewrote it since, in order."""

    subgraphs: tuple[Subgraph, ...]
    file_identifier: str
    version: int
    description: str
    metadata: Mapping[str, bytes] = field(repr=False)
    signature_defs: tuple[SignatureDef, ...] = ()
    source: bytes = field(default=b"", repr=False)
    passes: tuple[PassRecord, ...] = ()

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    @property
    def format(self) -> str:
        """``"circle"`` for CIR0 files, ``"tflite"`` otherwise."""
        return "circle" if self.file_identifier == "CIR0" else "tflite"
