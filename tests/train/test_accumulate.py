"""Gradient accumulation: optax.MultiSteps semantics, and k micro-batches == one big batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from circle_jax import losses, optim


def _grad_sequence(n_steps, seed=0):
    r = np.random.default_rng(seed)
    return [
        {"w": r.normal(size=(3, 2)).astype(np.float32), "b": r.normal(size=(2,)).astype(np.float32)}
        for _ in range(n_steps)
    ]


@pytest.mark.parametrize(
    "make_inner, reduction",
    [(lambda: optim.adam(0.01), "mean"), (lambda: optax.sgd(0.1, 0.9), "sum")],
    ids=["adam-mean", "momentum-sum"],
)
def test_matches_optax_multisteps(make_inner, reduction):
    k, grads = 3, _grad_sequence(9)
    params = jax.tree.map(jnp.zeros_like, grads[0])
    ours = optim.accumulate(make_inner(), k, reduction=reduction)
    ref = optax.MultiSteps(make_inner(), k, use_grad_mean=reduction == "mean")

    @jax.jit
    def both(g, s1, s2):
        return ours.update(g, s1, params), ref.update(g, s2, params)

    s1, s2 = ours.init(params), ref.init(params)
    for i, g in enumerate(grads):
        (u1, s1), (u2, s2) = both(g, s1, s2)
        jax.tree.map(np.testing.assert_array_equal, u1, u2)  # bit-identical
        assert bool(optim.has_updated(s1)) == bool(ref.has_updated(s2)) == ((i + 1) % k == 0)
        assert int(s1.gradient_step) == int(s2.gradient_step)


def test_four_micro_steps_give_mean_update():
    opt = optim.accumulate(optax.sgd(1.0), 4)
    state = opt.init(jnp.zeros(()))
    updates = []
    for g in (1.0, 2.0, 3.0, 4.0):
        assert bool(optim.is_update_step(state, 4)) == (g == 4.0)
        u, state = opt.update(jnp.float32(g), state)
        updates.append(float(u))
    assert updates == [0.0, 0.0, 0.0, -2.5]
    assert bool(optim.has_updated(state)) and int(state.mini_step) == 0
    assert float(state.acc_grads) == 0.0
    opt = optim.accumulate(optax.sgd(1.0), 4, reduction="sum")
    state = opt.init(jnp.zeros(()))
    for g in (1.0, 2.0, 3.0, 4.0):
        u, state = opt.update(jnp.float32(g), state)
    assert float(u) == -10.0


def test_inner_state_advances_once_per_update():
    sched = optax.piecewise_constant_schedule(1.0, {1: 0.5})
    opt = optim.accumulate(optax.chain(optim.adam(0.01), optax.scale_by_schedule(sched)), 4)
    params = jnp.zeros(3)
    state = opt.init(params)
    step = jax.jit(opt.update)
    for i in range(8):
        u, state = step(jnp.ones(3), state, params)
        real_updates = (i + 1) // 4
        assert int(state.inner_state[0].count) == real_updates
        assert int(state.gradient_step) == real_updates
    assert state.acc_grads.dtype == jnp.float32


def test_accumulator_dtype_follows_params():
    opt = optim.accumulate(optax.sgd(0.1), 2)
    assert opt.init(jnp.zeros(2, jnp.bfloat16)).acc_grads.dtype == jnp.bfloat16
    opt = optim.accumulate(optax.sgd(0.1), 2, acc_dtype=jnp.float32)
    assert opt.init(jnp.zeros(2, jnp.bfloat16)).acc_grads.dtype == jnp.float32


# ----------------------------------------------------------------------------- exactness


def _mlp_problem(dtype, n=16, seed=0):
    r = np.random.default_rng(seed)
    params = {
        "w1": r.normal(size=(3, 8)) / np.sqrt(3),
        "b1": r.normal(size=(8,)) * 0.1,
        "w2": r.normal(size=(8, 2)) / np.sqrt(8),
        "b2": np.zeros(2),
    }
    params = jax.tree.map(lambda x: jnp.asarray(x, dtype), params)
    batches = {  # 3 batches of n samples
        "x": jnp.asarray(r.normal(size=(3, n, 3)), dtype),
        "y": jnp.asarray(r.normal(size=(3, n, 2)), dtype),
    }
    return params, batches


def _grad_fn(reduction):
    def loss_fn(p, batch):
        h = jnp.tanh(batch["x"] @ p["w1"] + p["b1"])
        return losses.mean_squared_error(h @ p["w2"] + p["b2"], batch["y"], reduction)

    return jax.value_and_grad(loss_fn)


def _train(params, opt, grad_fn, batches, k=1, reduction="mean", form="big"):
    """Weights after a scan over ``batches`` (stacked on a leading axis); jit the caller."""
    if form == "in_step":
        grad_fn = optim.accumulate_in_step(grad_fn, k, reduction=reduction)
    elif form == "multistep":
        opt = optim.accumulate(opt, k, reduction=reduction)
        # One optimizer call per micro-batch, in order.
        batches = jax.tree.map(lambda x: x.reshape((-1, x.shape[1] // k) + x.shape[2:]), batches)

    def body(carry, batch):
        params, state = carry
        _, g = grad_fn(params, batch)
        u, state = opt.update(g, state, params)
        return (optax.apply_updates(params, u), state), None

    (params, _), _ = jax.lax.scan(body, (params, opt.init(params)), batches)
    return params


_CASES = {  # name: (loss reduction, accumulation reduction, optimizer)
    "mean-sgd": ("sum_over_batch_size", "mean", lambda: optax.sgd(0.1)),
    "mean-adam": ("sum_over_batch_size", "mean", lambda: optim.adam(0.01)),
    "sum-sgd": ("sum", "sum", lambda: optax.sgd(0.01)),
    "sum-adam": ("sum", "sum", lambda: optim.adam(0.01)),
}


def _check_exact(dtype, tol, cases):
    params, batches = _mlp_problem(dtype)

    @jax.jit  # one compilation for every case and form
    def run_all(params, batches):
        out = {}
        for name in cases:
            loss_red, acc_red, make_opt = _CASES[name]
            grad_fn = _grad_fn(loss_red)
            out[name, "big"] = _train(params, make_opt(), grad_fn, batches)
            for form in ("in_step", "multistep"):
                out[name, form] = _train(params, make_opt(), grad_fn, batches, 4, acc_red, form)
        return out

    out = run_all(params, batches)
    for name in cases:
        for form in ("in_step", "multistep"):
            for a, b in zip(jax.tree.leaves(out[name, form]), jax.tree.leaves(out[name, "big"])):
                np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=f"{name} {form}")
                assert a.dtype == dtype


def test_micro_batches_equal_big_batch_float32():
    _check_exact(jnp.float32, 1e-6, list(_CASES))


def test_micro_batches_equal_big_batch_float64(x64):
    _check_exact(jnp.float64, 1e-12, ["mean-adam", "sum-sgd"])  # both kinds, less compiling


def test_wrong_reduction_is_not_equivalent():
    # With a ``sum`` loss, averaging micro-batch gradients would be k times too small.
    grad_fn = _grad_fn("sum")
    params, batches = _mlp_problem(jnp.float32)
    batch = jax.tree.map(lambda x: x[0], batches)

    @jax.jit
    def grads(params, batch):
        return [
            grad_fn(params, batch)[1],
            optim.accumulate_in_step(grad_fn, 4, reduction="sum")(params, batch)[1],
            optim.accumulate_in_step(grad_fn, 4, reduction="mean")(params, batch)[1],
        ]

    big, summed, mean = grads(params, batch)
    np.testing.assert_allclose(summed["w1"], big["w1"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean["w1"] * 4, big["w1"], rtol=1e-5, atol=1e-6)


def test_in_step_loss_and_aux():
    def grad_fn(p, batch, scale):
        loss = jnp.mean(batch["x"]) * p * scale
        return (loss, {"n": batch["x"].shape[0] + jnp.zeros((), jnp.int32)}), scale * p

    x = jnp.arange(8.0)
    fn = jax.jit(optim.accumulate_in_step(grad_fn, 4, has_aux=True))
    (loss, aux), g = fn(jnp.float32(2.0), {"x": x}, 3.0)
    np.testing.assert_allclose(loss, jnp.mean(x) * 6.0)
    np.testing.assert_array_equal(aux["n"], [2, 2, 2, 2])
    np.testing.assert_allclose(g, 6.0)


def test_split_batch_order_and_errors():
    batch = {"x": jnp.arange(6), "y": jnp.arange(12).reshape(6, 2)}
    micro = optim.split_batch(batch, 3)
    np.testing.assert_array_equal(micro["x"], [[0, 1], [2, 3], [4, 5]])
    assert micro["y"].shape == (3, 2, 2)
    with pytest.raises(ValueError, match="not divisible into 4"):
        optim.split_batch(batch, 4)
    with pytest.raises(ValueError, match="common leading"):
        optim.split_batch({"x": jnp.zeros(4), "y": jnp.zeros(6)}, 2)
    with pytest.raises(ValueError, match="int >= 1"):
        optim.accumulate(optax.sgd(0.1), 0)
    with pytest.raises(ValueError, match="'mean' or 'sum'"):
        optim.accumulate_in_step(lambda p, b: (0.0, p), 2, reduction="avg")
