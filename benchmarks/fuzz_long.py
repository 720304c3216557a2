"""Long-mode fuzzing of ``circle_jax.load`` and the first ``apply`` (by hand, not CI).

    python benchmarks/fuzz_long.py [--per-model 200] [--start 0] [--max-size 4000000]
                                   [--timeout 20] [--json FILE]

Every model in ../shared/models up to ``--max-size`` bytes gets ``--per-model`` seeded
mutations (tests/fuzz.py: byte flips, 4-byte overwrites with extreme values, truncation,
duplicated and removed chunks); each is judged in a worker process limited to 4 GiB of
address space and ``--timeout`` seconds. Prints the count of each outcome class (ok,
refused, and every kind of bad outcome with an example) and the bad cases themselves.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import fuzz  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-model", type=int, default=200)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--max-size", type=int, default=4_000_000)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    models = sorted(p.name for p in fuzz.MODELS.glob("*")
                    if p.suffix in (".tflite", ".circle") and p.stat().st_size <= args.max_size)
    counts: collections.Counter[str] = collections.Counter()
    bad = []
    t0 = time.time()
    for case, result in fuzz.run_cases(fuzz.cases(models, args.per_model, args.start),
                                       timeout=args.timeout):
        kind = result if not result.startswith("bad") else result.split(":")[0:2]
        counts["bad: " + kind[1].strip() if isinstance(kind, list) else kind] += 1
        if result.startswith("bad"):
            bad.append({"model": case.model, "seed": case.seed, "result": result})
            print(f"{case.model} seed {case.seed}: {result}", flush=True)
    total = sum(counts.values())
    print(f"\n{total} cases over {len(models)} models in {time.time() - t0:.0f} s")
    for kind, n in counts.most_common():
        print(f"  {kind:40} {n:7} ({100 * n / total:.2f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": counts, "bad": bad}, indent=1))


if __name__ == "__main__":
    main()
