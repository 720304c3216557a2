"""Optimizers run on the weights raveled into one vector (``circle_jax.optim.flat``).

The flattened optimizer must train exactly as the per-weight one: the same operations on the
same values, element by element. So trained weights, losses and the per-weight view of the
optimizer state are compared bit for bit, on a TF-converted model (its own mix of weight
shapes), across the optimizers and options that keep per-weight state. Then: which
optimizers are flattened, and the per-weight view's round trip.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import circle_jax as cj
from circle_jax.optim import adam_tf, sgd
from circle_jax.optim.flat import (
    PACKED_MIN_WEIGHTS,
    Packed,
    flattened,
    packable,
    per_weight,
    raveled,
)
from circle_jax.train import Trainer
from tests.paths import KERAS_DATA, shared_model


def _model() -> cj.Model:
    return cj.load(os.path.join(KERAS_DATA, "branching_cnn.tflite"))


def _data(model: cj.Model, n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (n, *model.inputs[0].shape[1:])).astype(np.float32)
    classes = model.outputs[0].shape[-1]
    return x, np.eye(classes, dtype=np.float32)[rng.integers(0, classes, n)]


def _train(kwargs: dict, flat: bool) -> tuple[Trainer, list, dict, object]:
    model = _model()
    x, y = _data(model)
    trainer = Trainer(model, batch_size=4, **kwargs)
    if not flat:
        trainer.tx = trainer.per_weight_tx
    state, frozen = trainer.init()
    losses = []
    for epoch in range(2):
        state, m = trainer.run_epoch(state, frozen, (jnp.asarray(x),), jnp.asarray(y), epoch)
        losses.append(np.asarray(m.loss))
    return trainer, losses, jax.device_get(state.params), trainer.per_weight_state(state)


@pytest.mark.parametrize("kwargs", [
    dict(optimizer="adam", learning_rate=1e-3),
    dict(optimizer="adamw", learning_rate=1e-3),
    dict(optimizer="rmsprop", learning_rate=1e-3),
    dict(optimizer="momentum", learning_rate=1e-2),
    dict(optimizer="adam", learning_rate=1e-3, accumulate=2),
    dict(optimizer="adam", learning_rate=1e-3, precision="p=f32,c=f16,o=f32",
         loss_scale="dynamic"),
], ids=["adam", "adamw", "rmsprop", "momentum", "adam-accumulate", "adam-float16"])
def test_the_flattened_optimizer_trains_bit_for_bit_as_the_per_weight_one(kwargs) -> None:
    trainer, losses, params, state = _train(kwargs, flat=True)
    assert trainer.tx is not trainer.per_weight_tx, "not flattened"
    _, want_losses, want_params, want_state = _train(kwargs, flat=False)
    np.testing.assert_array_equal(losses, want_losses)
    assert params.keys() == want_params.keys()
    for k in params:
        np.testing.assert_array_equal(params[k], want_params[k], err_msg=k)
    assert jax.tree.structure(state) == jax.tree.structure(want_state)
    jax.tree.map(np.testing.assert_array_equal, state, want_state)


def test_stateless_and_mixed_optimizers_stay_per_weight() -> None:
    f32 = {"a": jax.ShapeDtypeStruct((3, 2), jnp.float32), "b": jax.ShapeDtypeStruct((2,),
                                                                                     jnp.float32)}
    assert flattened(sgd(0.1), f32) is None  # no per-weight state: nothing to gain
    assert flattened(adam_tf(0.1), f32) is not None
    mixed = {**f32, "b": jax.ShapeDtypeStruct((2,), jnp.float16)}
    assert flattened(adam_tf(0.1), mixed) is None  # one vector would promote
    assert flattened(adam_tf(0.1), {}) is None
    trainer = Trainer(_model(), optimizer="sgd")
    assert trainer.tx is trainer.per_weight_tx


def test_the_per_weight_view_round_trips() -> None:
    params = {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.arange(2.0) + 10}
    tx = adam_tf(0.1)
    flat = flattened(tx, params)
    state = flat.init(params)
    state = state._replace(mu=state.mu + jnp.arange(8.0), nu=state.nu + 1)
    view = per_weight(jax.device_get(state), tx, params)
    # ravel_pytree's order: the params' leaves in jax.tree order ("b" before "w")
    np.testing.assert_array_equal(view.mu["b"], [0.0, 1.0])
    np.testing.assert_array_equal(view.mu["w"], np.arange(2.0, 8.0).reshape(3, 2))
    back = raveled(view, params)
    jax.tree.map(np.testing.assert_array_equal, back, jax.device_get(state))
    assert per_weight(view, tx, params) is view  # already per weight


def test_adam_adds_a_few_kernels_not_a_few_per_weight() -> None:
    """What the flattening is for (docs/training.md: "in a few kernels instead of a few per
    weight"): the fused kernels of one compiled step, over SGD's."""
    model = _model()
    x, y = (jnp.asarray(a[:4]) for a in _data(model))

    def kernels(optimizer: str, flat: bool = True) -> int:
        trainer = Trainer(model, batch_size=4, optimizer=optimizer)
        if not flat:
            trainer.tx = trainer.per_weight_tx
        state, frozen = trainer.init()
        step = jax.jit(trainer.train_step).lower(state, frozen, ((x,), y)).compile()
        return step.as_text().count(" fusion(")

    weights = len(Trainer(model).trainable)
    sgd_kernels = kernels("sgd")
    assert kernels("adam", flat=False) - sgd_kernels >= 2 * weights  # m and v, each weight
    assert kernels("adam") - sgd_kernels < weights


# ------------------------------------------------------- vector weights carried packed


def _resnet8() -> cj.Model:
    """A converter's model with more vector weights (biases) than `PACKED_MIN_WEIGHTS`."""
    return cj.load(shared_model("mlperftiny_resnet8_cifar10_float.tflite"))


def _runner_epochs(kwargs: dict, packed: bool, epochs: int = 2) -> tuple[Trainer, list, dict]:
    """``epochs`` epochs through `Trainer.epochs_runner` (what ``fit`` runs), the weights
    `Packed` between the calls or (``packed=False``) by name."""
    model = _resnet8()
    x, y = _data(model, 8)
    trainer = Trainer(model, batch_size=4, **kwargs)
    if not packed:
        trainer.packed = lambda s: s
    state, frozen = trainer.init()
    run = trainer.epochs_runner(state, frozen, (jnp.asarray(x),), jnp.asarray(y), 1)
    summaries = []
    for epoch in range(epochs):
        state, rows = run(state, epoch, 1)
        summaries += rows
    assert isinstance(state.params, Packed) == packed
    return trainer, summaries, jax.device_get(trainer.unpacked(state).params)


@pytest.mark.parametrize("kwargs", [
    dict(optimizer="sgd", learning_rate=1e-2),
    dict(optimizer="sgd", learning_rate=1e-2, precision="p=f32,c=f16,o=f32",
         loss_scale="dynamic", accumulate=2, accumulate_mode="in_step"),
], ids=["sgd", "sgd-float16-in-step"])
def test_packed_weights_train_bit_for_bit_as_the_weights_by_name(kwargs) -> None:
    """The epochs' programs carry the biases as one vector; they train bit for bit as the
    program that carries them by name (the same operations on the same values)."""
    _, summaries, params = _runner_epochs(kwargs, packed=True)
    _, want_summaries, want_params = _runner_epochs(kwargs, packed=False)
    assert summaries == want_summaries
    assert params.keys() == want_params.keys()
    for k in params:
        np.testing.assert_array_equal(params[k], want_params[k], err_msg=k)


def test_packed_weights_round_trip() -> None:
    params = {f"b{i}": jnp.arange(3.0) + i for i in range(PACKED_MIN_WEIGHTS)}
    params["w"] = jnp.arange(6.0).reshape(3, 2)
    packed = Packed.pack(params)
    assert [k for k, _ in packed.layout] == sorted(k for k in params if k != "w")
    assert set(packed.others) == {"w"}
    np.testing.assert_array_equal(packed.vector, ravel_pytree(
        {k: v for k, v in params.items() if k != "w"})[0])
    for back in (packed.unpack(), jax.jit(lambda p: p.unpack())(packed)):
        assert back.keys() == params.keys()
        for k in params:
            np.testing.assert_array_equal(back[k], params[k], err_msg=k)
    grads = {k: v * 2 for k, v in params.items()}
    like = jax.jit(lambda g: packed.like(g))(grads)
    np.testing.assert_array_equal(like.vector, packed.vector * 2)
    np.testing.assert_array_equal(like.others["w"], grads["w"])
    shapes = Packed.pack(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params))
    assert shapes.vector.shape == (3 * PACKED_MIN_WEIGHTS,) and shapes.layout == packed.layout


def test_which_weights_are_packed() -> None:
    biases = {f"b{i}": jnp.zeros(2) for i in range(PACKED_MIN_WEIGHTS)}
    f32 = {**biases, "w": jnp.zeros((3, 2))}
    assert packable(f32, sgd(0.1).init(f32))
    assert not packable(f32, flattened(adam_tf(0.1), f32).init(f32))  # moments raveled
    assert not packable(f32, adam_tf(0.1).init(f32))  # moments by name
    assert not packable({**f32, "b0": jnp.zeros(2, jnp.float16)}, ())  # would promote
    assert not packable({k: v for k, v in f32.items() if k != "b0"}, ())  # too few vectors
    assert not packable({**f32, "b0": jnp.zeros(2, jnp.int32)}, ())  # not a float


def test_packed_vector_weights_update_in_one_kernel() -> None:
    """What packing is for: one update kernel for all biases instead of one each (less the
    few that XLA fuses with their gradient's producer either way, such as the first
    layer's, a row of its clamped layer's gradient kernel: `circle_jax.lowering.clamped`)."""
    model = _resnet8()
    x, y = _data(model, 4)

    def kernels(packed: bool) -> int:
        trainer = Trainer(model, batch_size=4, optimizer="sgd")
        if not packed:
            trainer.packed = lambda s: s
        state, frozen = trainer.init()
        args = trainer._epochs_arguments(trainer.packed(state), frozen, (jnp.asarray(x),),
                                         jnp.asarray(y), None)
        return trainer._compiled_epochs(args, 1).as_text().count(" fusion(")

    biases = sum(np.ndim(v) == 1 for k, v in model.params.items()
                 if k in Trainer(model).trainable)
    assert kernels(packed=False) - kernels(packed=True) >= biases - 3
