"""What ``fit`` refuses before compiling: data, configurations and models that cannot train
as asked, each in one line naming what is wrong and what was expected."""

from __future__ import annotations

import numpy as np
import pytest

import circle_jax as cj
from circle_jax.errors import ConfigError, DataError, TrainingError
from circle_jax.formats.rawdata import check_training_data
from circle_jax.train.data import as_inputs
from tests.paths import shared_model
from tests.toy_models import reshape_mlp, toy_data


def _one_line(e: pytest.ExceptionInfo) -> None:
    assert "\n" not in str(e.value)


def test_float_data_for_token_ids_is_refused_naming_both_dtypes() -> None:
    model = cj.load(shared_model("tflite_support_movie_review_text.tflite"))
    y = np.eye(2, dtype=np.float32)[[0, 1, 0, 1]]
    floats = np.random.default_rng(0).normal(size=(4, 256)).astype(np.float32) * 50
    with pytest.raises(DataError, match=r"input 'input_3' has dtype float32, expected int32"
                                        r".*pass it as int32") as e:
        cj.fit(model, floats, y, loss="cce", epochs=1, batch_size=2)
    _one_line(e)
    for bad in (floats > 0, floats.astype(np.complex64), np.full((4, 256), 2**40)):
        with pytest.raises(DataError, match="input 'input_3' has dtype"):
            as_inputs(model, bad)
    ids = as_inputs(model, np.arange(4 * 256, dtype=np.int64).reshape(4, 256) % 100)[0]
    assert ids.dtype == np.int32  # int64 ids that fit are cast


def test_float64_data_rounds_to_float32_but_overflow_is_refused() -> None:
    model = reshape_mlp()
    x, _ = toy_data(4)
    (x32,) = as_inputs(model, x.astype(np.float64) + 1e-12)
    assert x32.dtype == np.float32
    assert np.array_equal(x32, x)
    with pytest.raises(DataError, match="input 'x' has dtype float64, expected float32: 1 of"):
        as_inputs(model, np.concatenate([[1e300], x.reshape(-1)[1:]]).reshape(x.shape))


def test_accumulating_more_steps_than_the_run_has_is_refused() -> None:
    model = reshape_mlp()
    x, y = toy_data(16)
    with pytest.raises(TrainingError, match=r"accumulate=8 updates the weights every 8 steps, "
                                            r"but the run has 4 \(4 an epoch\)") as e:
        cj.fit(model, x, y, epochs=1, batch_size=4, accumulate=8)
    _one_line(e)
    moved = cj.fit(model, x, y, epochs=2, batch_size=4, accumulate=8, learning_rate=0.1)
    assert any(not np.array_equal(moved.params[k], v) for k, v in model.params.items())


def test_reduction_none_is_refused_for_training_but_kept_for_losses() -> None:
    model = reshape_mlp()
    x, y = toy_data(8)
    with pytest.raises(ConfigError, match="reduction 'none' gives per-sample losses") as e:
        cj.fit(model, x, y, batch_size=4, epochs=1, reduction="none")
    _one_line(e)
    per_sample = cj.losses.get_loss("mse", reduction="none")(y, np.zeros_like(y))
    assert per_sample.shape == (8,)


@pytest.mark.parametrize("spec, match", [
    (-2, r"trainable=-2 names no last N operators; expected 'all', 'none', N"),
    (5, r"trainable=5 names no last N operators \(the model has 4 operators\)"),
    (True, r"trainable=True \(bool\) is not a trainable spec"),
    (2.5, r"trainable=2.5 \(float\) is not a trainable spec"),
    ([True], r"trainable=\[True\] \(list\) is not a trainable spec"),
])
def test_bad_trainable_specs_are_refused(spec: object, match: str) -> None:
    model = reshape_mlp()
    x, y = toy_data(8)
    with pytest.raises(ConfigError, match=match) as e:
        cj.fit(model, x, y, batch_size=4, epochs=1, trainable=spec)
    _one_line(e)


def test_a_run_that_trains_nothing_unasked_is_refused() -> None:
    """Nothing trainable selected is refused; asking for none ("none", 0: onert_train's
    --num_of_trainable_ops 0, the loss of the model as it is) runs and moves nothing."""
    x, y = toy_data(8)
    model = reshape_mlp()
    last = len(model.operators) - 1
    assert not any(last in ops for ops in model.param_operators().values())
    with pytest.raises(ConfigError, match=r"trainable=1 selects none of the model's 4 "
                                          "trainable weights: nothing would train") as e:
        cj.fit(model, x, y, batch_size=4, epochs=1, trainable=1)
    _one_line(e)
    for none in ("none", 0):
        result = cj.fit(model, x, y, batch_size=4, epochs=1, trainable=none)
        assert all(np.array_equal(result.params[k], model.params[k]) for k in model.params)
    weightless = cj.load(shared_model("aeq_bmm.tflite"))
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(4, *s.shape[1:])).astype(np.float32) for s in weightless.inputs]
    y = rng.normal(size=(4, *weightless.outputs[0].shape[1:])).astype(np.float32)
    with pytest.raises(ConfigError, match="the model has no trainable weights"):
        cj.fit(weightless, xs, y, batch_size=2, epochs=1)


@pytest.mark.parametrize("options, given", [
    (dict(lora_alpha=4), "lora_alpha"),
    (dict(lora_targets="fc"), "lora_targets"),
    (dict(new_head=3, lora_targets=["fc1/w"]), "lora_targets"),
])
def test_lora_options_without_lora_are_refused_on_load_and_fit(options: dict,
                                                                given: str) -> None:
    match = f"{given} is given without lora: it applies to LoRA adapters"
    model = reshape_mlp()
    with pytest.raises(ConfigError, match=match) as e:
        cj.load(model.export(), **options)
    _one_line(e)
    x, y = toy_data(8)
    with pytest.raises(ConfigError, match=match):
        cj.fit(model, x, y, batch_size=4, epochs=1, **options)
    with pytest.raises(ConfigError, match=match):
        model.personalize(**options)


def test_out_of_range_labels_are_named_and_padding_suggests_ignore_index() -> None:
    model = cj.load(shared_model("aeq_toy_transformer_kv_cache_2sig.tflite"))
    rng = np.random.default_rng(0)
    x = [rng.integers(0, 400, size=(4, *s.shape[1:])).astype(s.dtype) for s in model.inputs]
    labels = rng.integers(0, 400, size=(4, 100))
    labels[:, 50:] = -100
    with pytest.raises(DataError, match=r"sample 0 has label\(s\) \[-100\] outside the 400 "
                                        r"classes \[0, 400\); padding\? set ignore_index") as e:
        cj.fit(model, x, labels, loss="sparse_cce", loss_output=1, from_logits=True, epochs=2,
               batch_size=2)
    _one_line(e)
    labels[1, :8] = [400, 401, 402, 403, 404, 400, 7, 405]
    with pytest.raises(DataError, match=r"sample 1 has label\(s\) \[400, 401, 402, 403\] \.\.\. "
                                        r"outside the 400 classes \[0, 400\)$"):
        check_training_data(x, labels, 400, ignore_index=-100)


def test_crossentropy_on_one_unit_or_with_logits_of_a_softmax_is_refused() -> None:
    sine = cj.load(shared_model("tflm_hello_world_sine_float.tflite"))
    ones = np.ones((4, 1), np.float32)
    for loss in ("cce", "sparse_cce"):
        with pytest.raises(ConfigError, match=r"needs at least 2 classes on the last axis of "
                                              r"output 'StatefulPartitionedCall:0', which has "
                                              r"shape \[1, 1\]") as e:
            cj.fit(sine, ones, ones, loss=loss, epochs=1, batch_size=2)
        _one_line(e)
    x, y = toy_data(8)
    with pytest.raises(ConfigError, match="from_logits=True, but output 'probs' is a "
                                          "SOFTMAX's: probabilities already"):
        cj.fit(reshape_mlp(), x, y, loss="cce", from_logits=True, epochs=1, batch_size=4)
    logits = reshape_mlp(softmax=False)  # logits output: from_logits is right there
    assert cj.Trainer(logits, loss="cce", from_logits=True).numerics.from_logits


def test_an_input_dynamic_past_the_batch_takes_samples_of_any_length() -> None:
    """openWakeWord's melspectrogram declares [1, 1] for [-1, -1]: fit takes 1760-sample
    waveforms, and checks the targets at the shape such a sample gives the output
    ([1, 8, 32], where the file declares [1, 1, 32])."""
    model = cj.load(shared_model("oww_melspectrogram.tflite"))
    x = np.random.default_rng(0).uniform(-1, 1, (2, 1760)).astype(np.float32)
    with pytest.raises(DataError, match=r"samples of shape \[1, 1, 32\], but loss "
                                        r"mean_squared_error .* expects \[1, 8, 32\]") as e:
        cj.fit(model, x, np.zeros((2, 1, 1, 32), np.float32), loss="mse", epochs=1,
               batch_size=1)
    _one_line(e)
    with pytest.raises(DataError, match=r"samples of shape \[1760, 1\], the model expects "
                                        r"\[1\]"):
        cj.fit(model, x[..., None], np.zeros((2, 1, 8, 32)), loss="mse", epochs=1)
    r = cj.fit(model, x, np.zeros((2, 1, 8, 32), np.float32), loss="mse", epochs=1,
               batch_size=1, learning_rate=1e-9)
    assert np.isfinite(r.history.loss[0])


def test_targets_that_do_not_fit_the_loss_output_are_refused_naming_both_shapes() -> None:
    model = reshape_mlp()
    x, y = toy_data(8)
    with pytest.raises(DataError, match="sample 0 holds negative targets .*categorical "
                                        "crossentropy expects one-hot or probability"):
        cj.fit(model, x, -y, loss="cce", epochs=1, batch_size=4)
    sine = cj.load(shared_model("tflm_hello_world_sine_float.tflite"))
    with pytest.raises(DataError, match=r"samples of shape \[\], but loss mean_squared_error "
                                        r"on output 'StatefulPartitionedCall:0' \(samples of "
                                        r"shape \[1\]\) expects \[1\]") as e:
        cj.fit(sine, np.ones((4, 1), np.float32), np.ones(4), loss="mse", epochs=1,
               batch_size=2)
    _one_line(e)
    with pytest.raises(DataError, match=r"samples of shape \[4, 1\], but loss "
                                        r"sparse_categorical_crossentropy .* expects \[\]"):
        cj.fit(model, x, np.zeros((8, 4, 1)), loss="sparse_cce", epochs=1, batch_size=4)


@pytest.mark.parametrize("keyword, hint", [
    ("lr", "did you mean 'learning_rate'?"), ("batchsize", "did you mean 'batch_size'?"),
    ("every_step", "did you mean 'every_steps'?"), ("zzz", "expected a TrainConfig field"),
])
def test_unknown_keywords_name_the_closest_valid_one(keyword: str, hint: str) -> None:
    x, y = toy_data(8)
    with pytest.raises(ConfigError, match=f"unknown training keyword '{keyword}': "
                                          f"{hint.replace('?', '[?]')}") as e:
        cj.fit(reshape_mlp(), x, y, **{keyword: 4})
    _one_line(e)
    if keyword != "every_step":
        with pytest.raises(ConfigError, match=f"unknown training keyword '{keyword}'"):
            cj.Trainer(reshape_mlp(), **{keyword: 4})


def test_token_ids_outside_the_embedding_table_are_refused() -> None:
    """An id past the table's rows: JAX clamps or fills NaN and trains on it; LiteRT
    refuses the call. Refused before compiling, naming the table and its rows."""
    text = cj.load(shared_model("tflite_support_movie_review_text.tflite"))
    y = np.eye(2, dtype=np.float32)[[0, 1, 0, 1]]
    ids = np.random.default_rng(0).integers(0, 10003, (4, 256)).astype(np.int32)
    for bad, shown in ((10003, "from \\d+ to 10003"), (-1, "from -1 to")):
        wrong = ids.copy()
        wrong[2, 7] = bad
        with pytest.raises(DataError, match=f"ids {shown}.* of 10003 rows: expected ids in "
                                            r"\[0, 10003\)") as e:
            cj.fit(text, wrong, y, loss="cce", epochs=1, batch_size=2)
        _one_line(e)
    assert np.isfinite(cj.fit(text, ids, y, loss="cce", epochs=1, batch_size=2).history.loss[0])


CONV1D = "tests/data/keras/conv1d_stack.tflite"
FULL_INT8 = "tests/data/quantized/full_int8.tflite"
BAD_LOADS = [
    (CONV1D, dict(new_head=0)), (CONV1D, dict(new_head=True)), (CONV1D, dict(lora=5)),
    (CONV1D, dict(lora=1, lora_targets="bogus")), (CONV1D, dict(lora=1, lora_targets="")),
    (CONV1D, dict(lora=1, lora_alpha="4")), (CONV1D, dict(new_head=2, seed="a")),
    (shared_model("aeq_branching_conv_fc.tflite"), dict(new_head=3)),
    (FULL_INT8, dict(new_head=3)),
    (FULL_INT8, dict(qat=True, qat_ranges="ema", qat_forward="integer")),
    (FULL_INT8, dict(qat=True, qat_range_decay=1.5)),
]
BAD_FITS = [dict(accumulate=0), dict(accumulate=3, accumulate_mode="in_step", batch_size=8),
            dict(validation_split=1.0), dict(batch_size=0), dict(precision="fp8"),
            dict(loss_scale=-1), dict(on_overflow="ignore"), dict(learning_rate=-1),
            dict(shuffle="yes")]


@pytest.mark.parametrize("case", [*BAD_LOADS, *BAD_FITS], ids=repr)
def test_options_that_cannot_apply_are_config_errors_in_one_line(case: object) -> None:
    """Each refused option is a ConfigError (a ValueError too), never a TypeError from a
    comparison inside or an option accepted silently."""
    with pytest.raises(ConfigError) as e:
        if isinstance(case, tuple):
            cj.load(case[0], **case[1])
        else:
            x, y = toy_data(8)
            cj.fit(reshape_mlp(), x, y, **{"batch_size": 4, "epochs": 1, **case})
    assert isinstance(e.value, ValueError)
    _one_line(e)
