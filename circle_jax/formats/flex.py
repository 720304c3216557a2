"""A Flex operator's custom options (TensorFlow ops that TF's converter kept as TF ops).

A Flex operator is a CUSTOM one whose custom_code is "Flex" + the TF op name; its
custom_options (format 0, FLEXBUFFERS) are an untyped FlexBuffer vector of two strings: the
TF op name and the serialized ``tensorflow.NodeDef`` (its attributes: strides, padding,
dtypes). The NodeDef's bytes are read as bytes, not text (a FlexRestore's are not UTF-8,
which ``flexbuffers.Loads`` would decode); parsing them is the Flex kernels' business
(``circle_jax.ops.flex``).
"""

from __future__ import annotations

from flatbuffers import flexbuffers

from ..errors import CircleFormatError


def flex_options(custom_options: bytes | None, where: str) -> tuple[str, bytes]:
    """(TF op name, NodeDef bytes) of a Flex operator's custom options; one-line
    `CircleFormatError` naming ``where`` when they are not a vector of two strings."""
    expected = "expected a FlexBuffer vector [TF op name, NodeDef bytes]"
    if not custom_options:
        raise CircleFormatError(f"{where}: the Flex operator has no custom options ({expected})")
    try:
        root = flexbuffers.GetRoot(bytes(custom_options))
        vector = root.AsVector if root.IsVector else None
        items = [vector[0], vector[1]] if vector is not None and len(vector) == 2 else None
        if items is None or not all(r.IsString for r in items):
            raise ValueError("not a vector of two strings")
        return items[0].AsStringBytes.decode("ascii"), bytes(items[1].AsStringBytes)
    except (ValueError, IndexError, TypeError, UnicodeDecodeError) as e:
        raise CircleFormatError(f"{where}: its custom options do not decode ({e}; "
                                f"{expected})") from None
