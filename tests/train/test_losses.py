"""Loss values against hand-written numpy, float64 gradient checks, names and codes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from circle_jax import losses as L


def _rng(seed=0):
    return np.random.default_rng(seed)


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------- MSE


def test_mse_matches_numpy_both_reductions():
    r = _rng()
    p = r.normal(size=(5, 3, 4)).astype(np.float32)
    t = r.normal(size=(5, 3, 4)).astype(np.float32)
    per_sample = ((p.astype(np.float64) - t) ** 2).reshape(5, -1).mean(1)
    np.testing.assert_allclose(L.mean_squared_error(p, t), per_sample.mean(), rtol=1e-6)
    np.testing.assert_allclose(L.mean_squared_error(p, t, "sum"), per_sample.sum(), rtol=1e-6)
    np.testing.assert_allclose(L.mean_squared_error(p, t, 2), per_sample.sum(), rtol=1e-6)
    np.testing.assert_allclose(L.mean_squared_error(p, t, "none"), per_sample, rtol=1e-6)


def test_mse_rank1_and_shape_error():
    p, t = np.array([1.0, 2.0]), np.array([0.0, 0.0])
    assert float(L.mean_squared_error(p, t)) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="shape"):
        L.mean_squared_error(np.zeros((2, 3)), np.zeros((2, 4)))


def test_mse_half_inputs_computed_in_float32():
    p = jnp.full((2, 2), 300.0, jnp.float16)  # 300**2 overflows float16
    out = L.mean_squared_error(p, jnp.zeros_like(p))
    assert out.dtype == jnp.float32 and float(out) == 90000.0


# ----------------------------------------------------------------------------- CCE


def test_cce_keras_renormalizes_then_clips():
    t = np.eye(3, dtype=np.float32)
    p = np.array([[0.9, 0.05, 0.05], [0.5, 0.89, 0.6], [0.05, 0.01, 0.94]], np.float32)
    q = p / p.sum(-1, keepdims=True)
    want = -np.log(np.clip(q, 1e-7, 1 - 1e-7))[np.arange(3), np.arange(3)]
    np.testing.assert_allclose(L.categorical_crossentropy(p, t, reduction="none"), want, 1e-6)
    np.testing.assert_allclose(L.categorical_crossentropy(p, t), want.mean(), rtol=1e-6)
    np.testing.assert_allclose(L.categorical_crossentropy(p, t, reduction="sum"), want.sum(), 1e-6)


def test_cce_onert_floor_no_renormalization():
    t = np.array([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], np.float32)
    p = np.array([[0.2, 0.3, 0.1], [0.1, 0.6, 0.3]], np.float32)  # row 0 sums to 0.6
    want = -(t * np.log(np.maximum(p.astype(np.float64), 1e-20))).sum(-1)
    got = L.categorical_crossentropy(p, t, clip="onert", reduction="none")
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize(
    "clip, want",
    [
        ("keras", -np.log(np.float32(1e-7))),
        ("onert", -np.log(1e-20)),
        (("floor", 1e-20), -np.log(1e-20)),
        ((1e-3, None), -np.log(1e-3)),
        (L.ProbabilityClip(1e-5, 0.9, normalize=True), -np.log(1e-5)),
    ],
)
def test_cce_zero_probability_is_finite_per_convention(clip, want):
    p = np.array([[0.0, 1.0]], np.float32)
    t = np.array([[1.0, 0.0]], np.float32)
    got = float(L.categorical_crossentropy(p, t, clip=clip))
    assert np.isfinite(got)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    g = jax.grad(lambda q: L.categorical_crossentropy(q, t, clip=clip))(p)
    assert np.all(np.isfinite(g))


def test_cce_perfect_prediction_keras_upper_clip():
    t = np.array([[0.0, 1.0]], np.float32)
    got = float(L.categorical_crossentropy(t, t))
    np.testing.assert_allclose(got, -np.log(np.float32(1 - 1e-7)), rtol=1e-6)
    assert float(L.categorical_crossentropy(t, t, clip="onert")) == 0.0


def test_cce_from_logits_stable():
    z = np.array([[1000.0, 0.0, -1000.0], [1.0, 2.0, 3.0]], np.float32)
    t = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], np.float32)
    got = L.categorical_crossentropy(z, t, from_logits=True, reduction="none")
    want = np.array([1000.0, -np.log(_softmax(z[1].astype(np.float64))[2])])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_cce_spatial_positions_averaged_per_sample():
    r = _rng(1)
    z = r.normal(size=(2, 4, 5, 3))
    t = _softmax(r.normal(size=(2, 4, 5, 3)))
    per_position = -(t * np.log(_softmax(z))).sum(-1)
    got = L.categorical_crossentropy(
        z.astype(np.float32), t.astype(np.float32), from_logits=True, reduction="none"
    )
    np.testing.assert_allclose(got, per_position.reshape(2, -1).mean(1), rtol=1e-5)


def test_sparse_equals_one_hot():
    r = _rng(2)
    z = r.normal(size=(6, 4)).astype(np.float32)
    labels = np.array([0, 3, 1, 2, 2, 0])
    one_hot = np.eye(4, dtype=np.float32)[labels]
    p = _softmax(z).astype(np.float32)
    for kw in ({"from_logits": True}, {"clip": "keras"}, {"clip": "onert"}):
        x = z if kw.get("from_logits") else p
        for red in ("sum_over_batch_size", "sum"):
            want = L.categorical_crossentropy(x, one_hot, reduction=red, **kw)
            got = L.sparse_categorical_crossentropy(x, labels, reduction=red, **kw)
            got2 = L.sparse_categorical_crossentropy(x, labels[:, None], reduction=red, **kw)
            np.testing.assert_allclose(got, want, rtol=1e-6)
            np.testing.assert_allclose(got2, want, rtol=1e-6)
    with pytest.raises(ValueError, match="labels shape"):
        L.sparse_categorical_crossentropy(p, labels[:3])


# ----------------------------------------------------------------------------- gradients


def test_gradients_float64(x64):
    # One jitted function of independent inputs checks every loss and reduction at once:
    # the gradient w.r.t. each input is one loss's gradient. Probabilities lie well inside
    # both clips; eps=1e-6 keeps the finite-difference error of log() small.
    r = _rng(3)
    t = jnp.asarray(r.normal(size=(4, 3)))
    soft_t = jnp.asarray(_softmax(r.normal(size=(4, 3))))
    labels = jnp.array([0, 2, 1, 1])
    reductions = ("sum_over_batch_size", "sum")
    unbounded = [jnp.asarray(r.normal(size=(4, 3))) for _ in range(4)]
    probs = [jnp.asarray(_softmax(r.normal(size=(4, 3)))) for _ in range(8)]
    assert t.dtype == jnp.float64

    def total(unbounded, probs):
        out, i = 0.0, 0
        for j, red in enumerate(reductions):
            out += L.mean_squared_error(unbounded[2 * j], t, red)
            out += L.categorical_crossentropy(
                unbounded[2 * j + 1], soft_t, from_logits=True, reduction=red
            )
            for clip in ("keras", "onert"):
                out += L.categorical_crossentropy(probs[i], soft_t, clip=clip, reduction=red)
                out += L.sparse_categorical_crossentropy(
                    probs[i + 1], labels, clip=clip, reduction=red
                )
                i += 2
        return out

    check_grads(jax.jit(total), (unbounded, probs), order=1, modes=["rev"], eps=1e-6)


def test_logits_gradient_is_softmax_minus_target(x64):
    r = _rng(4)
    z = r.normal(size=(3, 5))
    t = _softmax(r.normal(size=(3, 5)))
    g = jax.grad(lambda a: L.categorical_crossentropy(a, t, from_logits=True, reduction="sum"))(z)
    np.testing.assert_allclose(g, _softmax(z) - t, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- registry


def test_get_loss_names_and_codes():
    r = _rng(5)
    p = _softmax(r.normal(size=(4, 3))).astype(np.float32)
    t = np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]
    assert L.loss_name("MSE") == L.loss_name(1) == "mean_squared_error"
    assert L.loss_name("categorical crossentropy") == L.loss_name(2) == "categorical_crossentropy"
    assert L.loss_name("sparse_cce") == "sparse_categorical_crossentropy"
    np.testing.assert_allclose(L.get_loss(1)(p, t), L.mean_squared_error(p, t))
    np.testing.assert_allclose(
        L.get_loss(2, reduction=2)(p, t),
        L.categorical_crossentropy(p, t, clip="onert", reduction="sum"),
    )
    np.testing.assert_allclose(
        L.get_loss("cce", reduction="sum over batch size")(p, t), L.categorical_crossentropy(p, t)
    )
    assert L.get_reduction(1) is L.Reduction.SUM_OVER_BATCH_SIZE
    assert L.get_reduction("Sum") is L.Reduction.SUM


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: L.get_loss("hinge"), "unknown loss 'hinge'"),
        (lambda: L.get_loss(3), "unknown onert loss code 3"),
        (lambda: L.get_loss("mse", from_logits=True), "bad options for loss"),
        (lambda: L.get_reduction("mean_of_sum"), "unknown loss reduction"),
        (lambda: L.get_reduction(0), "unknown onert loss reduction code 0"),
        (lambda: L.get_clip("tf"), "unknown probability clip"),
    ],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_jit_works():
    p = np.full((2, 3), 1 / 3, np.float32)
    t = np.eye(3, dtype=np.float32)[[0, 1]]
    fn = jax.jit(L.get_loss("cce"))
    np.testing.assert_allclose(fn(p, t), np.log(3.0), rtol=1e-6)


# ----------------------------------------------------------------------------- sequences

def _numpy_token_cce(logp: np.ndarray, labels: np.ndarray, ignore: int | None) -> dict:
    """float64 reference: per-token -log p(label); the three reductions over counted tokens."""
    n, t, _ = logp.shape
    keep = np.ones((n, t), bool) if ignore is None else labels != ignore
    safe = np.where(keep, labels, 0)
    per_token = -np.take_along_axis(logp, safe[..., None], -1)[..., 0] * keep
    mean = per_token.sum() / keep.sum()
    per_sample = per_token.sum(1) / np.maximum(keep.sum(1), 1)
    return {"sum_over_batch_size": mean, "sum": mean * n, "none": per_sample}


def _clipped_log(p: np.ndarray, clip: str) -> np.ndarray:
    if clip == "keras":
        p = np.clip(p / p.sum(-1, keepdims=True), 1e-7, 1 - 1e-7)
    else:  # onert: max(p, 1e-20)
        p = np.maximum(p, 1e-20)
    return np.log(p)


@pytest.mark.parametrize("ignore", [None, -100, 0])
@pytest.mark.parametrize("variant", ["logits", "keras", "onert"])
@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "sum", "none"])
def test_sequence_cce_sparse_and_dense_match_numpy(variant, ignore, reduction):
    """[N, T, V] predictions against [N, T] labels (sparse) or [N, T, V] one-hot (dense):
    the mean over tokens, padding (``ignore``) left out; every clip/logits variant the
    numerics profiles use. Tolerance 1e-5 relative: float32 log/softmax against float64."""
    r = _rng(3)
    z = r.normal(size=(3, 5, 7)).astype(np.float32)
    labels = r.integers(0, 7, (3, 5)).astype(np.int32)
    if ignore is not None:
        labels[0, 3:] = ignore  # padding at the end of sample 0
        labels[2, :] = ignore if ignore < 0 else labels[2, :]  # a sample of padding only
    pred = z if variant == "logits" else _softmax(z.astype(np.float64)).astype(np.float32)
    logp = (z - np.log(np.exp(z.astype(np.float64)).sum(-1, keepdims=True))
            if variant == "logits" else _clipped_log(pred.astype(np.float64), variant))
    want = _numpy_token_cce(logp, labels, ignore)[reduction]
    kw = dict(from_logits=variant == "logits", reduction=reduction,
              **({} if variant == "logits" else {"clip": variant}))
    got = L.sparse_categorical_crossentropy(pred, labels, ignore_index=ignore, **kw)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
    if ignore is None:  # dense targets: the same tokens, one-hot
        dense = np.eye(7, dtype=np.float32)[labels]
        got = L.categorical_crossentropy(pred, dense, **kw)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_ignored_tokens_get_no_gradient(x64):
    z = _rng(4).normal(size=(2, 4, 5))
    labels = np.array([[1, 2, -1, -1], [0, 4, 3, -1]])

    def loss(z):
        return L.sparse_categorical_crossentropy(z, labels, from_logits=True, ignore_index=-1)

    g = np.asarray(jax.grad(loss)(jnp.asarray(z)))
    assert np.all(g[labels == -1] == 0) and np.all(np.abs(g[labels != -1]).sum(-1) > 0)
    check_grads(loss, (jnp.asarray(z),), order=1, modes=["rev"], eps=1e-6)
