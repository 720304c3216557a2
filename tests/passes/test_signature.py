"""Selecting a signature (`circle_jax.passes.signature`): its subgraph becomes the main one,
every reference renumbered; its output exports and runs in LiteRT (`test_pipeline`)."""

from __future__ import annotations

import pytest

import circle_jax as cj
from circle_jax import passes
from circle_jax.formats.reader import read_model
from tests.passes.test_pipeline import TRANSFORMER
from tests.paths import shared_model


def test_select_signature_swaps_subgraphs_and_renumbers_references() -> None:
    m = read_model(shared_model(TRANSFORMER))
    k = next(s.subgraph_index for s in m.signature_defs if s.key == "signature_2")
    out = passes.select_signature(m, "signature_2")
    assert k != 0 and out.main.origin == k and out.subgraphs[k].origin == 0
    assert [sg.index for sg in out.subgraphs] == list(range(len(m.subgraphs)))
    assert {s.key: s.subgraph_index for s in out.signature_defs} == {
        "signature_2": 0, "signature_1": k}
    with pytest.raises(cj.CircleFormatError, match="no signature 'x'"):
        passes.select_signature(m, "x")
