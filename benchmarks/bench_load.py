"""Time of ``circle_jax.load`` on every shared model, with the passes each option runs.

    python benchmarks/bench_load.py [--models NAME,...] [--repeat 5]

Per model and configuration (``default``: the onert profile, which unties shared weights;
``keras``: untie and add missing biases; ``tied``: ``tie_shared_weights=True``, no pass;
``signature``: the last signature selected, for multi-signature models), the fastest of
``--repeat`` loads from the file's bytes in this process after one warm-up load (the
fastest: the run least disturbed by other processes; nothing is traced: ``load`` parses,
checks and plans the lowering), and the fastest run of the load's graph passes alone on
the parsed model (``circle_jax.passes.pipeline_stages``, or ``pipeline`` for older code;
"-" for code without it). Also counts
the FlatBuffer parses (``ModelT.InitFromBuf``) and serializations
(``flatbuffers.Builder.Finish``) of one load.

Not a test: numbers depend on the machine and its load. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_MODELS = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "models"))


def _counting(owner: Any, name: str, counts: dict[str, int]) -> Callable[[], None]:
    """Count calls of ``owner.name`` into ``counts[name]``; returns the undo."""
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)
    return lambda: setattr(owner, name, original)


def main() -> None:
    import flatbuffers
    from circle_schema.v0_10 import circle as schema

    import circle_jax as cj

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    names = [n for n in sorted(os.listdir(SHARED_MODELS)) if n.endswith((".circle", ".tflite"))]
    if args.models:
        names = [n for n in names if n in args.models.split(",")]
    print("| model | config | load ms | passes ms | parses | serializations |")
    print("|---|---|---:|---:|---:|---:|")
    for name in names:
        with open(os.path.join(SHARED_MODELS, name), "rb") as f:
            data = f.read()
        configs: dict[str, dict[str, Any]] = {
            "default": {}, "keras": {"numerics": "keras"}, "tied": {"tie_shared_weights": True}}
        keys = cj.formats.read_model(data).signature_defs
        if len(keys) > 1:
            configs["signature"] = {"signature": keys[-1].key}
        for config, options in configs.items():
            try:
                cj.load(data, **options)
            except cj.CircleJaxError as e:
                print(f"| {name} | {config} | refused: {str(e)[:60]} | | | |")
                continue
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                cj.load(data, **options)
                times.append(time.perf_counter() - t0)
            counts = {"InitFromBuf": 0, "Finish": 0}
            undo = [_counting(schema.Model.ModelT, "InitFromBuf", counts),
                    _counting(flatbuffers.Builder, "Finish", counts)]
            try:
                cj.load(data, **options)
            finally:
                for u in undo:
                    u()
            print(f"| {name} | {config} | {1000 * min(times):.1f} | {_passes_ms(data, options)} "
                  f"| {counts['InitFromBuf']} | {counts['Finish']} |")


def _passes_ms(data: bytes, options: dict[str, Any], repeat: int = 5) -> str:
    """The fastest run of the passes ``load(data, **options)`` runs, on the parsed model."""
    try:
        from circle_jax import passes
        from circle_jax.numerics import get_numerics
    except ImportError:
        return "-"
    import circle_jax as cj

    prof = get_numerics(options.get("numerics")).with_overrides(
        tie_shared_weights=options.get("tie_shared_weights"))
    if hasattr(passes, "pipeline_stages"):  # load's one pipeline, all its stages
        stages = passes.pipeline_stages(
            signature=options.get("signature"), untie=not prof.tie_shared_weights,
            add_bias=prof.add_missing_bias, policy=prof.trainable_policy)

        def todo(m: Any) -> Any:
            return passes.run_stages(m, stages)
    else:
        steps = passes.pipeline(signature=options.get("signature"),
                                untie=not prof.tie_shared_weights,
                                add_bias=prof.add_missing_bias, policy=prof.trainable_policy)

        def todo(m: Any) -> Any:
            return passes.run(m, steps)
    parsed = cj.read_model(data)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        todo(parsed)
        times.append(time.perf_counter() - t0)
    return f"{1000 * min(times):.1f}"


if __name__ == "__main__":
    main()
