"""onert trains a model step by step in a child process, its weights read back after every
step: the peer run of ``circle-jax compare``.

The child works in a temporary directory holding ``m.circle`` (the model; onert 0.1.0
garbles paths over 15 bytes and reads the source file again when it exports, so the
session is opened on that short relative name), ``job.json`` (the settings) and
``data.npz`` (one array per batch and model input or output). After each ``train`` it
exports the model (``e.circle``) and reads the float constants named in the job back from
that file. onert's own error line (its stderr) becomes the `PeerRefused` message, and a crash
of onert cannot take the caller's process down.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CircleJaxError

STEP_TIMEOUT_S = 600
"""The longest the onert child may take, all steps together."""


class PeerRefused(CircleJaxError):
    """The peer runtime cannot run the case; the message quotes its own words."""


@dataclass(frozen=True)
class PeerSteps:
    """What onert did, step by step.

    Attributes:
      loss: each step's loss as ``train_get_loss`` reports it (the batch's pre-update loss).
      weights: ``weights[s][i]``: tensor ``i`` of subgraph 0 before step ``s`` (``s`` from
        0; the last entry is after the last step), as onert's exported model holds it.
      final_loss: onert's loss on batch 0 after the last step, without an update (the
        function onert trained, for checking its export).
      exported: the model onert exports after the last step.
    """

    loss: list[float]
    weights: list[dict[int, np.ndarray]]
    final_loss: float
    exported: bytes


def onert_steps(model: bytes, xs: Sequence[Sequence[np.ndarray]],
                ys: Sequence[np.ndarray], tensors: Sequence[int], *, learning_rate: float,
                loss: int, reduction: int, optimizer: int, trainable_ops: int,
                timeout_s: float = STEP_TIMEOUT_S) -> PeerSteps:
    """Train ``model`` one step per batch (``xs[s]``: the inputs of step ``s``, ``ys[s]``
    its expected output 0) with onert_train's codes; ``tensors``: the tensor indices whose
    values are read back. Raises `PeerRefused` with onert's message when it cannot."""
    with tempfile.TemporaryDirectory(prefix="cj-onert-") as tmp:
        with open(os.path.join(tmp, "m.circle"), "wb") as f:
            f.write(model)
        job = {"batch_size": int(ys[0].shape[0]), "learning_rate": float(learning_rate),
               "loss": int(loss), "reduction": int(reduction), "optimizer": int(optimizer),
               "trainable_ops": int(trainable_ops), "steps": len(ys),
               "inputs": len(xs[0]), "tensors": [int(i) for i in tensors]}
        with open(os.path.join(tmp, "job.json"), "w") as f:
            json.dump(job, f)
        arrays = {f"x{s}_{k}": a for s, batch in enumerate(xs) for k, a in enumerate(batch)}
        arrays.update({f"y{s}": y for s, y in enumerate(ys)})
        np.savez(os.path.join(tmp, "data.npz"), **arrays)
        try:
            done = subprocess.run([sys.executable, "-m", __name__], cwd=tmp,
                                  capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise PeerRefused(f"onert took over {timeout_s:g} s for {len(ys)} steps") from None
        if done.returncode != 0:
            raise PeerRefused(_peer_message(done.stderr))
        with open(os.path.join(tmp, "e.circle"), "rb") as f:
            exported = f.read()
        with np.load(os.path.join(tmp, "result.npz")) as r:
            weights = [{i: r[f"w{s}_{i}"] for i in job["tensors"]}
                       for s in range(len(ys) + 1)]
            return PeerSteps([float(v) for v in r["loss"]], weights, float(r["final_loss"]),
                             exported)


def _peer_message(stderr: str) -> str:
    """onert's own error line (``Error during ...``), else the last line it printed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("Error")] or lines[-1:] or ["no message"]
    return said[0]


def _run_job() -> None:
    """The child's work, in its working directory (see the module docstring)."""
    from ..formats.reader import read_model
    from .onert_session import io_dtypes, open_session, train_batch

    with open("job.json") as f:
        job = json.load(f)
    try:
        s = open_session("m.circle", batch_size=job["batch_size"],
                         learning_rate=job["learning_rate"], loss=job["loss"],
                         reduction=job["reduction"], optimizer=job["optimizer"],
                         trainable_ops=job["trainable_ops"])
    except ImportError:
        sys.exit("Error: comparing with onert needs the onert wheel (pip install onert)")
    in_dt, out_dt = io_dtypes(s)
    data = np.load("data.npz")

    def batch(step: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        xs = [np.ascontiguousarray(data[f"x{step}_{k}"], dt) for k, dt in
              zip(range(job["inputs"]), in_dt)]
        return xs, [np.ascontiguousarray(data[f"y{step}"], out_dt[0])]

    def read_back(step: int, path: str = "e.circle") -> dict[str, np.ndarray]:
        if step:  # before the first step onert exports nothing ("invalid state")
            s.train_export_circle(path)
        tensors = read_model(path).main.tensors
        return {f"w{step}_{i}": np.array(tensors[i].data) for i in job["tensors"]}

    out = read_back(0, "m.circle")
    losses = []
    for step in range(job["steps"]):
        xs, ys = batch(step)
        losses.append(train_batch(s, xs, ys)[0])
        out.update(read_back(step + 1))
    xs, ys = batch(0)
    final = train_batch(s, xs, ys, update=False)[0]
    np.savez("result.npz", loss=np.array(losses), final_loss=np.array(final), **out)


if __name__ == "__main__":
    _run_job()
