"""A sweep over every model the tests know (`tests.model_zoo.all_models`: each file of
../shared/models, the Keras conversions, the bundled example, the toy models): it loads;
it matches LiteRT at its declared shape; a batch of 3 gives what 3 single-sample runs give
(and the last sample what LiteRT gives on it); float64 gradients of a sum-loss at batch 2
(default lowering) are the sums of the per-sample gradients of the reference lowering
(`circle_jax.ops`), and its float64 outputs the reference lowering's, which checks batching
and the fast kernels' values and derivatives at once (``tests/ops/test_lowering.py`` compares
the lowerings' outputs on the models this test does not run); one
epoch at batch 4 trains under the float16 policy at loss scale 1 without a skipped step (a
model dropped into ../shared/models is covered without writing a test). A model that cannot
do one of these must refuse it in one line naming the reason; the refusals of known models
are pinned in ``REFUSED``.

Tiers: the float64 gradients of every model, and the batch-3 run and float16 epoch of a
large model (`model_zoo.is_large`: 30 operators or more), are marked ``slow`` (``pytest -m
slow``; CI runs both tiers): they are most of the sweep's compile time.

Tolerances: a batched graph sums its matmuls and convolutions in another order than a
single-sample one, so float32 outputs differ by rounding (measured at most 1.1e-5 on outputs
of magnitude 38, the face detector's scores): rtol 1e-5 and atol 1e-5 times the output's
scale (max |output|, at least 1). LiteRT: rtol 1e-4, atol 1e-4 times the scale, as in
LiteRT's reference kernels (float32 through tens of layers rounds differently from XLA).
float64 gradients and outputs: 1e-9 of each param's largest gradient and of each output's
scale (the two lowerings and the two batch sizes differ by summation order only; DeepLab
v3's earliest layers' gradients differ by 0.4% of their largest value in float32 and by
7e-15 in float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.formats.reader import read_model
from circle_jax.formats.writer import export_model
from tests import model_zoo
from tests.conformance import run_litert

MODELS = model_zoo.all_models()


def _slow_if_large(names: list[str]) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if model_zoo.is_large(n) else n for n in names]

REFUSED_BATCH = "runs only at its declared batch"

# What known models refuse, and the reason their one-line refusal must name.
REFUSED = {
    # inputs [3, 4, 4, 1] -> [48]: SPLIT on axis 0 makes the declared 3 part of one sample
    "aeq_branching_conv_fc.tflite": REFUSED_BATCH,
    # a [5360] waveform RESHAPEd to [67, 80]: no batch axis at all
    "tflite_support_audio_classifier_float.tflite": REFUSED_BATCH,
    # a scalar trip count and a [2, 3] state: no batch axis
    "one_vscode_while_000.circle": "no batch axis",
    # Keras conversions with batch 16 fixed (scripts/make_keras_models.py): the LSTM's
    # TRANSPOSE puts time first
    "keras:lstm_b16.tflite": REFUSED_BATCH,
}

# What known models refuse to train on (a training refusal of a model that runs at batch 3).
TRAIN_REFUSED = {
    **REFUSED,
    # a BATCH_MATMUL of its two inputs: no weight at all, nothing to train
    "aeq_bmm.tflite": "the model has no trainable weights",
}

# The float16 policy (float32 masters, the policy's float32 operators) at loss scale 1.
FLOAT16 = dict(precision="p=f32,c=f16,o=f32", loss_scale=1.0)

# Runs eagerly only: its WHILE needs concrete trip counts.
EAGER = frozenset({"one_vscode_while_000.circle"})

N = 3


def _model(name: str) -> cj.Model:
    m = model_zoo.load(name)
    if isinstance(m, cj.CircleJaxError):
        pytest.fail(f"{name} is refused at load: {m}")
    return m


def _assert_refusal(error: BaseException, name: str, refused: dict = REFUSED) -> None:
    """A documented refusal: a circle-jax error of one line naming its reason."""
    message = str(error)
    assert isinstance(error, cj.CircleJaxError), f"{name}: {type(error).__name__}: {message}"
    assert message and "\n" not in message and len(message) < 600, message
    assert name in refused, f"{name} is refused, undocumented: {message}"
    assert refused[name] in message, message


@pytest.mark.parametrize("name", MODELS)
def test_loads_or_refuses_in_one_line(name: str) -> None:
    m = model_zoo.load(name)
    if isinstance(m, cj.CircleJaxError):
        _assert_refusal(m, name)
    else:
        assert m.inputs and m.outputs


@pytest.mark.parametrize("name", _slow_if_large(MODELS))
def test_a_batch_of_3_is_3_single_sample_runs(name: str) -> None:
    """Batch rows against single-sample runs, and the last sample against LiteRT (a wrong
    batch shows in samples after the first)."""
    model = _model(name)
    if any(not s.shape for s in model.inputs):  # a scalar input: no axis to stack samples on
        assert model.batch_blocker == "its inputs share no leading (batch) dimension"
        return
    xs = model_zoo.inputs(model, name, N)
    apply = model.apply if name in EAGER else jax.jit(model.apply)
    try:
        batch = [np.asarray(o) for o in apply(model.params, *xs)]
        singles = [[np.asarray(o) for o in apply(model.params, *[x[i:i + 1] for x in xs])]
                   for i in range(N)]
    except cj.CircleJaxError as e:
        _assert_refusal(e, name)
        _assert_litert_at_the_declared_shape(model, name, apply)
        return
    assert name not in REFUSED, f"{name} runs at batch {N}: drop it from REFUSED"
    for k, out in enumerate(batch):
        want = np.concatenate([s[k] for s in singles])
        assert out.shape == want.shape, (k, out.shape, want.shape)
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * scale, err_msg=f"{k}")
    if all(s.shape[:1] == (1,) for s in model.inputs):
        _assert_litert(name, [x[-1:] for x in xs], singles[-1])
    else:
        _assert_litert_at_the_declared_shape(model, name, apply)


def _assert_litert_at_the_declared_shape(model: cj.Model, name: str, apply) -> None:
    feeds = model_zoo.inputs(model, name, None)
    _assert_litert(name, feeds, [np.asarray(o) for o in apply(model.params, *feeds)])


def _assert_litert(name: str, feeds: list[np.ndarray], got: list[np.ndarray]) -> None:
    """circle-jax's outputs ``got`` on ``feeds`` against LiteRT's (CIR0 rewritten as TFL3)."""
    if name in model_zoo.LITERT_CANNOT_RUN:
        return
    ir = read_model(model_zoo.file_bytes(name))
    tflite = export_model(ir, file_format="tflite") if ir.format == "circle" else ir.source
    want = run_litert(tflite, feeds)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype)
        scale = max(float(np.max(np.abs(w))), 1.0)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * scale,
                                   err_msg=f"output {k} vs LiteRT")


def _wide(tree: dict) -> dict:
    """Float leaves as float64 numpy arrays (converted on the host: no compile per shape)."""
    return {k: np.asarray(v, np.float64) if jnp.issubdtype(v.dtype, jnp.floating) else v
            for k, v in tree.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in MODELS if n not in REFUSED])
def test_float64_gradients_at_batch_2_are_sums_of_reference_per_sample_ones(name: str,
                                                                             x64) -> None:
    """The sum-loss weights every output by a fixed random tensor (a softmax's plain sum has
    a zero gradient); the batch's gradient (default lowering) must be the sum of the
    per-sample gradients of the reference lowering."""
    model, reference = _model(name), model_zoo.load(name, "reference")
    assert model.lowering.fast and not reference.lowering.fast
    n = 2
    xs = [np.asarray(x, np.float64) if x.dtype.kind == "f" else x
          for x in model_zoo.inputs(model, name, n)]
    outs = jax.eval_shape(model.apply, _wide(model.params), *xs)
    rng = np.random.default_rng(5)
    weights = [rng.standard_normal(o.shape) for o in outs]

    def grad(m: cj.Model) -> Callable:
        def loss(p, feeds, ws):
            outs = m.apply(p, *feeds)
            return sum(jnp.sum(o * w) for o, w in zip(outs, ws)
                       if jnp.issubdtype(o.dtype, jnp.floating)), outs
        return jax.jit(jax.grad(loss, has_aux=True))

    got, outs = grad(model)(_wide(model.params), xs, weights)
    single = grad(reference)
    parts = [single(_wide(reference.params), [x[i:i + 1] for x in xs],
                    [w[i:i + 1] for w in weights]) for i in range(n)]
    for k, out in enumerate(outs):  # the two lowerings' outputs, sample by sample
        want = np.concatenate([np.asarray(p[1][k]) for p in parts])
        scale = max(float(np.max(np.abs(want))), 1.0)
        np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-9 * scale, err_msg=f"{k}")
    assert got.keys() == parts[0][0].keys()
    for k, g in got.items():
        want = sum(np.asarray(p[0][k]) for p in parts)
        scale = float(np.max(np.abs(want))) or 1.0
        np.testing.assert_allclose(g, want, rtol=1e-9, atol=1e-9 * scale, err_msg=k)


def _float16_epoch(model: cj.Model, name: str, batch: int | None) -> tuple[dict, dict, int,
                                                                          float]:
    """Params before and after 2 steps under `FLOAT16` (at ``batch``; None: one step at the
    declared shapes, for a model that runs only there), skipped steps, the loss. MSE against
    zero targets shaped like output 0; Adam."""
    kw = dict(loss="mse", optimizer="adam", learning_rate=1e-4, **FLOAT16)
    if batch is None:
        xs = model_zoo.inputs(model, name, None)
        trainer = cj.Trainer(model, batch_size=xs[0].shape[0], **kw)
        state, frozen = trainer.init()
        out = jax.eval_shape(model.apply, model.params, *xs)[trainer.loss_output]
        new, m = jax.jit(trainer.train_step)(state, frozen, (tuple(map(jnp.asarray, xs)),
                                                              jnp.zeros(out.shape)))
        return state.params, new.params, int(m.skipped), float(m.loss)
    xs = model_zoo.inputs(model, name, 2 * batch)
    y = np.zeros((2 * batch, *model_zoo.output_shapes(model, name)[0]), np.float32)
    r = cj.fit(model, xs if len(xs) > 1 else xs[0], y, epochs=1, batch_size=batch, **kw)
    return model.params, r.params, r.history.skipped[0], r.history.loss[0]


@pytest.mark.parametrize("name", _slow_if_large(MODELS))
def test_one_float16_epoch_at_batch_4_trains_or_refuses(name: str) -> None:
    """2 steps at batch 4 (one at the declared shapes for a model that runs only there)
    under the float16 policy at loss scale 1: no step skipped (its float16 gradients are
    finite at scale 1, the floor a dynamic scale backs off to), the loss finite, every
    weight finite and one at least changed. Adam: its first steps move each weight by about
    the learning rate whatever the gradient's scale (the hand model's outputs reach 230)."""
    model = _model(name)
    try:
        before, after, skipped, loss = _float16_epoch(model, name, 4)
    except cj.CircleJaxError as e:
        _assert_refusal(e, name, TRAIN_REFUSED)
        if TRAIN_REFUSED[name] != REFUSED_BATCH:
            return
        before, after, skipped, loss = _float16_epoch(model, name, None)
    else:
        assert name not in TRAIN_REFUSED, f"{name} trains at batch 4: drop it from REFUSED"
    assert skipped == 0, "float16 gradients not finite at loss scale 1"
    assert math.isfinite(loss), loss
    assert all(np.isfinite(np.asarray(v)).all() for k, v in after.items()  # on the host
               if np.isfinite(np.asarray(before[k])).all())  # (a constant may hold inf)
    assert not after or any(not np.array_equal(before[k], after[k]) for k in after), \
        "no weight changed"
