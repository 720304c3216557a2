"""Runs for tests/train/test_distributed.py in a process of its own with 4 host devices.

``python -m tests.distributed_runs OUT.json`` (with ``XLA_FLAGS=--xla_force_host_platform_
device_count=4``) trains the bundled CNN on one device and data-parallel on the mesh, for
several configurations, and writes per-epoch losses and what the sharded run compiled.
"""

from __future__ import annotations

import json
import sys
import tempfile
from typing import Any

import jax
import numpy as np

import circle_jax as cj
from circle_jax.checkpoints import fit_checkpointed
from circle_jax.examples import branching_cnn, digits

#: (name, TrainConfig overrides, devices: 4, or 2 for an explicit 1-D mesh whose axis is not
#: called "data"): sgd and adam; shuffling with a validation tail and a new head with LoRA
#: adapters on the convolutions (fit's personalizing keywords); streamed accumulation with a
#: frozen prefix (whose forward is hoisted); in-step accumulation with dynamic loss scaling;
#: a validation set smaller than a batch that the devices do not divide
CONFIGS: list[tuple[str, dict[str, Any], int]] = [
    ("adam+shuffle+validation+new_head+lora",
     dict(optimizer="adam", shuffle=True, validation_split=0.25, new_head=10, lora=2,
          lora_targets="conv"), 4),
    ("adam+accumulate2+last2ops", dict(optimizer="adam", accumulate=2, trainable=2), 4),
    ("sgd+in_step2+dynamic_scale", dict(optimizer="sgd", learning_rate=0.05, accumulate=2,
                                        accumulate_mode="in_step", loss_scale="dynamic"), 2),
    # 6 validation samples: fewer than a batch, not a multiple of the 4 devices (replicated)
    ("sgd+validation_of_6", dict(optimizer="sgd", validation_split=0.0235), 4),
]
COMMON = dict(batch_size=16, epochs=2, loss="categorical_crossentropy")


def _collectives(trainer: cj.Trainer) -> int:
    """All-reduces in the trainer's compiled epochs (0 for a single-device program)."""
    return sum(c.as_text().count("all-reduce(") for c in trainer._compiled.values())


def main(out: str) -> None:
    model = cj.load(branching_cnn().to_bytes("circle"))
    x, y = digits()
    x, y = x[:256], y[:256]
    result: dict[str, Any] = {"devices": jax.device_count(), "runs": {}}
    for name, kw, n in CONFIGS:
        one = cj.fit(model, x, y, **COMMON, **kw)
        where = dict(devices=4) if n == 4 else \
            dict(mesh=jax.sharding.Mesh(np.array(jax.devices()[:n]), ("batch",)))
        sharded = cj.fit(model, x, y, **COMMON, **kw, **where)
        result["runs"][name] = {
            "single": one.history.loss, "sharded": sharded.history.loss,
            "single_val": one.history.val_loss, "sharded_val": sharded.history.val_loss,
            "mesh_size": sharded.trainer.placement.size, "expected_size": n,
            "trainable": sorted(sharded.trainer.trainable),
            "all_reduces": _collectives(sharded.trainer), "single_all_reduces":
                _collectives(one.trainer),
            "evaluate": [one.trainer.evaluate(one.params, x[-80:], y[-80:]),
                         sharded.trainer.evaluate(sharded.params, x[-80:], y[-80:])],
            "max_param_diff": max(float(np.max(np.abs(np.asarray(one.params[k]) -
                                                      np.asarray(sharded.params[k]))))
                                  for k in one.params),
        }
    result["refused"] = []
    for kw in (dict(batch_size=18), dict(batch_size=12, accumulate=2, accumulate_mode="in_step")):
        try:
            cj.fit(model, x, y, **{**COMMON, **kw}, devices=4)
            result["refused"].append(None)
        except cj.TrainingError as e:
            result["refused"].append(str(e))
    # checkpoints written on the 4-device mesh every 10 steps (chunked epochs) resume on one
    with tempfile.TemporaryDirectory() as tmp:
        ck = f"{tmp}/mesh.ckpt"
        kw = dict(COMMON, optimizer="adam")
        whole = fit_checkpointed(model, x, y, **{**kw, "epochs": 3})
        fit_checkpointed(model, x, y, **kw, save=ck, every_steps=10, devices=4)
        rest = fit_checkpointed(model, x, y, **{**kw, "epochs": 1}, resume=ck)
        result["checkpoint"] = {"whole": whole.history.loss, "resumed": rest.history.loss}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
