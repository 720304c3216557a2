"""Every model whose training step exports: LiteRT's 20 steps of the export against
circle-jax's 20 steps, SGD and Adam, as a table (a study; the slow tier asserts the same
contract per model, `tests/passes/test_training_graph_agreement.py`, whose docstring gives
the problem: data, loss, learning rate).

    python benchmarks/training_graph_agreement.py [--steps 20] [--only TEXT]

Per model and optimizer: the largest relative difference of the per-step losses, and of the
final weights (each weight's largest difference over its largest element, the worst weight).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.passes.test_training_graph_agreement import EXPORTING, agreement  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--only", default="")
    args = p.parse_args()
    print("| model | optimizer | losses | weights | worst weight |")
    print("|---|---|---:|---:|---|")
    for name in EXPORTING:
        if args.only not in name:
            continue
        for optimizer in ("sgd", "adam"):
            dl, dw, worst = agreement(name, optimizer, args.steps)
            print(f"| {name} | {optimizer} | {dl:.1e} | {dw:.1e} | {worst[:60]} |", flush=True)


if __name__ == "__main__":
    main()
