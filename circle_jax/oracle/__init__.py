"""The reference oracle: golden tensors in ONE's formats, step-by-step comparison of a
peer runtime's training with circle-jax's (`compare`), and both as Model Explorer overlays
on the model's graph (`overlay`; `view` shows them)."""

from __future__ import annotations

from ..interop.model_explorer import read_overlay, view
from .golden import GoldenData, golden, write_golden
from .h5 import Entry, read_h5, write_h5
from .overlay import compare_overlay, golden_overlay, write_overlay

__all__ = ["Entry", "GoldenData", "compare_overlay", "golden", "golden_overlay", "read_h5",
           "read_overlay", "view", "write_golden", "write_h5", "write_overlay"]
