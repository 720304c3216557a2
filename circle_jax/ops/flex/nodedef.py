"""A Flex operator's TensorFlow NodeDef, decoded with protobuf.

A Flex op is a CUSTOM operator whose custom_code is ``"Flex"`` + the TF op name and whose
custom_options are a FlexBuffer vector of two strings: the TF op name and the serialized
``tensorflow.NodeDef`` (op, one empty input name per input, the attr map). The NodeDef's bytes
are read as bytes (``AsStringBytes``): they are not text, and FlexBuffers' ``Loads`` fails on
those that are not valid UTF-8.

Attribute values become plain Python: ``s`` a str (bytes when not UTF-8), ``i`` an int, ``f``
a float, ``b`` a bool, ``type`` a type name (numpy's dtype name, ``"float32"``, or TF's for
types numpy lacks, ``"string"``: :mod:`circle_jax.formats.tf_proto`), ``shape`` a tuple (-1 an
unknown dimension; None an unknown rank), ``tensor`` a numpy array, ``func`` its name, a
``list`` a list of such values (an empty list: ``[]``), an unset value None.
"""

from __future__ import annotations

from typing import Any

from flatbuffers import flexbuffers
from google.protobuf.message import DecodeError

from circle_jax.errors import CircleFormatError
from circle_jax.formats.tf_proto import NodeDef, array_from_proto, dtype_name, shape_of

_LIST_FIELDS = ("s", "i", "f", "b", "type", "shape", "tensor", "func")


def _value(field: str, v: Any, what: str, limit: int) -> Any:
    if field == "s":
        try:
            return v.decode()
        except UnicodeDecodeError:
            return bytes(v)
    if field == "i":
        return int(v)
    if field == "f":
        return float(v)
    if field == "b":
        return bool(v)
    if field == "type":
        return dtype_name(v)
    if field == "shape":
        return shape_of(v)
    if field == "tensor":
        return array_from_proto(v, what=what, max_elements=limit)
    if field == "func":
        return v.name
    return v  # placeholder: its name


def attr_value(a: Any, what: str = "attribute", limit: int = 1 << 20) -> Any:
    """An AttrValue as a plain Python value (see the module's docstring); a tensor value of
    more than ``limit`` elements is refused (a single value may fill any shape)."""
    field = a.WhichOneof("value")
    if field is None:
        return None
    if field != "list":
        return _value(field, getattr(a, field), what, limit)
    for f in _LIST_FIELDS:
        items = getattr(a.list, f)
        if len(items):
            return [_value(f, x, what, limit) for x in items]
    return []


def attributes(custom_options: bytes, custom_code: str | None = None) -> tuple[str, dict]:
    """The TF op name and attr map of a Flex op's ``custom_options``; a CircleFormatError of
    one line naming the op (``custom_code``, when given) if they are malformed."""
    who = f"Flex operator {custom_code}" if custom_code else "a Flex operator"
    try:
        root = flexbuffers.GetRoot(bytes(custom_options))
        vec = root.AsVector if root.IsVector else None
        ok = vec is not None and len(vec) == 2 and vec[0].IsString and vec[1].IsString
        name = vec[0].AsStringBytes.decode() if ok else ""
        blob = vec[1].AsStringBytes if ok else b""
    except Exception:  # noqa: BLE001  (flexbuffers raises anything on garbage)
        ok = False
    if not ok:
        raise CircleFormatError(f"{who}: its custom_options are not a FlexBuffer vector of "
                                "[TF op name, NodeDef bytes]")
    if custom_code and custom_code.startswith("Flex") and custom_code[4:] != name:
        raise CircleFormatError(f"{who}: its custom_options name TF op {name!r}, its "
                                f"custom_code {custom_code[4:]!r}")
    try:
        node = NodeDef.FromString(blob)
    except DecodeError as e:
        raise CircleFormatError(f"{who}: its NodeDef ({len(blob)} bytes) does not parse as a "
                                f"TensorFlow NodeDef ({e})") from None
    if node.op != name:
        raise CircleFormatError(f"{who}: its NodeDef is of op {node.op!r}, expected {name!r}")
    try:
        attrs = {k: attr_value(v, f"attribute {k!r}", len(blob)) for k, v in node.attr.items()}
    except CircleFormatError as e:
        raise CircleFormatError(f"{who}: {e}") from None
    return name, dict(sorted(attrs.items()))
