"""Optimizers: TF-placement Adam against transcriptions of its formula, factories, registry."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from circle_jax import optim

F32 = np.float32


def _problem(n=32, steps=10, seed=0):
    r = np.random.default_rng(seed)
    w0 = r.normal(size=(n,)).astype(F32)
    grads = [r.normal(size=(n,)).astype(F32) for _ in range(steps)]
    return w0, grads


def _run(opt, w0, grads, jit=False):
    """Weights after each step of ``opt`` on a gradient sequence (op by op unless ``jit``)."""

    def step(w, state, g):
        u, state = opt.update(g, state, w)
        return optax.apply_updates(w, u), state

    step = jax.jit(step) if jit else step
    w, state, out = jnp.asarray(w0), opt.init(jnp.asarray(w0)), []
    for g in grads:
        w, state = step(w, state, jnp.asarray(g))
        out.append(np.asarray(w))
    return out


def _adam_tf_numpy(w0, grads, lr, b1=0.9, b2=0.999, eps=1e-7, dtype=np.float64):
    """The TF/onert Adam formula, written out in ``dtype``."""
    c = np.dtype(dtype).type
    w, m, v, out = w0.astype(dtype), np.zeros_like(w0, dtype), np.zeros_like(w0, dtype), []
    one, b1, b2, eps, lr = c(1), c(b1), c(b2), c(eps), c(lr)
    for t, g in enumerate(grads, 1):
        g = g.astype(dtype)
        alpha = lr * np.sqrt(one - b2 ** c(t)) / (one - b1 ** c(t))
        m = m + (g - m) * (one - b1)
        v = v + (g * g - v) * (one - b2)
        w = w - alpha * m / (np.sqrt(v) + eps)
        out.append(w)
    return out


def _ulps(a, b):
    return int(np.abs(a.astype(F32).view(np.int32) - b.astype(F32).view(np.int32)).max())


# ----------------------------------------------------------------------------- Adam (tf)


def test_adam_tf_eager_is_bit_exact_float32_formula():
    # Op by op (no fusion) every float32 operation rounds as the formula says.
    w0, grads = _problem()
    with jax.disable_jit():
        got = _run(optim.adam(0.01), w0, grads)
    want = _adam_tf_numpy(w0, grads, 0.01, dtype=np.float32)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_adam_tf_jitted_within_ulps_and_float64():
    # XLA contracts m + (g - m) * c into a fused multiply-add: <= 4 ulp from the unfused
    # float32 formula after 10 steps (1 ulp measured); 1e-6 absolute (~8 ulp at |w| ~ 1)
    # from the float64 transcription.
    w0, grads = _problem()
    got = _run(optim.adam(0.01), w0, grads, jit=True)
    want32 = _adam_tf_numpy(w0, grads, 0.01, dtype=np.float32)
    want64 = _adam_tf_numpy(w0, grads, 0.01, dtype=np.float64)
    for g, w32, w64 in zip(got, want32, want64):
        assert _ulps(g, w32) <= 4
        np.testing.assert_allclose(g, w64, rtol=0, atol=1e-6)


def test_adam_tf_state_and_placements_differ():
    w0, grads = _problem(steps=3)
    opt = optim.adam(0.01)
    state = opt.init(jnp.asarray(w0))
    assert isinstance(state, optim.AdamTFState) and state.count.dtype == jnp.int32
    _, state = opt.update(jnp.asarray(grads[0]), state)
    assert int(state.count) == 1
    # Tiny gradients make eps matter: the three placements give three different steps.
    tiny = [g * F32(1e-6) for g in grads[:2]]
    ends = {p: _run(optim.adam(0.01, eps_placement=p), w0, tiny)[-1] for p in optim.EPS_PLACEMENTS}
    assert not np.allclose(ends["tf"], ends["optax"], rtol=0, atol=1e-7)
    assert not np.allclose(ends["tf"], ends["onert_micro"], rtol=0, atol=1e-7)


def test_adam_optax_placement_is_optax_adam():
    w0, grads = _problem()
    got = _run(optim.adam(0.01, eps=1e-7, eps_placement="optax"), w0, grads)
    want = _run(optax.adam(0.01, eps=1e-7), w0, grads)
    np.testing.assert_array_equal(got[-1], want[-1])


def test_adam_onert_micro_eps_inside_sqrt():
    w0, grads = _problem()
    got = _run(optim.get_optimizer("adam_onert_micro", 0.01), w0, grads)
    w, m, v = w0.astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, 1):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
        m_hat, v_hat = m / (1 - 0.9**t), v / (1 - 0.999**t)
        w = w - 0.01 * m_hat / np.sqrt(v_hat + 1e-7)
    np.testing.assert_allclose(got[-1], w, rtol=0, atol=1e-6)


def test_adam_schedule_sees_update_count():
    w0, grads = _problem(steps=4)
    sched = optim.schedule("piecewise", init_value=0.1, boundaries_and_scales={2: 0.1})
    got = _run(optim.adam(sched), w0, grads)
    # m and v do not depend on lr, so step t moves w by lr_t times its lr=1 move.
    traj = [w0.astype(np.float64)] + _adam_tf_numpy(w0, grads, 1.0)
    want = w0 + sum(lr * (traj[t + 1] - traj[t]) for t, lr in enumerate([0.1, 0.1, 0.01, 0.01]))
    np.testing.assert_allclose(got[-1], want, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- others


def test_sgd_is_onert_formula_bitwise():
    w0, grads = _problem(steps=3)
    with jax.disable_jit():
        got = _run(optim.sgd(0.05), w0, grads)
    jitted = _run(optim.sgd(0.05), w0, grads, jit=True)
    w = w0.copy()
    for g in grads:
        w = w - F32(0.05) * g
    np.testing.assert_array_equal(got[-1], w)
    assert _ulps(jitted[-1], w) <= 2  # XLA fuses w + (-lr) * g into one FMA


def test_sgd_momentum_and_nesterov_are_optax():
    w0, grads = _problem(steps=4)
    for name, ref in [
        ("momentum", optax.sgd(0.05, momentum=0.9)),
        ("nesterov", optax.sgd(0.05, momentum=0.9, nesterov=True)),
    ]:
        got = _run(optim.get_optimizer(name, 0.05), w0, grads)
        np.testing.assert_array_equal(got[-1], _run(ref, w0, grads)[-1])
    with pytest.raises(ValueError, match="nesterov"):
        optim.sgd(0.1, nesterov=True)


def test_adamw_tf_is_adam_plus_decoupled_decay():
    w0, grads = _problem(steps=1)
    (got,) = _run(optim.adamw(0.01, weight_decay=0.004), w0, grads)
    (adam_only,) = _adam_tf_numpy(w0, grads, 0.01)
    np.testing.assert_allclose(got, adam_only - 0.01 * 0.004 * w0, rtol=0, atol=1e-6)
    got = _run(optim.adamw(0.01, weight_decay=0.1, eps_placement="optax"), w0, grads)
    want = _run(optax.adamw(0.01, eps=1e-7, weight_decay=0.1), w0, grads)
    np.testing.assert_array_equal(got[-1], want[-1])


def test_adamw_mask():
    params = {"w": jnp.ones(3), "b": jnp.ones(3)}
    opt = optim.adamw(0.1, weight_decay=0.5, mask={"w": True, "b": False})
    state = opt.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    u, _ = opt.update(zeros, state, params)
    np.testing.assert_allclose(u["w"], -0.05, rtol=1e-6)
    np.testing.assert_array_equal(u["b"], 0.0)


def test_rmsprop_keras_formula():
    w0, grads = _problem(steps=5)
    got = _run(optim.rmsprop(0.01), w0, grads)
    w, v = w0.astype(np.float64), 0.0
    for g in grads:
        v = 0.9 * v + 0.1 * g.astype(np.float64) ** 2
        w = w - 0.01 * g / np.sqrt(v + 1e-7)
    np.testing.assert_allclose(got[-1], w, rtol=0, atol=1e-6)


def test_get_optimizer_codes_and_names():
    w0, grads = _problem(steps=2)
    assert optim.optimizer_name(1) == "sgd" and optim.optimizer_name(2) == "adam"
    assert optim.optimizer_name("Adam") == "adam"
    np.testing.assert_array_equal(
        _run(optim.get_optimizer(2, 0.01), w0, grads)[-1],
        _run(optim.adam(0.01), w0, grads)[-1],
    )
    w = jnp.asarray(w0)
    for name in optim.OPTIMIZERS:  # every name builds and updates (shapes only: no compile)
        opt = optim.get_optimizer(name, optim.schedule("constant", value=0.01))
        u, _ = jax.eval_shape(opt.update, w, opt.init(w), w)
        assert u.shape == w.shape and u.dtype == w.dtype


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: optim.get_optimizer("lamb", 0.1), "unknown optimizer 'lamb'"),
        (lambda: optim.get_optimizer(0, 0.1), "unknown onert optimizer code 0"),
        (lambda: optim.get_optimizer("sgd", 0.1, beta=2),
         "optimizer 'sgd' .* does not take 'beta'; it takes --momentum"),
        (lambda: optim.get_optimizer("sgd", 0.1, b1=0.8),  # by its flag, not its keyword
         r"optimizer 'sgd' \(keras numerics\) does not take --beta1 \(only adam, .*adamw "
         r"take it\); it takes --momentum$"),
        (lambda: optim.get_optimizer("sgd", float("nan")),
         r"learning_rate must be a finite number >= 0, got nan"),
        (lambda: optim.get_optimizer(1, -0.01), r"learning_rate must be .* got -0.01"),
        (lambda: optim.get_optimizer("adam", 0.1, b2=1.0),
         r"'adam': b2 \(--beta2\) must be in \[0, 1\), got 1.0"),
        (lambda: optim.get_optimizer("adam", 0.1, eps=float("inf")),
         r"eps \(--epsilon\) must be a finite number > 0, got inf"),
        (lambda: optim.get_optimizer("rmsprop", 0.1, eps=0.0),
         r"eps \(--epsilon\) must be a finite number > 0, got 0.0"),
        (lambda: optim.get_optimizer("adam", 0.1, eps=0.0, family="torch"),
         r"eps \(--epsilon\) must be a finite number > 0, got 0.0"),
        (lambda: optim.get_optimizer("momentum", 0.1, momentum=1.5),
         r"momentum must be in \[0, 1\], got 1.5"),
        (lambda: optim.get_optimizer("sgd", 0.1, momentum=0.9, dampening=2.0, family="torch"),
         r"dampening must be in \[0, 1\], got 2.0"),
        (lambda: optim.get_optimizer("rmsprop", 0.1, rho=1.0), r"rho must be in \[0, 1\)"),
        (lambda: optim.get_optimizer("sgd", 0.1, momentum=-0.9, family="torch"),
         r"momentum must be in \[0, 1\], got -0.9"),
        (lambda: optim.adam(0.1, eps_placement="torch"), "unknown eps_placement"),
        (lambda: optim.schedule("step"), "unknown schedule"),
        (lambda: optim.schedule("cosine", init=1), "bad arguments for schedule"),
    ],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_keras_sparse_adam_is_an_optax_transformation():
    """`keras_sparse_adam` keeps its own state; without ``row_squares`` (or with None
    leaves) it steps exactly as `adam_tf` (the same arithmetic: bit for bit, jitted); where
    squares are given, ``v`` takes them instead of ``g*g`` (``m`` still the gradient's
    moment), so the weight moves otherwise; it runs inside ``optax.chain``, which hands the
    extra argument on; a placement other than TF's is refused."""
    w0, grads = _problem(steps=4)
    sparse = optim.keras_sparse_adam(0.01)
    assert isinstance(sparse.init(jnp.asarray(w0)), optim.SparseAdamState)
    for got, want in zip(_run(sparse, w0, grads, jit=True),
                         _run(optim.adam_tf(0.01), w0, grads, jit=True)):
        np.testing.assert_array_equal(got, want)
    params = {"table": jnp.asarray(w0), "bias": jnp.asarray(w0[:3])}
    g = {"table": jnp.asarray(grads[0]), "bias": jnp.asarray(grads[0][:3])}
    squares = {"table": 3 * g["table"] ** 2, "bias": None}  # as if 3 occurrences of g/sqrt(3)
    chained = optax.chain(optax.scale(1.0), sparse)
    u, state = jax.jit(lambda g, s, p, sq: chained.update(g, s, p, row_squares=sq))(
        g, chained.init(params), params, squares)
    dense_u, dense = optim.adam_tf(0.01).update(g, optim.adam_tf(0.01).init(params), params)
    np.testing.assert_array_equal(u["bias"], dense_u["bias"])
    np.testing.assert_array_equal(state[1].mu["table"], dense.mu["table"])
    np.testing.assert_allclose(state[1].nu["table"], 3 * dense.nu["table"], rtol=1e-6)
    assert not np.allclose(u["table"], dense_u["table"], rtol=1e-3)
    with pytest.raises(ValueError, match="sparse-gradient Adam"):
        optim.adam(0.01, eps_placement="optax", sparse_rows=True)
