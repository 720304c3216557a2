"""circle_jax.inline_cpu_dispatch: a process-wide JAX setting, set only before JAX starts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

TRAIN = """
from circle_jax.examples import branching_cnn, digits
from circle_jax.train import fit
x, y = digits()
model = cj.load(branching_cnn().to_bytes("circle"))
print(repr(fit(model, x[:64], y[:64], epochs=2, batch_size=16, loss="cce").history.loss))
"""


def _run(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()


@pytest.mark.slow
def test_inline_before_jax_starts_and_same_results():
    *_, setting, inline = _run("import jax\nimport circle_jax as cj\n"
                               "print(cj.inline_cpu_dispatch(), "
                               "jax.config.read('jax_cpu_enable_async_dispatch'))" + TRAIN)
    assert setting == "True False"
    *_, setting, asynchronous = _run("import jax\nimport circle_jax as cj\n"
                                     "print(jax.config.read('jax_cpu_enable_async_dispatch'))"
                                     + TRAIN)
    assert setting == "True"
    assert inline == asynchronous  # the same programs, run on another thread: bit-identical


def test_after_jax_started_the_setting_is_left_alone():
    *_, last = _run("""
        import jax, jax.numpy as jnp
        import circle_jax as cj
        jnp.zeros(1).block_until_ready()
        print(cj.inline_cpu_dispatch(), jax.config.read("jax_cpu_enable_async_dispatch"))
    """)
    assert last == "False True"
