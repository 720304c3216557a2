"""The reference oracle: golden tensors in ONE's formats, and step-by-step comparison of a
peer runtime's training with circle-jax's (`compare`)."""

from __future__ import annotations

from .golden import GoldenData, golden, write_golden
from .h5 import Entry, read_h5, write_h5

__all__ = ["Entry", "GoldenData", "golden", "read_h5", "write_golden", "write_h5"]
