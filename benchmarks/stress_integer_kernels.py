"""Random-parameter stress of integer kernels against LiteRT (by hand, not CI).

    python benchmarks/stress_integer_kernels.py [--seed 7] [--rounds 1]

For SQUARED_DIFFERENCE (int8), HARD_SWISH (int8, uint8), RSQRT (int8, int16), LOGISTIC and
TANH (int16) and BATCH_MATMUL (16x16, 16x8): one-operator models with random scales and zero
points (log-uniform scales, each within the range LiteRT accepts) are run by LiteRT (default
kernels, no delegate) and by circle-jax (.tflite and .circle, jitted) on exhaustive inputs
(every int8 pair, every valid 8-bit or int16 input) or, for BATCH_MATMUL, random shapes and
full-range operands (``tests/quantized.py``'s ``check_quantized``: outputs must be equal).
Prints the parameter sets and outputs compared per kernel (a difference stops the run with
an AssertionError naming the kernel and the count of differing outputs).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tests.quantized import Q, check_quantized, every_value, full_range  # noqa: E402


def cases(rng: np.random.Generator) -> list[tuple[str, Callable[[], np.ndarray]]]:
    """(kernel name, run one random case) pairs."""

    def lu(lo: float, hi: float) -> float:
        return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))

    def zp(dtype: str) -> int:
        return int(rng.integers(-128, 128) if dtype == "int8" else rng.integers(0, 256))

    def squared_difference() -> np.ndarray:
        s1, s2 = lu(0.005, 0.2), lu(0.005, 0.2)
        a, b = np.meshgrid(every_value("int8"), every_value("int8"))
        out = lu(4 * max(s1, s2) ** 2 / 2**14 * 1.01, 3.0)  # LiteRT: multiplier below 1
        return check_quantized("SQUARED_DIFFERENCE", [Q(a, (s1, zp("int8"))),
                                                      Q(b, (s2, zp("int8")))],
                               None, out_q=(out, zp("int8")))

    def hard_swish(dtype: str) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            s = lu(0.001, 0.5)
            return check_quantized("HARD_SWISH", [Q(every_value(dtype), (s, zp(dtype)))],
                                   None, out_q=(lu(s / 128 * 1.01, 0.5), zp(dtype)))
        return run

    def rsqrt_int8() -> np.ndarray:
        z = zp("int8")
        return check_quantized("RSQRT", [Q(every_value("int8", lo=z), (lu(1e-3, 10), z))],
                               None, out_q=(lu(1e-3, 1), zp("int8")))

    def rsqrt_int16() -> np.ndarray:
        return check_quantized("RSQRT", [Q(every_value("int16", lo=0), (lu(1e-5, 1), 0))],
                               None, out_q=(lu(1e-5, 1e-2), 0))

    def sigmoid(op: str) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            x = every_value("int16").reshape(256, 256)
            return check_quantized(op, [Q(x, (lu(1e-5, 0.05), 0))], None,
                                   out_q=(1 / 32768, 0))
        return run

    def batch_matmul(rhs: str) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            m, k, n = (int(v) for v in rng.integers(1, 40, 3))
            a = full_range(rng, (int(rng.integers(1, 4)), m, k), "int16")
            b = full_range(rng, (k, n), rhs)
            sa, sb = lu(1e-4, 1e-2), lu(1e-4, 1e-2)
            typical = np.sqrt(k) * 32768 * (32768 if rhs == "int16" else 128) / 3
            return check_quantized("BATCH_MATMUL", [Q(a, (sa, 0)), Q(b, (sb, 0))], None,
                                   out_q=(sa * sb * typical / lu(5000, 50000), 0))
        return run

    return ([("SQUARED_DIFFERENCE int8", squared_difference)] * 12
            + [(f"HARD_SWISH {t}", hard_swish(t)) for t in ("int8", "uint8") for _ in range(40)]
            + [("RSQRT int8", rsqrt_int8)] * 40 + [("RSQRT int16", rsqrt_int16)] * 12
            + [(f"{op} int16", sigmoid(op)) for op in ("LOGISTIC", "TANH") for _ in range(12)]
            + [(f"BATCH_MATMUL 16x{t[3:]}", batch_matmul(t)) for t in ("int16", "int8")
               for _ in range(25)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    counts: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, run in cases(rng):
            c = counts.setdefault(name, [0, 0])
            c[0] += 1
            c[1] += run().size
    print("| kernel | random parameter sets | outputs, all equal to LiteRT's |")
    print("|---|---|---|")
    for name, (sets, outputs) in counts.items():
        print(f"| {name} | {sets} | {outputs:,} |")


if __name__ == "__main__":
    main()
