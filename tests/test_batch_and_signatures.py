"""Batch-1 models at any batch (per-sample semantics), choosing a signature, and choosing
the trained output, on the toy transformer of ../shared/models (two signatures; outputs: two
KV caches and the logits; its RESHAPEs to fixed [1, ...]-less shapes mix samples when the
batch is simply made larger)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

import circle_jax as cj
from circle_jax.cli import main
from circle_jax.train import Trainer
from tests.paths import shared_model

TRANSFORMER = "aeq_toy_transformer_kv_cache_2sig.tflite"
LOGITS = "StatefulPartitionedCall:0"  # output 1: [1, 100, 400]


def _inputs(model: cj.Model, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 0.5, (n, *s.shape[1:])).astype(np.float32) if s.dtype == "float32"
            else rng.integers(0, 100, (n, *s.shape[1:])).astype(np.int32)
            for s in model.inputs]


@pytest.fixture(scope="module")
def transformer() -> cj.Model:
    return cj.load(shared_model(TRANSFORMER))


def test_a_batch_of_n_is_n_single_sample_runs(transformer) -> None:
    """Tolerance 1e-6: the batched matmuls sum in another order than single-sample ones
    (measured differences up to 2.4e-7 on outputs of magnitude ~1)."""
    xs = _inputs(transformer, 3)
    singles = [transformer(*[x[i:i + 1] for x in xs]) for i in range(3)]
    for k, out in enumerate(transformer(*xs)):
        single = np.concatenate([np.asarray(s[k]) for s in singles])
        assert out.shape == single.shape
        np.testing.assert_allclose(out, single, rtol=1e-6, atol=1e-6)


def test_training_at_batch_n_steps_with_the_mean_of_per_sample_gradients(transformer) -> None:
    """On a model whose batch-1 graph is mapped over the samples (its RESHAPEs pin batch 1),
    the step's update is the mean of the per-sample gradients."""
    assert transformer.batch_blocker is not None
    xs = _inputs(transformer, 2)
    y = np.random.default_rng(1).normal(0, 1, (2, 100, 400)).astype(np.float32)
    trainer = Trainer(transformer, batch_size=2, learning_rate=0.1, loss="mse",
                      optimizer="sgd", loss_output=LOGITS)
    assert trainer.loss_output == 1
    state, frozen = trainer.init()
    new, metrics = jax.jit(trainer.train_step)(state, frozen, (tuple(map(jnp.asarray, xs)),
                                                               jnp.asarray(y)))

    def single(p, i):
        out = transformer.apply({**frozen, **p}, *[x[i:i + 1] for x in xs])[1]
        return jnp.mean((out - y[i:i + 1]) ** 2)

    per_sample = jax.jit(jax.value_and_grad(single), static_argnums=1)
    losses, grads = zip(*(per_sample(state.params, i) for i in range(2)))
    losses = [float(v) for v in losses]
    assert float(metrics.loss) == pytest.approx(np.mean(losses), rel=1e-5)
    for k, p in state.params.items():
        want = p - 0.1 * (grads[0][k] + grads[1][k]) / 2
        np.testing.assert_allclose(new.params[k], want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("key", ["signature_1", "signature_2"])
def test_a_signature_runs_as_litert_runs_it(key: str) -> None:
    path = shared_model(TRANSFORMER)
    model = cj.load(path, signature=key)
    sig = next(s for s in model.ir.signature_defs if s.key == key)
    assert sig.subgraph_index == 0  # the chosen subgraph is the main one now
    xs = _inputs(model, 1)
    sg = model.ir.main
    runner = Interpreter(model_path=path).get_signature_runner(key)
    theirs = runner(**{name: xs[list(sg.inputs).index(i)] for name, i in sig.inputs.items()})
    ours = model(*xs)
    for name, i in sig.outputs.items():
        np.testing.assert_allclose(ours[list(sg.outputs).index(i)], theirs[name],
                                   rtol=1e-5, atol=1e-5)
    exported = cj.read_model(model.export())
    assert sorted(s.key for s in exported.signature_defs) == ["signature_1", "signature_2"]


def test_bad_signature_and_output_names_are_one_line(tmp_path, capsys) -> None:
    path = shared_model(TRANSFORMER)
    with pytest.raises(cj.CircleFormatError, match="no signature 'decode' .*'signature_1', "
                       "'signature_2'"):
        cj.load(path, signature="decode")
    model = cj.load(path)
    with pytest.raises(ValueError, match="no model output 'logits': the outputs are 0 "):
        Trainer(model, loss_output="logits")
    x = tmp_path / "x.npz"
    np.savez(x, **{s.name: a for s, a in zip(model.inputs, _inputs(model, 2))})
    assert main(["run", path, "--input", str(x), "--signature", "decode"]) == 1
    assert capsys.readouterr().err.startswith("E: the model has no signature 'decode'")


def test_cli_trains_the_chosen_output_of_a_chosen_signature(tmp_path, capsys) -> None:
    path = shared_model(TRANSFORMER)
    model = cj.load(path, signature="signature_2")
    x, y = tmp_path / "x.npz", tmp_path / "y.npy"
    np.savez(x, **{s.name: a for s, a in zip(model.inputs, _inputs(model, 4))})
    np.save(y, np.random.default_rng(2).normal(0, 1, (4, 100, 400)).astype(np.float32))
    args = ["train", path, "--load_input", str(x), "--load_expected", str(y), "--epoch", "2",
            "--batch_size", "2", "--learning_rate", "0.05", "--loss", "mse",
            "--signature", "signature_2", "--compile_cache", "off"]
    assert main([*args, "--loss_output", "output_0"]) == 0  # signature_2's name for the logits
    lines = [v for v in capsys.readouterr().out.splitlines() if v.startswith("Epoch")]
    losses = [float(v.split("loss: [0] ")[1].split()[0]) for v in lines]
    assert len(losses) == 2 and losses[1] < losses[0]
    assert main([*args, "--loss_output", "0"]) == 1  # y has the logits' shape, not a cache's
    assert "E: " in capsys.readouterr().err


def test_npz_arrays_may_be_named_as_the_signature_names_the_inputs(tmp_path, capsys) -> None:
    """``np.savez(f, tokens=..., positions=...)``: the names a converted model's signature
    gives its inputs select them as their tensor names do (in any order); before, only the
    tensor names (``signature_1_tokens:0``) or arr_0.. were taken."""
    path = shared_model(TRANSFORMER)
    model = cj.load(path)
    (sig,) = [s for s in model.ir.signature_defs if s.subgraph_index == 0]
    by_tensor = dict(zip(model.ir.main.inputs, _inputs(model, 2)))
    outputs = []
    for keyed in ("tensor", "signature"):
        x, out = tmp_path / f"{keyed}.npz", tmp_path / keyed
        if keyed == "tensor":
            arrays = {s.name: a for s, a in zip(model.inputs, by_tensor.values())}
        else:
            arrays = {name: by_tensor[i] for name, i in reversed(sig.inputs.items())}
        np.savez(x, **arrays)
        assert main(["run", path, "--input", str(x), "--output_dir", str(out)]) == 0
        outputs.append([np.load(out / f"output_{k}.npy") for k in range(len(model.outputs))])
    capsys.readouterr()
    for a, b in zip(*outputs):
        np.testing.assert_array_equal(a, b)
    np.savez(tmp_path / "part.npz", **dict(list(arrays.items())[:-1]))
    assert main(["run", path, "--input", str(tmp_path / "part.npz")]) == 1
    assert "or tokens," in capsys.readouterr().err
