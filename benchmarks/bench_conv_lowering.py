"""Time each convolution lowering of ``circle_jax.lowering`` (forward + backward) per shape.

    python benchmarks/bench_conv_lowering.py [--repeats N] [--quick]

For every case, each lowering computes ``jax.grad`` of the sum of the output with respect to
the input AND the filter (what a training step needs), jitted; the time is the median over
``--repeats`` samples of the wall time until ``block_until_ready``. The last column marks the
lowering the dispatch rule (``choose_conv_lowering`` / ``choose_transpose_conv_lowering``)
picks, so the table shows whether the thresholds in ``circle_jax/lowering/conv.py`` and
``circle_jax/lowering/transpose_conv.py`` are right on
this machine. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from circle_jax.lowering import TRANSPOSE_CONV_METHODS, conv, transpose_conv
from circle_jax.ops.common import padding_pairs
from circle_jax.ops.conv import Geometry, TransposeGeometry


@dataclass(frozen=True)
class Case:
    name: str
    x: tuple[int, ...]  # NHWC input
    kernel: tuple[int, int]
    c_out: int
    stride: int = 1
    groups: int = 1  # groups == C_in: depthwise
    transpose: bool = False
    quick: bool = False  # part of --quick


CASES = [
    # The branching 8x8x8 CNN of design.md: 3x3 convs with 8 channels.
    Case("branching CNN 3x3", (1, 8, 8, 8), (3, 3), 8, quick=True),
    Case("branching CNN 3x3", (16, 8, 8, 8), (3, 3), 8, quick=True),
    # Where im2col stops paying: 3x3 with more channels (im2col depth 9 * C_in).
    Case("3x3 C=16", (16, 16, 16, 16), (3, 3), 16),
    Case("3x3 C=32", (16, 16, 16, 32), (3, 3), 32),
    Case("3x3 C=64", (16, 16, 16, 64), (3, 3), 64),
    Case("3x3 C=64", (1, 32, 32, 64), (3, 3), 64),
    Case("3x3 C=32", (16, 32, 32, 32), (3, 3), 32),
    Case("3x3 C=16", (16, 64, 64, 16), (3, 3), 16),
    Case("3x3 C=128", (16, 8, 8, 128), (3, 3), 128),
    Case("3x3 C=3 stem s2", (16, 64, 64, 3), (3, 3), 16, stride=2),
    Case("5x5 C=32", (16, 16, 16, 32), (5, 5), 32),
    # Pointwise (1x1) convolutions, as in MobileNet.
    Case("1x1 32->64", (1, 32, 32, 32), (1, 1), 64),
    Case("1x1 32->64", (16, 32, 32, 32), (1, 1), 64, quick=True),
    Case("1x1 256->256", (16, 8, 8, 256), (1, 1), 256),
    # MobileNet-like depthwise 3x3 at 64x64x32.
    Case("depthwise 3x3 s1", (1, 64, 64, 32), (3, 3), 32, groups=32),
    Case("depthwise 3x3 s1", (16, 64, 64, 32), (3, 3), 32, groups=32, quick=True),
    Case("depthwise 3x3 s2", (1, 64, 64, 32), (3, 3), 32, stride=2, groups=32),
    Case("depthwise 3x3 s2", (16, 64, 64, 32), (3, 3), 32, stride=2, groups=32, quick=True),
    Case("depthwise 5x5 s1", (16, 32, 32, 64), (5, 5), 64, groups=64),
    # Grouped (neither regular nor depthwise).
    Case("grouped 3x3 g=4", (16, 16, 16, 32), (3, 3), 32, groups=4),
    Case("grouped 3x3 g=16", (16, 8, 8, 64), (3, 3), 64, groups=16),
    # Transpose convolutions (decoder / upsampling).
    Case("transpose 4x4 s2", (1, 16, 16, 16), (4, 4), 8, stride=2, transpose=True),
    Case("transpose 4x4 s2", (16, 16, 16, 16), (4, 4), 8, stride=2, transpose=True, quick=True),
    Case("transpose 2x2 s2", (16, 32, 32, 32), (2, 2), 16, stride=2, transpose=True),
    Case("transpose 3x3 s2", (16, 16, 16, 64), (3, 3), 64, stride=2, transpose=True),
    Case("transpose 3x3 s2", (16, 8, 8, 256), (3, 3), 128, stride=2, transpose=True),
    Case("transpose 4x4 s2", (1, 16, 16, 256), (4, 4), 128, stride=2, transpose=True),
]


def methods(case: Case) -> tuple[str, ...]:
    if case.transpose:
        return TRANSPOSE_CONV_METHODS
    c_in = case.x[-1]
    if case.groups == c_in:
        return ("xla", "im2col", "shift")
    return ("xla", "im2col", "kn2row") if case.groups == 1 else ("xla", "im2col")


def chosen(case: Case) -> str:
    c_in = case.x[-1]
    if case.transpose:
        return transpose_conv.choose_transpose_conv_lowering(case.kernel, case.c_out,
                                                             math.prod(case.x[:3]))
    out_pixels = case.x[0] * math.prod(-(-d // case.stride) for d in case.x[1:3])
    return conv.choose_conv_lowering(case.kernel, c_in, case.c_out, case.groups, out_pixels,
                                     (case.stride, case.stride))


def step_fn(case: Case, method: str) -> Callable:
    """Jitted grad (w.r.t. input and filter) of the sum of one convolution."""
    s = (case.stride, case.stride)
    if case.transpose:
        n, h, w_, _ = case.x
        out_hw = (h * case.stride, w_ * case.stride)
        before = tuple(p[0] for p in padding_pairs(0, out_hw, case.kernel, s))
        tg = TransposeGeometry(out_hw, s, before)

        def f(x, w):
            return jnp.sum(transpose_conv.transpose_conv_nd(x, w, tg, method))
    else:
        pads = tuple(tuple(p) for p in padding_pairs(0, case.x[1:3], case.kernel, s))
        g = Geometry(tuple(case.kernel), s, (1, 1), pads)

        def f(x, w):
            return jnp.sum(conv.conv_nd(x, w, g, method))

    return jax.jit(jax.grad(f, argnums=(0, 1)))


def weights_shape(case: Case) -> tuple[int, ...]:
    c_in = case.x[-1]
    if case.transpose:
        return (case.c_out, *case.kernel, c_in)
    return (*case.kernel, c_in // case.groups, case.c_out)


def time_us(fn: Callable, args: tuple, repeats: int) -> tuple[float, float]:
    """(median, min) wall time of one call in microseconds (inner loops: samples >= 2 ms)."""
    jax.block_until_ready(fn(*args))  # compile
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = time.perf_counter() - t0
    inner = max(1, int(2e-3 / max(once, 1e-7)))
    if once > 0.1:  # slow lowerings: about 2 s of samples are enough to see it
        repeats = max(3, min(repeats, int(2 / once)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples) * 1e6, min(samples) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="only the cases named in design.md")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; forward+backward; "
          f"median / min of {args.repeats} samples, microseconds")
    all_methods = ("xla", "im2col", "shift", "col2im")
    print(f"{'case':<18} {'input NHWC':<17} {'k':<3} {'Cout':>4} {'s':>1} "
          + "".join(f"{m:>16}" for m in all_methods) + "  chosen (median speedup vs xla)")
    for case in CASES:
        if args.quick and not case.quick:
            continue
        x = jnp.asarray(rng.normal(size=case.x), jnp.float32)
        w = jnp.asarray(rng.normal(size=weights_shape(case)) * 0.1, jnp.float32)
        times = {m: time_us(step_fn(case, m), (x, w), args.repeats) for m in methods(case)}
        pick = chosen(case)
        cells = "".join(f"{times[m][0]:9.0f}/{times[m][1]:<6.0f}" if m in times else f"{'-':>16}"
                        for m in all_methods)
        k = f"{case.kernel[0]}x{case.kernel[1]}"
        print(f"{case.name:<18} {str(case.x):<17} {k:<3} {case.c_out:>4} {case.stride:>1} "
              f"{cells}  {pick} ({times['xla'][0] / times[pick][0]:.1f}x)", flush=True)


if __name__ == "__main__":
    main()
