"""Untying shared constants (`circle_jax.passes.untie`): a constant read by several
operators becomes one copy per reader, recorded, each copy the source tensor but for its
name and buffer; its output exports and runs in LiteRT and onert (`test_pipeline`)."""

from __future__ import annotations

from circle_jax import passes
from circle_jax.formats.reader import read_model, unpack
from circle_jax.formats.writer import write_model
from tests.formats.test_writer import differences
from tests.passes.test_pipeline import BRANCHING, MELSPEC, MNIST_CIRCLE
from tests.paths import shared_model


def test_untie_shared_constants_is_pure_and_records_what_it_changed() -> None:
    again = passes.untie_shared_constants(read_model(shared_model(MELSPEC)))
    assert again.passes[0].changes == {"convolution/op9": "convolution"}
    assert again.passes[0].describe() == [
        "pass untie_shared_constants (copy: shared tensor): 1 change(s)",
        "  convolution/op9: convolution"]
    before = read_model(shared_model(MNIST_CIRCLE))
    none = passes.untie_shared_constants(before)
    assert before.passes == () and none.passes[0].describe() == [
        "pass untie_shared_constants: no change"]


def test_a_copied_tensor_keeps_every_field_of_its_source_but_name_and_buffer() -> None:
    """An untied copy starts from its source tensor's object (``origin``): fields the IR
    does not model (``hasRank``, sparsity, ...) come along; only the name and a buffer of
    its own differ, and the file's other tensors and operators are unchanged."""
    source = read_model(BRANCHING)
    out = passes.untie_shared_constants(source)
    ((copy_name, shared),) = list(out.passes[0].changes.items())[:1]
    written, before = unpack(write_model(out)), unpack(source.source)
    sg, old = written.subgraphs[0], before.subgraphs[0]
    names = [t.name.decode() for t in sg.tensors]
    copy_t, orig_t = sg.tensors[names.index(copy_name)], sg.tensors[names.index(shared)]
    assert {d.split(":")[0] for d in differences(orig_t, copy_t, "t")} == {"t.buffer", "t.name"}
    assert len(written.buffers) == len(before.buffers) + len(out.passes[0].changes)
    assert differences(old.tensors, sg.tensors[:len(old.tensors)]) == []
    copies = {names.index(n) for n in out.passes[0].changes}
    readers = [j for j, op in enumerate(sg.operators) if copies & set(op.inputs)]
    assert len(readers) == len(copies) == 2  # one bias read by three convolutions
    assert differences([o for j, o in enumerate(old.operators) if j not in readers],
                       [o for j, o in enumerate(sg.operators) if j not in readers]) == []
