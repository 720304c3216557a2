"""LiteRT's on-device training files (TF 2.21's converter, tests/data/ondevice) read and run.

Against TF eager's numbers recorded by scripts/make_ondevice_models.py (the npz files) and
against LiteRT's own signature runners on the builtin-only signatures.
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import replace

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.errors import DataError, UnsupportedOperatorError, VariableError
from circle_jax.formats.flex import flex_options
from circle_jax.formats.tf_checkpoint import read_checkpoint
from circle_jax.graph.checks import check_graph
from circle_jax.graph.variables import variables
from circle_jax.ops.registry import register
from circle_jax.signatures import Program
from tests.paths import TESTS

DATA = os.path.join(TESTS, "data", "ondevice")
BUILTIN_ONLY = ["mlp_sgd", "mlp_adam", "frozen_head"]
SUMMARY = json.load(open(os.path.join(DATA, "summary.json")))


def path(name: str) -> str:
    return os.path.join(DATA, f"{name}.tflite")


def recorded(name: str) -> dict[str, np.ndarray]:
    with np.load(os.path.join(DATA, f"{name}.npz")) as d:
        return dict(d)


@pytest.mark.parametrize("file", sorted(glob.glob(os.path.join(DATA, "*.tflite"))),
                         ids=os.path.basename)
def test_every_file_reads_and_passes_the_graph_checks(file: str) -> None:
    model = cj.read_model(file)
    assert check_graph(model) == []
    name = os.path.basename(file)[:-len(".tflite")]
    facts = SUMMARY[name]
    assert [s.key for s in model.signature_defs] == list(facts["signatures"])
    if "variables_shared_names" in facts:
        found = variables(model)
        assert sorted(found) == sorted(facts["variables_shared_names"])
        assert sorted(n for n, v in found.items() if v.initialised) == \
            sorted(facts["variables_with_initialiser"])


def test_string_constants_are_read_as_bytes_and_written_back() -> None:
    from circle_jax.formats import write_model

    model = cj.read_model(path("mlp_sgd"))

    def strings(m):
        restore = m.subgraphs[m.signature_defs[1].subgraph_index]
        return sorted(t.data.item() for t in restore.tensors
                      if t.dtype == "string" and t.data is not None)

    assert strings(model) == [b"b1", b"b2", b"w1", b"w2"]
    renamed = replace(model, subgraphs=tuple(
        replace(sg, tensors=tuple(
            replace(t, data=np.array([b"new_" + v for v in t.data.flat], object)
                    .reshape(t.shape))
            if t.dtype == "string" and t.data is not None else t for t in sg.tensors))
        for sg in model.subgraphs))
    written = write_model(renamed, "tflite")
    assert strings(cj.read_model(written)) == [b"new_b1", b"new_b2", b"new_w1", b"new_w2"]
    d = recorded("mlp_sgd")  # the written file still runs
    train = cj.Interpreter(model_content=written).get_signature_runner("train")
    np.testing.assert_allclose(train(x=d["x"], y=d["y"])["loss"], d["losses"][0], rtol=1e-6)


@pytest.mark.parametrize("name", BUILTIN_ONLY)
def test_train_and_infer_equal_tensorflow_eager(name: str) -> None:
    d = recorded(name)
    it = cj.Interpreter(model_path=path(name))
    infer, train = it.get_signature_runner("infer"), it.get_signature_runner("train")
    np.testing.assert_allclose(infer(x=d["x"])["output"], d["infer_before"], rtol=1e-5,
                               atol=1e-6)
    losses = np.array([train(x=d["x"], y=d["y"])["loss"] for _ in range(20)])
    np.testing.assert_allclose(losses, d["losses"], rtol=1e-5)
    assert losses[-1] < losses[0] / 4  # it trained
    np.testing.assert_allclose(infer(x=d["x"])["output"], d["infer_after"], rtol=1e-5,
                               atol=1e-6)
    for key in (k for k in d if k.startswith("final/")):
        np.testing.assert_allclose(it.variables[key[len("final/"):]], d[key], rtol=1e-5,
                                   atol=1e-6, err_msg=key)


@pytest.mark.parametrize("name", BUILTIN_ONLY)
def test_litert_runs_what_circle_jax_runs(name: str) -> None:
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    d = recorded(name)
    theirs, ours = LiteRT(model_path=path(name)), cj.Interpreter(model_path=path(name))
    theirs.allocate_tensors()
    ours.allocate_tensors()
    assert ours.get_signature_list() == theirs.get_signature_list()
    for _ in range(5):
        a = theirs.get_signature_runner("train")(x=d["x"], y=d["y"])["loss"]
        b = ours.get_signature_runner("train")(x=d["x"], y=d["y"])["loss"]
        np.testing.assert_allclose(b, a, rtol=1e-5)
    np.testing.assert_allclose(ours.get_signature_runner("infer")(x=d["x"])["output"],
                               theirs.get_signature_runner("infer")(x=d["x"])["output"],
                               rtol=1e-5, atol=1e-6)


def test_the_pure_function_jits_and_threads_the_variables() -> None:
    d = recorded("mlp_adam")
    program = Program(path("mlp_adam"))
    train = program.signature("train")
    start = program.initial_variables()
    assert sorted(start) == sorted(k[len("init/"):] for k in d if k.startswith("init/"))
    for key in (k for k in d if k.startswith("init/")):
        np.testing.assert_array_equal(start[key[len("init/"):]], d[key])
    step = jax.jit(train)
    v, losses = start, []
    for _ in range(3):
        out, v = step(v, {"x": d["x"], "y": d["y"]})
        losses.append(float(out["loss"]))
    np.testing.assert_allclose(losses, d["losses"][:3], rtol=1e-5)
    eager_out, eager_v = train(start, {"x": d["x"], "y": d["y"]})
    np.testing.assert_allclose(eager_out["loss"], d["losses"][0], rtol=1e-5)
    assert float(eager_v["step"]) == 1.0 and float(start["step"]) == 0.0  # inputs untouched


def test_signatures_share_variables_and_init_runs_once() -> None:
    d = recorded("mlp_sgd")
    it = cj.Interpreter(model_content=open(path("mlp_sgd"), "rb").read())
    assert it.variables == {}
    it.get_signature_runner("train")(x=d["x"], y=d["y"])
    after_one = it.variables
    # infer's CALL_ONCE names the same init subgraph: it must not run again
    it.get_signature_runner("infer")(x=d["x"])
    for k, v in it.variables.items():
        np.testing.assert_array_equal(v, after_one[k])
    it.set_variables({k[len("init/"):]: d[k] for k in d if k.startswith("init/")})
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_before"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key", sorted(Program(path("flex_ops")).signature_defs))
def test_every_flex_signature_equals_tensorflow(key: str) -> None:
    """Each signature of flex_ops.tflite (one TF op each: the Flex gradient operators through
    circle_jax.ops.flex, the ones the converter made builtins) on TF eager's inputs: TF's
    outputs within 1e-6 of their largest value (float32 sums in another order; measured at
    most 1.5e-7, the ReLU, pooling and shape ones equal)."""
    d = recorded("flex_ops")
    sig = Program(path("flex_ops")).signature(key)
    out, _ = sig({}, {n: d[f"{key}/in/{n}"] for n in sig.inputs})
    for n in sig.outputs:
        want = d[f"{key}/out/{n}"]
        scale = max(float(np.abs(want).max()), 1e-12)
        np.testing.assert_allclose(np.asarray(out[n], np.float64), want, rtol=0,
                                   atol=1e-6 * scale)


@pytest.mark.parametrize("name", ["tutorial_cnn", "tutorial_cnn_adam"])
def test_flex_training_files_restore_train_and_save_as_tensorflow(name: str,
                                                                 tmp_path) -> None:
    """The tutorial's files (FlexReluGrad, FlexMaxPoolGrad, FlexConv2DBackpropFilter, Keras's
    optimizer, no initialisers): the file's own restore of TF's checkpoint, 20 steps of its
    own train (TF eager's losses, 1e-5 relative; measured 8.2e-7), its own save (a TF V1
    checkpoint holding TF's trained values, int64 step counters as int64; measured 1.2e-7)."""
    d = recorded(name)
    it = cj.Interpreter(model_path=path(name))
    it.get_signature_runner("restore")(checkpoint_path=np.array(path(name)[:-7] + ".init.ckpt"))
    train = it.get_signature_runner("train")
    losses = [float(np.asarray(train(x=d["x"], y=d["y"])["loss"])) for _ in range(20)]
    np.testing.assert_allclose(losses, d["losses"], rtol=1e-5)
    out = tmp_path / "trained.ckpt"
    it.get_signature_runner("save")(checkpoint_path=np.array(str(out)))
    saved = read_checkpoint(out)
    assert {f"final/{k}" for k in saved} == {k for k in d if k.startswith("final/")}
    for k, v in saved.items():
        assert v.dtype == d[f"final/{k}"].dtype, k
        np.testing.assert_allclose(v, d[f"final/{k}"], rtol=1e-5, atol=1e-6)


def test_an_unknown_flex_op_is_named_and_a_registered_one_runs() -> None:
    """A Flex kernel registers under CUSTOM:Flex<TF op> and gets the NodeDef: relu_grad of
    flex_ops.tflite with its operator renamed to a TF op only this test registers."""
    model = cj.read_model(path("flex_ops"))
    sig = next(s for s in model.signature_defs if s.key == "relu_grad")
    sg = model.subgraphs[sig.subgraph_index]
    op = replace(sg.operators[0], custom_code="FlexCircleJaxTestReluGrad")
    model = replace(model, subgraphs=tuple(
        replace(s, operators=(op,)) if s.index == sg.index else s for s in model.subgraphs))
    with pytest.raises(UnsupportedOperatorError, match="FlexCircleJaxTestReluGrad"):
        Program(model).signature("relu_grad")
    seen = []

    @register("CUSTOM:FlexCircleJaxTestReluGrad")
    def relu_grad(ctx, gradients, features):
        seen.append(flex_options(ctx.op.custom_options, "test"))
        return gradients * (features > 0)

    d = recorded("flex_ops")
    out, _ = Program(model).signature("relu_grad")(
        {}, {k: d[f"relu_grad/in/{k}"] for k in ("gradients", "features")})
    np.testing.assert_array_equal(out["output"], d["relu_grad/out/output"])
    assert seen[0][0] == "ReluGrad" and b"ReluGrad" in seen[0][1]


@pytest.mark.parametrize("key", ["tanh_grad", "sigmoid_grad", "bias_add_grad",
                                 "conv2d_backprop_input_same", "conv2d_backprop_input_valid"])
def test_builtin_gradient_signatures_equal_tensorflow(key: str) -> None:
    d = recorded("flex_ops")
    sig = Program(path("flex_ops")).signature(key)
    out, _ = sig({}, {n: d[f"{key}/in/{n}"] for n in sig.inputs})
    for n in sig.outputs:
        np.testing.assert_allclose(out[n], d[f"{key}/out/{n}"], rtol=1e-5, atol=1e-5)


def test_an_uninitialised_variable_is_named() -> None:
    d = recorded("tutorial_cnn")
    it = cj.Interpreter(model_path=path("tutorial_cnn"))
    with pytest.raises(VariableError, match=r"variable 'cnn/conv/kernel' is read") as e:
        it.get_signature_runner("infer")(x=d["x"])
    assert "\n" not in str(e.value)
    # given the variables (as restore would), infer computes TF's numbers
    it.set_variables({k[len("init/"):]: d[k] for k in d if k.startswith("init/")})
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_before"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda it: it.get_signature_runner("nope"),
     r"no signature 'nope' \(signatures: 'infer', 'restore', 'save', 'train'\)"),
    (lambda it: it.get_signature_runner(), r"model has 4 signatures"),
    (lambda it: it.get_signature_runner("train")(x=np.zeros((4, 8)), z=np.zeros(1)),
     r"signature 'train' has no input 'z' \(its inputs: 'x', 'y'\)"),
    (lambda it: it.get_signature_runner("train")(x=np.zeros((4, 8))),
     r"signature 'train' needs input\(s\) 'y'"),
    (lambda it: it.get_signature_runner("infer")(x=np.zeros((3, 8))),
     r"input 'x' has shape \[3, 8\]; the file declares \[4, 8\]"),
    (lambda it: it.set_variables({"w9": np.zeros(1)}), r"no variable 'w9' \(variables: "),
])
def test_bad_names_are_one_line_naming_what_exists(call, match) -> None:
    it = cj.Interpreter(model_path=path("mlp_sgd"))
    with pytest.raises(DataError, match=match) as e:
        call(it)
    assert "\n" not in str(e.value)


def test_the_interpreter_takes_one_source() -> None:
    with pytest.raises(cj.ConfigError, match="exactly one"):
        cj.Interpreter()


def test_keep_reachable_drops_what_the_signature_never_runs() -> None:
    from circle_jax.passes import keep_reachable, select_signature

    model = cj.read_model(path("mlp_sgd"))
    kept = keep_reachable(select_signature(model, "train"))
    # train (subgraph 3) and its init subgraph (4), renumbered 0 and 1
    assert [sg.name for sg in kept.subgraphs] == ["train", "NoOp"]
    assert kept.main.operators[0].options.init_subgraph_index == 1
    assert [s.key for s in kept.signature_defs] == ["train"]
    assert check_graph(kept) == []


def test_variables_set_before_the_first_call_are_not_overwritten_by_the_init() -> None:
    d = recorded("mlp_sgd")
    it = cj.Interpreter(model_path=path("mlp_sgd"))
    it.set_variables({k[len("final/"):]: d[k] for k in d if k.startswith("final/")})
    np.testing.assert_allclose(it.get_signature_runner("infer")(x=d["x"])["output"],
                               d["infer_after"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- load(signature=)

def test_load_of_infer_is_a_model_whose_params_are_the_variables() -> None:
    d = recorded("mlp_sgd")
    model = cj.load(path("mlp_sgd"), signature="infer")
    assert sorted(model.params) == ["b1", "b2", "w1", "w2"]
    assert model.trainable_params == frozenset(model.params)
    for k in model.params:
        np.testing.assert_array_equal(model.params[k], d[f"init/{k}"])
    np.testing.assert_allclose(model(d["x"])[0], d["infer_before"], rtol=1e-5, atol=1e-6)
    # the trained variables as params: TF's infer after training
    trained = {k: d[f"final/{k}"] for k in model.params}
    np.testing.assert_allclose(model.apply(trained, d["x"])[0], d["infer_after"], rtol=1e-5,
                               atol=1e-6)
    assert any(r.name == "read_variables_as_constants" and r.changes for r in model.passes)


def test_autodiff_of_infer_equals_the_files_own_train_step() -> None:
    """The file's train signature (TF's converter-made gradients, SGD lr 0.1 on the MSE)
    moves each variable by -0.1 * its gradient: autodiff of the same loss through the loaded
    infer gives that gradient."""
    d = recorded("mlp_sgd")
    model = cj.load(path("mlp_sgd"), signature="infer")
    program = Program(path("mlp_sgd"))
    start = program.initial_variables()
    _, after = program.signature("train")(start, {"x": d["x"], "y": d["y"]})

    def loss(params):
        return jax.numpy.mean((model.apply(params, d["x"])[0] - d["y"]) ** 2)

    grads = jax.jit(jax.grad(loss))(model.params)
    for k, g in grads.items():
        file_grad = (np.asarray(start[k], np.float64) - np.asarray(after[k], np.float64)) / 0.1
        scale = np.abs(file_grad).max()
        assert np.abs(np.asarray(g) - file_grad).max() <= 1e-5 * scale + 1e-6, k


def test_autodiff_of_infer_equals_float64_finite_differences() -> None:
    from tests.conformance import check_model_grads

    d = recorded("mlp_sgd")
    check_model_grads(cj.load(path("mlp_sgd"), signature="infer"), [d["x"]])


@pytest.mark.parametrize("name, key, error, match", [
    ("mlp_sgd", "train", UnsupportedOperatorError,
     r"signature 'train' assigns variables \('b1', 'b2', 'w1', 'w2'\)"),
    ("tutorial_cnn", "infer", VariableError,
     r"variable 'cnn/conv/kernel' \(read by operator 4 of signature 'infer'\) has no initial"),
])
def test_load_refuses_what_is_no_plain_model_in_one_line(name, key, error, match) -> None:
    with pytest.raises(error, match=match) as e:
        cj.load(path(name), signature=key)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name, config", [
    ("mlp_sgd", dict(learning_rate=0.1, loss="mse", optimizer="sgd")),
    ("mlp_adam", dict(learning_rate=0.01, loss="cce", from_logits=True, optimizer="adam",
                      optimizer_kwargs={"eps": 1e-7})),
    ("frozen_head", dict(learning_rate=0.5, loss="cce", from_logits=True, optimizer="sgd",
                         trainable=["hw", "hb"])),
])
def test_fit_on_the_loaded_infer_equals_the_train_signatures_losses(name, config) -> None:
    """fit (optax, circle-jax's losses, autodiff) on infer = TF eager's run of the file's
    train function (the same loss and optimizer, written out in TF)."""
    d = recorded(name)
    model = cj.load(path(name), signature="infer")
    result = cj.fit(model, d["x"], d["y"], cj.TrainConfig(epochs=20, batch_size=4, **config))
    np.testing.assert_allclose(result.history.loss, d["losses"], rtol=1e-4)
