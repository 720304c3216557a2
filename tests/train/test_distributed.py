"""Data-parallel and multi-process training (``circle_jax.distributed``).

The mesh runs happen in a subprocess with 4 host devices (``tests/distributed_runs.py``;
this process keeps its single device): per-epoch losses of ``fit(devices=4)`` (and of
``fit(mesh=...)`` on 2 devices) equal the single-device run within 1e-5 for sgd and adam,
shuffling with a validation tail and a new head with LoRA adapters (only they train),
streamed and in-step accumulation, dynamic loss scaling, a frozen prefix. The tolerance: the
only difference is the order in which the per-device partial sums of each batch's loss and
gradients are added (float32, ~1e-7 relative); 1e-5 leaves room for two epochs of it. The
multi-process run is two ``circle-jax train`` processes on 127.0.0.1 (gloo), resuming from a
single-process checkpoint and writing one that a single process resumes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.checkpoints import fit_checkpointed
from circle_jax.cli import main
from circle_jax.distributed import DataParallel, data_mesh
from circle_jax.examples import branching_cnn, digits
from circle_jax.optim.accumulate import split_batch
from tests.paths import REPO_ROOT

TOL = 1e-5  # see the module docstring
TIMEOUT_S = 240  # per subprocess run (the mesh run takes ~40 s on a busy 2-core machine)


def _env(xla_flags: str = "") -> dict[str, str]:
    """This environment, this checkout first on the path, no compile cache, ``xla_flags``
    added to the XLA flags it has."""
    return dict(os.environ, PYTHONPATH=str(REPO_ROOT), CIRCLE_JAX_CACHE="off",
                XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {xla_flags}".strip())


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("mesh") / "runs.json"
    subprocess.run([sys.executable, "-m", "tests.distributed_runs", str(out)], cwd=REPO_ROOT,
                   env=_env("--xla_force_host_platform_device_count=4"),
                   check=True, timeout=TIMEOUT_S)
    return json.loads(out.read_text())


@pytest.mark.slow  # the 4-device subprocess run (mesh_runs)
def test_sharded_losses_equal_single_device(mesh_runs: dict) -> None:
    assert mesh_runs["devices"] == 4
    assert sorted(r["mesh_size"] for r in mesh_runs["runs"].values()) == [2, 4, 4, 4]
    for name, r in mesh_runs["runs"].items():
        assert r["mesh_size"] == r["expected_size"], name
        # the sharded epoch is one program over 4 devices whose gradients XLA all-reduces
        assert r["all_reduces"] > 0 and r["single_all_reduces"] == 0, name
        np.testing.assert_allclose(r["sharded"], r["single"], rtol=0, atol=TOL, err_msg=name)
        np.testing.assert_allclose(r["sharded_val"], r["single_val"], rtol=0, atol=TOL,
                                   err_msg=name)
        assert r["max_param_diff"] < TOL, name
        np.testing.assert_allclose(*r["evaluate"], rtol=0, atol=TOL, err_msg=name)
    personalized = mesh_runs["runs"]["adam+shuffle+validation+new_head+lora"]
    assert personalized["sharded_val"]  # validated
    assert personalized["trainable"] == [
        "conv1/filter/lora_a", "conv1/filter/lora_b", "conv2/filter/lora_a",
        "conv2/filter/lora_b", "head/bias", "head/weights"]


@pytest.mark.slow  # the 4-device subprocess run (mesh_runs)
def test_batch_not_divisible_refused(mesh_runs: dict) -> None:
    assert mesh_runs["refused"] == [
        "batch size 18 is not divisible by the 4 devices of the data mesh; use a multiple of 4",
        "batch size 12 does not split into 2 micro-batches on each of 4 devices; use a "
        "multiple of 8"]


def test_in_step_micro_batches_take_a_part_of_every_device_shard() -> None:
    """Batch rows 0..15 on 4 devices (4 rows each), 2 micro-batches: each holds the first or
    second half of every device's rows, so the micro-batch loop stays data-parallel."""
    micro = np.asarray(split_batch(jnp.arange(16), 2, groups=4))
    assert micro.tolist() == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    assert np.asarray(split_batch(jnp.arange(16), 2)).tolist() == [list(range(8)),
                                                                     list(range(8, 16))]


@pytest.mark.slow  # the 4-device subprocess run (mesh_runs)
def test_mesh_checkpoint_resumes_on_one_device(mesh_runs: dict) -> None:
    """Written every 10 steps on 4 devices; the third epoch, resumed on one device, is the
    uninterrupted single-device run's."""
    c = mesh_runs["checkpoint"]
    np.testing.assert_allclose(c["resumed"], c["whole"][2:], rtol=0, atol=TOL)


def test_cli_refuses_missing_devices_and_partial_flags(capsys: pytest.CaptureFixture) -> None:
    assert main(["train", "--example", "--epoch", "1", "--devices", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == ""  # refused before the parameter block
    assert err.strip() == ("E: 2 devices asked for, JAX sees 1 (cpu); on CPU set XLA_FLAGS="
                   "--xla_force_host_platform_device_count=2 before JAX starts")
    assert main(["train", "--example", "--num_processes", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("E: multi-process training needs --coordinator_address, --num_processes, "
                   "--process_id together; --coordinator_address, --process_id missing")
    assert main(["train", "--example", "--coordinator_address", "localhost:1",
                 "--num_processes", "2", "--process_id", "2"]) == 1
    assert capsys.readouterr().err.strip() == "E: --process_id 2 must be below --num_processes 2"


# ------------------------------------------------------------------------- two processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # two CLI processes
def test_two_processes_resume_and_are_resumed(tmp_path) -> None:
    """Epoch 1 in this process → checkpoint A; epoch 2 in two processes (each feeding half of
    every batch) from A → checkpoint B; epoch 3 here from B. Each epoch's loss is that of
    an uninterrupted single-process run."""
    model = cj.load(branching_cnn().to_bytes("circle"))
    x, y = digits()
    x, y = x[:256], y[:256]
    kw = dict(batch_size=16, optimizer="adam", loss="categorical_crossentropy",
              learning_rate=0.01)
    whole = fit_checkpointed(model, x, y, epochs=3, **kw).history.loss
    a, b = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    fit_checkpointed(model, x, y, epochs=1, save=a, **kw)
    (tmp_path / "m.circle").write_bytes(branching_cnn().to_bytes("circle"))
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    args = [sys.executable, "-m", "circle_jax.cli", "train", str(tmp_path / "m.circle"),
            "--load_input", str(tmp_path / "x.npy"), "--load_expected", str(tmp_path / "y.npy"),
            "--epoch", "1", "--batch_size", "16", "--optimizer", "adam", "--loss",
            "categorical_crossentropy", "--learning_rate", "0.01", "--checkpoint", str(a),
            "--export_checkpoint", str(b), "--coordinator_address",
            f"127.0.0.1:{_free_port()}", "--num_processes", "2", "--process_id"]
    procs = [subprocess.Popen([*args, str(k)], cwd=REPO_ROOT, env=_env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for k in (0, 1)]
    try:
        outs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    lines = [ln for ln in outs[0][0].splitlines() if ln.startswith("Epoch ")]
    assert len(lines) == 1 and "devices              = all over 2 processes" in outs[0][0]
    printed = float(re.search(r"loss: \[0\] ([0-9.]+)", lines[0]).group(1))
    assert abs(printed - whole[1]) <= 5e-5  # printed with 4 decimals
    assert outs[1][0] == ""  # process 1 prints nothing
    rest = fit_checkpointed(model, x, y, epochs=1, resume=b, **kw).history.loss
    np.testing.assert_allclose(rest, whole[2:], rtol=0, atol=TOL)


def test_steps_are_lowered_for_the_mesh_backend() -> None:
    """A mesh of GPU devices trains the reference lowerings (XLA's convolution), a CPU mesh
    the XLA-CPU kernels (the example's convolutions as matmuls): what ``Trainer(placement=...)``
    passes to the model's lowering options. The GPU mesh is a stand-in with that platform."""
    class GpuMesh(DataParallel):
        platform = "gpu"  # type: ignore[assignment]

    model = cj.load(branching_cnn().to_bytes("circle"))
    x = jnp.zeros((4, 8, 8, 1))
    for placement, conv in ((GpuMesh(data_mesh(1)), True), (DataParallel(data_mesh(1)), False)):
        trainer = cj.Trainer(model, batch_size=4, placement=placement)
        jaxpr = str(jax.make_jaxpr(trainer.numerics.apply_in_loop)(model.params, x))
        assert ("conv_general_dilated" in jaxpr) is conv, placement.platform


# ------------------------------------------------------------------- meeting on the port
def _meet_all(port: int, ids: list[int], n: int, timeout_s: float = 5.0) -> dict:
    """Run `rendezvous.meet` for each of ``ids`` on its own thread; id -> None or its error."""
    import threading

    from circle_jax.distributed.rendezvous import meet

    results: dict = {}

    def run(k: int) -> None:
        try:
            meet(f"127.0.0.1:{port}", n, k, timeout_s)
            results[k] = None
        except cj.TrainingError as e:
            results[k] = str(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    return results


def test_processes_meet_on_the_port_in_any_order() -> None:
    assert _meet_all(_free_port(), [2, 1, 0], 3) == {0: None, 1: None, 2: None}


def test_meeting_failures_are_one_error_where_jax_would_end_the_process() -> None:
    """What ``jax.distributed.initialize`` ends the process for (a native abort or a
    segmentation fault, measured with JAX 0.10.2) is a TrainingError before it is called:
    the port taken, process 0 unreachable, a process missing or sent twice; and a port
    outside 1..65535 is refused as the address."""
    from circle_jax.distributed import initialize
    from circle_jax.distributed.rendezvous import meet

    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(cj.TrainingError, match=f"process 0 cannot listen on port {port}"):
            meet(f"127.0.0.1:{port}", 2, 0, 1.0)
    port = _free_port()
    with pytest.raises(cj.TrainingError, match="process 0 cannot be reached at '127.0.0.1:"):
        meet(f"127.0.0.1:{port}", 2, 1, 0.5)
    assert _meet_all(port, [0, 1], 3, 1.0) == {
        0: f"processes 2 did not reach '127.0.0.1:{port}' in time",
        1: f"process 0 at '127.0.0.1:{port}' did not let process 1 join (another process "
           "with the same id, or the others missing past the timeout)"}
    twice = _meet_all(_free_port(), [0, 1, 1], 3, 2.0)
    assert "expected one of [2]" in twice[0] and twice[1] is not None
    with pytest.raises(cj.TrainingError, match="with a port in 1..65535"):
        initialize("localhost:99999", 2, 1)
