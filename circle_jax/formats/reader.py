"""Read .circle / .tflite bytes into the immutable IR, refusing malformed files clearly."""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import numpy as np

from ..errors import CircleFormatError
from ..graph import ir
from ..graph.ir import MAX_TENSOR_ELEMENTS, PACKED_BITS, as_numpy_dtype
from .nnpackage import nnpackage_model_path
from .packed import packed_size, unpack_values
from .schema import (
    CIRCLE_IDENTIFIER,
    OPERATOR_NAMES,
    QUANTIZATION_DETAILS,
    TFLITE_IDENTIFIER,
    builtin_code,
    numpy_dtype,
    schema,
    snake_case,
)
from .strings import decode_strings

_MIN_SIZE = 8  # root offset + file identifier


def read_bytes(
    source: str | os.PathLike | bytes | bytearray | memoryview,
    what: str = "model",
    error: type[Exception] = CircleFormatError,
) -> tuple[bytes, str]:
    """The bytes of a file given as a path or bytes, and a name for messages.

    A model path may be an nnpackage directory (its MANIFEST names the model file).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), f"<{what} bytes>"
    path = os.fspath(source)
    if what == "model" and os.path.isdir(path):
        path = nnpackage_model_path(path)
    return read_regular_file(path, what, error), path


def operator_codes(buf: bytes) -> set[str]:
    """The builtin operator names of a model's operator code table, read without unpacking
    the model (cheap on large files); empty when ``buf`` is no model (the reader says why)."""
    try:
        root = schema.Model.Model.GetRootAs(buf, 0)
        return {OPERATOR_NAMES.get(builtin_code(c.DeprecatedBuiltinCode(), c.BuiltinCode()), "")
                for c in (root.OperatorCodes(i) for i in range(root.OperatorCodesLength()))}
    except Exception:  # noqa: BLE001 - any malformed buffer: the reader refuses it properly
        return set()


MAX_FILE_BYTES = 8 << 30
"""The largest file read whole (8 GiB): a bound on what one file may make circle-jax allocate."""


MAX_RANK = 16
"""The highest tensor rank read (TFLite's kernels stop at 6; 16 leaves room for others)."""

def _check_shape(shape: tuple[int, ...], name: str, sg: int, where: str,
                 max_elements: int) -> None:
    def shown() -> str:
        text = str(list(shape[:8]))
        return text if len(shape) <= 8 else text[:-1] + ", ...]"

    if len(shape) > MAX_RANK:
        raise CircleFormatError(f"{where}: subgraph {sg} tensor {name[:60]!r} has rank "
                                f"{len(shape)} {shown()}; expected at most {MAX_RANK}")
    if any(d < -1 for d in shape):
        raise CircleFormatError(f"{where}: subgraph {sg} tensor {name[:60]!r} has a negative "
                                f"dimension {shown()}; expected sizes >= 0 (or -1: unknown)")
    count = 1
    for d in shape:
        count *= max(d, 1)
    if count > max_elements:
        raise CircleFormatError(
            f"{where}: subgraph {sg} tensor {name[:60]!r} declares shape {shown()}, over the "
            f"budget of {max_elements} elements per tensor (read_model(max_elements=...))")


def check_regular_file(path: str, what: str, error: type[Exception] = CircleFormatError,
                       limit: int = MAX_FILE_BYTES) -> int:
    """The size of ``path`` if it is a regular file of at most ``limit`` bytes; anything else
    (missing, a directory, a device such as /dev/zero, a pipe, a larger file) is refused with
    one line."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"cannot read {what} file {path!r}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"cannot read {what} file {path!r}: not a regular file "
                    "(expected a file, not a directory, device or pipe)")
    if st.st_size > limit:
        raise error(f"cannot read {what} file {path!r}: {st.st_size} bytes is over the "
                    f"{limit}-byte limit for one file")
    return st.st_size


def read_regular_file(path: str, what: str, error: type[Exception] = CircleFormatError,
                      limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (see :func:`check_regular_file`).

    The buffer is the size the file has, never ``limit``: a 1 KB model is read in 1 KB, also
    under an address-space limit (``ulimit -v``). A file that grows while it is read is
    refused rather than cut."""
    size = check_regular_file(path, what, error, limit)
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except OSError as e:
        raise error(f"cannot read {what} file {path!r}: {e.strerror}") from None
    if len(data) > size:
        raise error(f"cannot read {what} file {path!r}: it grew while being read (expected "
                    f"the {size} bytes it held when opened); read it when it is complete")
    return data


def unpack(buf: bytes, where: str = "<bytes>") -> Any:
    """Check the identifier and unpack the flatbuffer into circle-schema's ``ModelT``."""
    if len(buf) < _MIN_SIZE:
        raise CircleFormatError(
            f"{where}: {len(buf)} bytes is too short for a Circle/TFLite model "
            f"(expected a FlatBuffer with identifier CIR0 or TFL3)"
        )
    ident = bytes(buf[4:8])
    if ident not in (CIRCLE_IDENTIFIER, TFLITE_IDENTIFIER):
        raise CircleFormatError(
            f"{where}: file identifier {ident!r} is neither b'CIR0' (Circle) nor b'TFL3' (TFLite)"
        )
    root = int.from_bytes(buf[:4], "little")
    if root + 4 > len(buf):
        raise CircleFormatError(
            f"{where}: root table offset {root} lies past the end of the {len(buf)}-byte file "
            "(truncated file?)"
        )
    try:
        return schema.Model.ModelT.InitFromPackedBuf(buf, 0)
    except Exception as e:  # flatbuffers raises struct/index errors on bad offsets
        raise CircleFormatError(
            f"{where}: not a readable {ident.decode()} FlatBuffer: {_broken_part(buf)} "
            f"({_unpack_failure(e, len(buf))}); the file is truncated or corrupted"
        ) from None


def _unpack_failure(e: Exception, size: int) -> str:
    """FlatBuffers' failure in words: an offset past the end (struct's "requires a buffer
    of at least N bytes") as the byte it reaches, else the error's own first words."""
    past = re.search(r"at least (\d+) bytes", str(e))
    if past:
        return f"an offset reaches byte {past[1]} of the {size}-byte file"
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text if len(text) <= 120 else text[:117] + '...'}"


def _broken_part(buf: bytes) -> str:
    """Which table of the model cannot be read (the first, walking the file in schema
    order), e.g. ``subgraph 0 tensor 12``; the root when the walk cannot start."""
    def readable(build: Any, obj_at: Any) -> bool:
        try:
            build(obj_at())
            return True
        except Exception:  # noqa: BLE001 - any failure marks the part as broken
            return False

    try:
        m = schema.Model.Model.GetRootAs(buf, 0)
        parts = [("operator code", m.OperatorCodesLength(), m.OperatorCodes,
                  schema.OperatorCode.OperatorCodeT.InitFromObj),
                 ("subgraph", m.SubgraphsLength(), m.Subgraphs, None),
                 ("buffer", m.BuffersLength(), m.Buffers, schema.Buffer.BufferT.InitFromObj),
                 ("metadata entry", m.MetadataLength(), m.Metadata,
                  schema.Metadata.MetadataT.InitFromObj),
                 ("signature def", m.SignatureDefsLength(), m.SignatureDefs,
                  schema.SignatureDef.SignatureDefT.InitFromObj)]
        for name, count, get, build in parts:
            for i in range(count):
                if build is not None:
                    if not readable(build, lambda get=get, i=i: get(i)):
                        return f"{name} {i} is unreadable"
                    continue
                sg = get(i)
                for what, n, item, make in (
                        ("tensor", sg.TensorsLength(), sg.Tensors,
                         schema.Tensor.TensorT.InitFromObj),
                        ("operator", sg.OperatorsLength(), sg.Operators,
                         schema.Operator.OperatorT.InitFromObj)):
                    for j in range(n):
                        if not readable(make, lambda item=item, j=j: item(j)):
                            return f"subgraph {i} {what} {j} is unreadable"
                if not readable(schema.SubGraph.SubGraphT.InitFromObj, lambda sg=sg: sg):
                    return f"subgraph {i} (its inputs, outputs or name) is unreadable"
    except Exception:  # noqa: BLE001 - the vectors' own headers are broken
        return "the model table or one of its vectors is unreadable"
    return "a field of the model table is unreadable"


def read_model(source: str | os.PathLike | bytes, *,
               max_elements: int = MAX_TENSOR_ELEMENTS) -> ir.Model:
    """Read a .circle or .tflite model (path or bytes) into the IR; a tensor declaring more
    than ``max_elements`` elements is refused (:data:`MAX_TENSOR_ELEMENTS`)."""
    return parse_model(*read_bytes(source), max_elements=max_elements)


def parse_model(buf: bytes, where: str = "<model bytes>", *,
                max_elements: int = MAX_TENSOR_ELEMENTS) -> ir.Model:
    """The IR of a model file's bytes (``where`` names it in messages)."""
    return model_from_object(unpack(buf, where), buf, where, max_elements=max_elements)


def model_from_object(m: Any, buf: bytes, where: str = "<bytes>", *,
                      max_elements: int = MAX_TENSOR_ELEMENTS) -> ir.Model:
    """Convert circle-schema's ``ModelT`` into the validated IR."""
    buffers = [_buffer_bytes(b, buf, i, where) for i, b in enumerate(m.buffers or [])]
    opcodes = [_opcode(c) for c in (m.operatorCodes or [])]
    file = _File(buf, where, max_elements)
    subgraphs = tuple(_subgraph(k, sg, buffers, opcodes, file)
                      for k, sg in enumerate(m.subgraphs or []))
    if not subgraphs:
        raise CircleFormatError(f"{where}: the model has no subgraph (expected at least one)")
    metadata = {}
    for md in m.metadata or []:
        name = _text(md.name)
        metadata[name] = _index(md.buffer, len(buffers), f"metadata {name!r} buffer", where)
    metadata = {name: buffers[i] or b"" for name, i in metadata.items()}
    signatures = tuple(_signature(s, subgraphs, where) for s in (m.signatureDefs or []))
    return ir.Model(
        subgraphs=subgraphs,
        file_identifier=bytes(buf[4:8]).decode(),
        version=int(m.version),
        description=_text(m.description),
        metadata=metadata,
        signature_defs=signatures,
        source=bytes(buf),
    )


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _index(i: int, n: int, what: str, where: str) -> int:
    if not 0 <= i < n:
        raise CircleFormatError(f"{where}: {what} index {i} is out of range (expected 0..{n - 1})")
    return int(i)


def _buffer_bytes(b: Any, buf: bytes, i: int, where: str) -> bytes | None:
    if b.offset > 1:  # data stored past the flatbuffer (large models)
        end = b.offset + b.size
        if end > len(buf):
            raise CircleFormatError(
                f"{where}: buffer {i} claims bytes {b.offset}..{end} but the file has "
                f"{len(buf)} bytes (truncated file?)"
            )
        return bytes(buf[b.offset : end])
    if b.data is None or len(b.data) == 0:
        return None
    return np.asarray(b.data, dtype=np.uint8).tobytes()


def _opcode(c: Any) -> tuple[int, str | None, int]:
    code = builtin_code(c.deprecatedBuiltinCode, c.builtinCode)
    return code, (_text(c.customCode) if c.customCode is not None else None), int(c.version)


class _File:
    """What every tensor of one file is read with: its bytes (for the tables circle-schema's
    object API cannot unpack by the file's own schema), identifier, name and element budget."""

    def __init__(self, buf: bytes, where: str, max_elements: int) -> None:
        self.buf, self.where, self.max_elements = buf, where, max_elements
        self.identifier = bytes(buf[4:8])
        self._root: Any = None

    def blockwise(self, sg: int, k: int) -> ir.Blockwise:
        """Tensor ``k`` of subgraph ``sg``'s BlockwiseQuantization details, read from the
        file's bytes: the object API unpacks a union by Circle's tags, under which a
        .tflite's blockwise tag (2) is MXQuantization."""
        if self._root is None:
            self._root = schema.Model.Model.GetRootAs(self.buf, 0)
        table = self._root.Subgraphs(sg).Tensors(k).Quantization().Details()
        details = schema.BlockwiseQuantization.BlockwiseQuantization()
        details.Init(table.Bytes, table.Pos)
        return ir.Blockwise(details.Scales(), details.ZeroPoints(), details.BlockSize())


def _tensor(k: int, t: Any, buffers: list, sg: int, file: _File) -> ir.Tensor:
    where = file.where
    dtype = numpy_dtype(t.type, file.identifier)
    shape = tuple(int(d) for d in (t.shape if t.shape is not None else ()))
    name = _text(t.name) or f"tensor_{sg}_{k}"
    _check_shape(shape, name, sg, where, file.max_elements)
    bidx = _index(t.buffer, max(len(buffers), 1), f"tensor {name!r} buffer", where)
    raw = buffers[bidx] if bidx < len(buffers) else None
    data = None
    if raw is not None and dtype == "string":
        data = decode_strings(raw, shape, f"{where}: tensor {name!r}")
    elif raw is not None and dtype not in ("string", "resource", "variant") \
            and not dtype.startswith(("unknown", "ggml", "mx")):
        count = int(np.prod(shape, dtype=np.int64))
        size = packed_size(dtype, count) if dtype in PACKED_BITS \
            else count * as_numpy_dtype(dtype).itemsize
        if len(raw) != size:
            raise CircleFormatError(
                f"{where}: constant tensor {name!r} of shape {list(shape)} {dtype} needs "
                f"{size} bytes but its buffer {bidx} has {len(raw)}")
        data = unpack_values(raw, dtype, shape) if dtype in PACKED_BITS \
            else np.frombuffer(raw, dtype=as_numpy_dtype(dtype)).reshape(shape)
    if data is None and 0 in shape and not dtype.startswith(
            ("unknown", "ggml", "mx", "string", "resource", "variant")):
        data = np.zeros(shape, as_numpy_dtype(dtype))  # an empty constant (e.g. shape [])
    sig = tuple(int(d) for d in t.shapeSignature) if t.shapeSignature is not None else None
    return ir.Tensor(k, name, shape, dtype, bidx, data, _quantization(t.quantization, sg, k, file),
                     sig, bool(t.isVariable), origin=k)


def _quantization(q: Any, sg: int, k: int, file: _File) -> ir.Quantization | None:
    """A tensor's quantization: affine scales and zero points, and its details by the file's
    own schema (:data:`QUANTIZATION_DETAILS`); None when it has neither."""
    if q is None:
        return None
    scale = tuple(float(s) for s in (q.scale if q.scale is not None else ()))
    zero = tuple(int(z) for z in q.zeroPoint) if q.zeroPoint is not None and len(scale) \
        else (0,) * len(scale)
    details = QUANTIZATION_DETAILS[file.identifier].get(int(q.detailsType or 0), "")
    if not scale and not details:
        return None
    blockwise = file.blockwise(sg, k) if details == "blockwise" else None
    return ir.Quantization(scale, zero, int(q.quantizedDimension), blockwise,
                           "" if blockwise is not None else details)


def options_of(o: Any) -> ir.Options:
    """The IR options of a circle-schema options object (None gives empty options)."""
    if o is None:
        return ir.Options()
    items = {}
    for key, value in vars(o).items():
        if isinstance(value, np.ndarray):
            value = tuple(value.tolist())
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        items[snake_case(key)] = value
    return ir.Options(items)


def _subgraph(k: int, sg: Any, buffers: list, opcodes: list, file: _File) -> ir.Subgraph:
    where = file.where
    tensors = tuple(_tensor(i, t, buffers, k, file) for i, t in enumerate(sg.tensors or []))
    n = len(tensors)

    def indices(values: Any, what: str, optional: bool = False) -> tuple[int, ...]:
        out = tuple(int(v) for v in (values if values is not None else ()))
        for v in out:
            if not (optional and v == -1):
                _index(v, n, f"subgraph {k} {what} tensor", where)
        return out

    operators = []
    for i, op in enumerate(sg.operators or []):
        oc = _index(op.opcodeIndex, len(opcodes), f"subgraph {k} operator {i} opcode", where)
        code, custom, version = opcodes[oc]
        name = OPERATOR_NAMES.get(code, f"UNKNOWN_{code}")
        options = op.builtinOptions if op.builtinOptions is not None else op.builtinOptions2
        custom_options = None
        if op.customOptions is not None:
            custom_options = np.asarray(op.customOptions, np.uint8).tobytes()
        operators.append(
            ir.Operator(
                index=i,
                type=name,
                code=code,
                inputs=indices(op.inputs, f"operator {i} ({name}) input", optional=True),
                outputs=indices(op.outputs, f"operator {i} ({name}) output"),
                options=options_of(options),
                custom_code=custom,
                custom_options=custom_options,
                version=version,
                origin=i,
            )
        )
    return ir.Subgraph(
        index=k,
        name=_text(sg.name),
        tensors=tensors,
        operators=tuple(operators),
        inputs=indices(sg.inputs, "input"),
        outputs=indices(sg.outputs, "output"),
        origin=k,
    )


def _signature(s: Any, subgraphs: tuple, where: str) -> ir.SignatureDef:
    k = _index(s.subgraphIndex, len(subgraphs), "signature subgraph", where)
    def names(maps: Any) -> dict[str, int]:
        return {_text(t.name): int(t.tensorIndex) for t in (maps or [])}
    return ir.SignatureDef(_text(s.signatureKey), k, names(s.inputs), names(s.outputs))
