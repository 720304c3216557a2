"""The training step as builtin operators (circle_jax.passes.training_graph, issue 56).

Each backward rule: its builtin-operator graph, run by LiteRT, equals ``jax.vjp`` of
circle-jax's reference operator on random shapes and options. The exported functional step
(circle_jax.ondevice): LiteRT runs it 20 steps, feeding each step's state into the next, with
the same per-step losses and final weights as circle-jax's ``fit``.
"""

from __future__ import annotations

from dataclasses import replace

import jax
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.build import Builder
from circle_jax.errors import ConfigError, UnsupportedOperatorError
from circle_jax.formats.reader import read_model
from circle_jax.formats.wof import decode_wof
from circle_jax.formats.writer import write_model
from circle_jax.graph import ir
from circle_jax.ondevice import export_training_graph
from circle_jax.passes.training_graph import RULES
from circle_jax.passes.training_graph.emit import Emitter
from circle_jax.passes.training_graph.rule import Backward
from tests.conformance import ATOL, RTOL, Const, one_op_model, run_litert
from tests.paths import REPO_ROOT, shared_model

RNG = np.random.default_rng(56)


def _normal(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def rule_graph(forward: bytes) -> tuple[bytes, list[int]]:
    """A model computing the cotangents of the one operator of ``forward`` by its rule:
    inputs the forward's inputs then each output's cotangent, outputs the cotangent of each
    graph input (in order); and the positions of those inputs in the operator."""
    model = read_model(forward)
    sg = model.main
    op = sg.operators[0]
    e = Emitter([replace(t, origin=None, buffer=ir.NEW_BUFFER if t.is_constant else 0)
                 for t in sg.tensors], [replace(op, origin=None)])
    gs = tuple(e.tensor(f"g{k}", e.shape(y)) for k, y in enumerate(op.outputs))
    positions = [p for p, i in enumerate(op.inputs) if i in sg.inputs]
    cot = RULES[op.key].backward(Backward(e, op, gs[0], frozenset(positions), gs))
    graph = ir.Subgraph(0, "vjp", tuple(e.tensors), tuple(e.operators), (*sg.inputs, *gs),
                        tuple(cot[p] for p in positions))
    return write_model(ir.Model((graph,), "TFL3", 3, "rule", {}), "tflite"), positions


RULE_CASES = [
    ("FULLY_CONNECTED", [_normal(3, 5), _normal(4, 5), _normal(4)], {}),
    ("FULLY_CONNECTED", [_normal(3, 5, scale=3), _normal(4, 5), _normal(4)],
     {"fused_activation_function": "RELU"}),
    ("FULLY_CONNECTED", [_normal(3, 5, scale=4), _normal(4, 5), _normal(4)],
     {"fused_activation_function": "RELU6"}),
    ("FULLY_CONNECTED", [_normal(3, 5), _normal(4, 5), _normal(4)],
     {"fused_activation_function": "RELU_N1_TO_1"}),
    ("FULLY_CONNECTED", [_normal(2, 3, 5), _normal(4, 5), None], {"keep_num_dims": True}),
    ("FULLY_CONNECTED", [_normal(2, 3, 5), _normal(6, 5), _normal(6)], {}),
    ("BATCH_MATMUL", [_normal(3, 4), _normal(4, 5)], {}),
    ("BATCH_MATMUL", [_normal(4, 3), _normal(5, 4)], {"adjoint_lhs": True, "adjoint_rhs": True}),
    ("BATCH_MATMUL", [_normal(3, 4), _normal(5, 4)], {"adjoint_rhs": True}),
    ("ADD", [_normal(2, 3, 4), _normal(3, 1)], {}),
    ("ADD", [_normal(1, 4), _normal(2, 3, 4)], {"fused_activation_function": "RELU"}),
    ("SUB", [_normal(2, 3, 4), _normal(4)], {"fused_activation_function": "RELU6"}),
    ("MUL", [_normal(2, 1, 4), _normal(3, 1)], {}),
    ("DIV", [_normal(2, 3), _normal(3) + 3.0], {}),
    ("RELU", [_normal(3, 7)], {}),
    ("RELU6", [_normal(3, 7, scale=5)], {}),
    ("RELU_N1_TO_1", [_normal(3, 7, scale=2)], {}),
    ("LOGISTIC", [_normal(3, 7)], {}),
    ("TANH", [_normal(3, 7)], {}),
    ("LEAKY_RELU", [_normal(3, 7)], {"alpha": 0.2}),
    ("SOFTMAX", [_normal(3, 6)], {"beta": 1.0}),
    ("SOFTMAX", [_normal(2, 3, 6)], {"beta": 0.5}),
    ("RESHAPE", [_normal(2, 6), Const([3, 4], "int32")], {"new_shape": [3, 4]}),
    ("SQUEEZE", [_normal(2, 1, 3)], {"squeeze_dims": [1]}),
    ("EXPAND_DIMS", [_normal(2, 3), Const(1, "int32")], {}),
    ("TRANSPOSE", [_normal(2, 3, 4), Const([2, 0, 1], "int32")], {}),
    ("MEAN", [_normal(2, 3, 4), Const([1], "int32")], {"keep_dims": False}),
    ("MEAN", [_normal(2, 3, 4), Const([0, 2], "int32")], {"keep_dims": True}),
    ("SUM", [_normal(2, 3, 4), Const([-1], "int32")], {"keep_dims": False}),
    ("REDUCE_MAX", [_normal(2, 3, 4), Const([1], "int32")], {"keep_dims": False}),
    ("REDUCE_MAX", [np.round(_normal(2, 3, 4)), Const([0, 2], "int32")], {"keep_dims": True}),
    ("REDUCE_MIN", [np.round(_normal(3, 5)), Const([-1], "int32")], {"keep_dims": False}),
    ("CONV_2D", [_normal(2, 7, 6, 3), _normal(4, 3, 3, 3), _normal(4)],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1}),
    ("CONV_2D", [_normal(2, 7, 6, 3), _normal(4, 3, 2, 3), _normal(4)],
     {"padding": "SAME", "stride_h": 2, "stride_w": 2, "fused_activation_function": "RELU"}),
    ("CONV_2D", [_normal(1, 8, 7, 2), _normal(3, 3, 3, 2), _normal(3)],
     {"padding": "VALID", "stride_h": 2, "stride_w": 3}),
    ("CONV_2D", [_normal(2, 6, 6, 2), _normal(3, 1, 1, 2), _normal(3)],
     {"padding": "VALID", "stride_h": 1, "stride_w": 1}),
    ("DEPTHWISE_CONV_2D", [_normal(2, 7, 6, 3), _normal(1, 3, 3, 3), _normal(3)],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1}),
    ("DEPTHWISE_CONV_2D", [_normal(2, 7, 6, 2), _normal(1, 3, 3, 4), _normal(4)],
     {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 2,
      "fused_activation_function": "RELU6"}),
    ("DEPTHWISE_CONV_2D", [_normal(1, 9, 8, 3), _normal(1, 3, 2, 3), _normal(3)],
     {"padding": "VALID", "stride_h": 2, "stride_w": 2, "depth_multiplier": 1}),
    ("AVERAGE_POOL_2D", [_normal(2, 7, 6, 3)], {"padding": "SAME", "stride_h": 2,
                                                "stride_w": 2, "filter_height": 3,
                                                "filter_width": 3}),
    ("AVERAGE_POOL_2D", [_normal(2, 4, 4, 3)], {"padding": "VALID", "stride_h": 1,
                                                "stride_w": 1, "filter_height": 4,
                                                "filter_width": 4,
                                                "fused_activation_function": "RELU"}),
    ("MAX_POOL_2D", [_normal(2, 7, 6, 3)], {"padding": "SAME", "stride_h": 2, "stride_w": 2,
                                            "filter_height": 2, "filter_width": 2}),
    ("MAX_POOL_2D", [_normal(1, 6, 9, 2)], {"padding": "VALID", "stride_h": 3, "stride_w": 3,
                                            "filter_height": 3, "filter_width": 3}),
    # overlapping windows, SAME padding; after a ReLU (ties: whole windows of zeros, the
    # cotangent to each window's first maximum)
    ("MAX_POOL_2D", [_normal(2, 9, 8, 3)], {"padding": "SAME", "stride_h": 2, "stride_w": 2,
                                            "filter_height": 3, "filter_width": 3}),
    ("MAX_POOL_2D", [np.maximum(_normal(1, 7, 7, 2) - 1.0, 0)],
     {"padding": "VALID", "stride_h": 2, "stride_w": 1, "filter_height": 3,
      "filter_width": 2, "fused_activation_function": "RELU"}),
    ("MAX_POOL_2D", [_normal(1, 8, 8, 2) - 3.0],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1, "filter_height": 3,
      "filter_width": 3, "fused_activation_function": "RELU6"}),
    ("CONCATENATION", [_normal(2, 3, 4), _normal(2, 1, 4), _normal(2, 2, 4)], {"axis": 1}),
    ("CONCATENATION", [_normal(2, 3), _normal(2, 5)], {"axis": -1}),
    ("SPLIT", [Const(1, "int32"), _normal(2, 6, 3)], {"num_splits": 3}),
    ("SPLIT", [Const(-1, "int32"), _normal(4, 4)], {"num_splits": 2}),
    ("SPLIT_V", [_normal(2, 7), Const([2, -1, 4], "int32"), Const(1, "int32")],
     {"num_splits": 3}),
    ("SLICE", [_normal(3, 5, 4), Const([1, 0, 2], "int32"), Const([2, -1, 2], "int32")], {}),
    ("STRIDED_SLICE", [_normal(4, 6, 5), Const([1, 0, 4], "int32"), Const([4, 6, 0], "int32"),
                       Const([2, 1, -2], "int32")], {"begin_mask": 2}),
    ("STRIDED_SLICE", [_normal(3, 8), Const([-2, -7], "int32"), Const([0, 100], "int32"),
                       Const([1, 3], "int32")], {"shrink_axis_mask": 1, "end_mask": 1}),
    ("STRIDED_SLICE", [_normal(2, 5, 3), Const([0, 1], "int32"), Const([2, 4], "int32"),
                       Const([1, 1], "int32")], {}),
    ("PAD", [_normal(2, 3, 4), Const([[0, 1], [2, 0], [1, 3]], "int32")], {}),
    ("PADV2", [_normal(3, 4), Const([[1, 1], [0, 2]], "int32"), _normal()], {}),
    ("GATHER", [_normal(7, 4), Const([[1, 3, 1], [0, 6, 1]], "int32")], {"axis": 0}),
    ("GATHER", [_normal(3, 5, 2), Const([4, 0, 4, 2], "int64")], {"axis": 1}),
    ("GATHER", [_normal(2, 3, 5), Const([[2, 2], [0, 4]], "int32")], {"axis": -1}),
    ("GATHER_ND", [_normal(6, 4), Const([[[1], [5]], [[1], [0]]], "int32")], {}),
    ("GATHER_ND", [_normal(3, 4, 2), Const([[2, 1], [0, 3], [2, 1]], "int64")], {}),
    ("GATHER_ND", [_normal(2, 3, 4), Const([[1, 2, 0], [0, 0, 3]], "int32")], {}),
    ("BATCH_MATMUL", [_normal(2, 3, 4), _normal(2, 4, 5)], {}),
    ("BATCH_MATMUL", [_normal(2, 1, 4, 3), _normal(3, 5, 4)],
     {"adjoint_lhs": True, "adjoint_rhs": True}),
    ("BATCH_MATMUL", [_normal(3, 4), _normal(2, 4, 5)], {}),
    ("BATCH_MATMUL", [_normal(2, 3, 3, 4), _normal(1, 3, 5, 4)], {"adjoint_rhs": True}),
    ("TRANSPOSE_CONV", [Const([2, 8, 7, 3], "int32"), _normal(3, 3, 3, 2),
                        _normal(2, 4, 4, 2)], {"padding": "SAME", "stride_h": 2, "stride_w": 2}),
    ("TRANSPOSE_CONV", [Const([1, 9, 6, 2], "int32"), _normal(2, 3, 2, 3),
                        _normal(1, 4, 5, 3), _normal(2)],
     {"padding": "VALID", "stride_h": 2, "stride_w": 1}),
    ("TRANSPOSE_CONV", [Const([2, 5, 5, 4], "int32"), _normal(4, 3, 3, 2),
                        _normal(2, 5, 5, 2)], {"padding": "SAME", "stride_h": 1, "stride_w": 1}),
    ("CONV_2D", [_normal(2, 9, 8, 3), _normal(4, 3, 2, 3), _normal(4)],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1, "dilation_h_factor": 2,
      "dilation_w_factor": 3}),
    ("CONV_2D", [_normal(1, 11, 9, 2), _normal(3, 3, 3, 2), _normal(3)],
     {"padding": "VALID", "stride_h": 2, "stride_w": 1, "dilation_h_factor": 2,
      "dilation_w_factor": 2}),
    ("DEPTHWISE_CONV_2D", [_normal(2, 9, 9, 2), _normal(1, 3, 3, 4), _normal(4)],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 2,
      "dilation_h_factor": 2, "dilation_w_factor": 2}),
    # one channel out per channel in (the transpose a DEPTHWISE_CONV_2D): dilated, and
    # strided with SAME padding of an even size (one more row after than before)
    ("DEPTHWISE_CONV_2D", [_normal(2, 9, 8, 3), _normal(1, 3, 2, 3), _normal(3)],
     {"padding": "SAME", "stride_h": 1, "stride_w": 1, "depth_multiplier": 1,
      "dilation_h_factor": 2, "dilation_w_factor": 3}),
    ("DEPTHWISE_CONV_2D", [_normal(1, 8, 10, 2), _normal(1, 3, 3, 2), _normal(2)],
     {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 1,
      "fused_activation_function": "RELU6"}),
    ("CONV_2D", [_normal(1, 8, 10, 2), _normal(3, 5, 4, 2), _normal(3)],
     {"padding": "SAME", "stride_h": 2, "stride_w": 3}),
    ("RESIZE_BILINEAR", [_normal(2, 5, 4, 3), Const([9, 7], "int32")], {}),
    ("RESIZE_BILINEAR", [_normal(1, 6, 5, 2), Const([11, 3], "int32")],
     {"align_corners": True}),
    ("RESIZE_BILINEAR", [_normal(1, 4, 6, 2), Const([7, 13], "int32")],
     {"half_pixel_centers": True}),
    ("RESIZE_NEAREST_NEIGHBOR", [_normal(2, 3, 5, 2), Const([7, 4], "int32")], {}),
    ("RESIZE_NEAREST_NEIGHBOR", [_normal(1, 5, 4, 2), Const([8, 9], "int32")],
     {"align_corners": True}),
    ("RESIZE_NEAREST_NEIGHBOR", [_normal(1, 5, 4, 2), Const([3, 9], "int32")],
     {"half_pixel_centers": True}),
    ("NEG", [_normal(3, 4)], {}),
    ("SQUARED_DIFFERENCE", [_normal(2, 3, 4), _normal(2, 3, 1)], {}),
    ("RSQRT", [np.abs(_normal(3, 4)) + 0.5], {}),
    ("SQRT", [np.abs(_normal(3, 4)) + 0.5], {}),
    ("SQUARE", [_normal(3, 4)], {}),
    ("EXP", [_normal(3, 4)], {}),
    ("LOG", [np.abs(_normal(3, 4)) + 0.5], {}),
    ("PRELU", [_normal(2, 3, 4), _normal(1, 4)], {}),
    ("MAXIMUM", [_normal(2, 3, 4), _normal(3, 1)], {}),
    # whole numbers: ties, whose cotangent goes to the first operand
    ("MINIMUM", [np.round(_normal(4, 5)), np.round(_normal(4, 5))], {}),
    ("MAXIMUM", [np.round(_normal(4, 5)), np.round(_normal(5))], {}),
]


@pytest.mark.parametrize("op_type,inputs,options", RULE_CASES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(RULE_CASES)])
def test_rule_is_the_vjp_of_the_reference_operator(op_type, inputs, options) -> None:
    b, feeds = one_op_model(op_type, inputs, options, outputs=options.get("num_splits", 1))
    forward = b.to_bytes("tflite")
    model = cj.load(forward, lowering="reference")
    ys, vjp = jax.vjp(lambda *xs: tuple(model.apply(model.params, *xs)), *feeds)
    gs = [_normal(*y.shape) for y in ys]
    expected = vjp(tuple(gs))
    graph, positions = rule_graph(forward)
    assert len(positions) == len(feeds)
    got = run_litert(graph, [*feeds, *gs])
    for k, (mine, ref) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(mine, np.asarray(ref), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{op_type} input {positions[k]}")


def _steps(export, feeds: list[np.ndarray], steps: int, builtin_kernels: bool = False
           ) -> tuple[list[float], dict]:
    """LiteRT runs the functional step ``steps`` times, each step's new state fed to the
    next; the per-step losses and the final state by name. Its default kernels (the XNNPACK
    delegate), or with ``builtin_kernels`` its own without a delegate."""
    from ai_edge_litert import interpreter as litert

    interp = litert.Interpreter(model_content=export.model, experimental_op_resolver_type=(
        litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES if builtin_kernels
        else litert.OpResolverType.AUTO))
    interp.allocate_tensors()
    ins, outs = interp.get_input_details(), interp.get_output_details()
    assert [d["name"] for d in ins] == list(export.inputs)
    state = list(export.state.values())
    losses = []
    for _ in range(steps):
        for d, v in zip(ins, [*feeds, *state]):
            interp.set_tensor(d["index"], np.asarray(v, d["dtype"]))
        interp.invoke()
        losses.append(float(interp.get_tensor(outs[0]["index"])))
        state = [interp.get_tensor(d["index"]).copy() for d in outs[1:]]
    return losses, dict(zip(export.state, state))


# name: (file, loss, learning rate); batch 32, or the declared one where the graph does not
# follow the batch
MODELS = {
    "torch_mlp": ("tests/data/torch/mlp.tflite", "mse", 1e-3),
    "planestrike": ("tfexamples_planestrike_mlp.tflite", "cce", 1e-3),
    # CONV_2D, MAX_POOL_2D, RESHAPE, FULLY_CONNECTED, SOFTMAX
    "onert_micro_mnist": ("onert_micro_simple_mnist_model.circle", "cce", 1e-3),
    # two convolution branches joined by ADD, pooling, a head
    "keras_branching_cnn": ("tests/data/keras/branching_cnn.tflite", "cce", 1e-3),
    # Keras LayerNormalization: MEAN, SQUARED_DIFFERENCE, RSQRT, NEG, MUL, ADD
    "keras_layernorm": ("tests/data/keras/layernorm.tflite", "cce", 1e-3),
    # Keras Embedding: GATHER of int32 token ids (the table trains)
    "keras_embedding": ("tests/data/keras/embedding.tflite", "cce", 1e-3),
    # torch attention at batch 1: SLICE, TRANSPOSE, rank-3 BATCH_MATMUL, SOFTMAX, MEAN
    "torch_attention": ("tests/data/torch/attention.tflite", "mse", 1e-3),
    # one TRANSPOSE_CONV with bias
    "aeq_transpose_conv": ("aeq_single_conv2d_transpose_bias.tflite", "mse", 1e-3),
    # a text classifier: GATHER of word ids, MEAN over the words
    "movie_review": ("tflite_support_movie_review_text.tflite", "cce", 1e-3),
}


def _data(model: cj.Model, batch: int, loss: str, rng: np.random.Generator
          ) -> tuple[np.ndarray, np.ndarray]:
    """Random inputs (int inputs: ids in [0, 5)) and targets (one-hot rows for ``cce``)."""
    spec = model.inputs[0]
    shape = (batch, *spec.shape[1:])
    x = (rng.uniform(-1, 1, shape).astype(np.float32)
         if np.issubdtype(np.dtype(spec.dtype), np.floating)
         else rng.integers(0, 5, shape).astype(spec.dtype))
    out = (batch, *model.outputs[0].shape[1:])
    y = (np.eye(out[-1], dtype=np.float32)[rng.integers(0, out[-1], out[:-1])]
         if loss == "cce" else rng.standard_normal(out).astype(np.float32))
    return x, y


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_litert_trains_the_exported_step_as_fit_does(name: str, optimizer: str) -> None:
    path, loss, lr = MODELS[name]
    model = cj.load(f"{REPO_ROOT}/{path}" if path.startswith("tests/") else shared_model(path))
    batch = 32 if model.batch_blocker is None else model.inputs[0].shape[0]
    steps = 20
    x, y = _data(model, batch, loss, np.random.default_rng(1))
    config = dict(loss=loss, optimizer=optimizer, learning_rate=lr, batch_size=batch)
    _same_training(model, export_training_graph(model, **config), x, y, steps, config)


def _same_training(model: cj.Model, export, x: np.ndarray, y: np.ndarray, steps: int,
                   config: dict, **fit_options) -> set[str]:
    """LiteRT's ``steps`` runs of the export: the per-step losses and final weights of
    ``fit`` (1e-5 relative: float32 rounding of two summation orders over 20 steps), every
    weight of the state changed, the loss down; the weights of the state."""
    losses, state = _steps(export, [x, y], steps)
    ref = cj.fit(model, x, y, epochs=steps, **config, **fit_options)
    np.testing.assert_allclose(losses, ref.history.loss, rtol=1e-5)
    weights = {n for n in state if n in ref.params}
    assert weights >= (set() if fit_options else set(model.trainable_params)) and weights
    for param in weights:
        w, w_ref = state[param], np.asarray(ref.params[param])
        assert np.max(np.abs(w - w_ref)) <= 1e-5 * np.max(np.abs(w_ref)), param
        assert not np.array_equal(w, np.asarray(ref.model.params[param])), \
            f"{param} did not train"
    assert losses[-1] < losses[0]
    return weights


def test_new_heads_and_lora_adapters_export_their_steps() -> None:
    """``Model.personalize``'s new head (Adam) and LoRA adapters (SGD) on the plane-strike
    MLP: the export of the personalized model trains as ``fit(..., new_head=K)`` and
    ``fit(..., lora=R)`` do; its state holds the personal params, not the frozen base.
    (LoRA under Adam agrees to 4e-5 only: Adam scales each element's step by its gradient's
    size, and the adapters' elements whose gradients are float32 rounding amplify it.)"""
    base = cj.load(shared_model("tfexamples_planestrike_mlp.tflite"))
    rng = np.random.default_rng(4)
    for options, optimizer in (({"new_head": 5}, "adam"), ({"lora": 2}, "sgd")):
        model = base.personalize(**options)
        x, y = _data(model, 16, "cce", rng)
        config = dict(loss="cce", optimizer=optimizer, learning_rate=1e-3, batch_size=16)
        weights = _same_training(base, export_training_graph(model, **config), x, y, 20,
                                 config, **options)
        assert weights == set(model.personal_params) - set(model.adapters.values()), options


@pytest.mark.slow
def test_mobilenet_step_takes_fits_gradient_from_the_same_params() -> None:
    """MobileNet v1 0.25/128 at batch 2 (1001 classes, CCE on its probabilities): after 3 of
    fit's Adam steps, one exported SGD step at learning rate 1 from fit's params moves each
    weight by fit's gradient to 1e-5 of its largest element (measured 3.6e-6). Over 20
    steps at this batch the two trajectories part (float32 rounding amplified by training
    itself: losses 1e-6 apart at step 4, 5e-3 at step 20 on the VWW MobileNet), so the
    gradients are compared from one point."""
    model = cj.load(shared_model("mobilenet_v1_0.25_128_float.tflite"))
    x, y = _data(model, 2, "cce", np.random.default_rng(3))
    config = dict(loss="cce", batch_size=2)
    start = {k: np.asarray(v) for k, v in cj.fit(model, x, y, epochs=3, optimizer="adam",
                                                learning_rate=1e-3, **config).params.items()}
    export = export_training_graph(model, params=start, optimizer="sgd", learning_rate=1.0,
                                   **config)
    losses, state = _steps(export, [x, y], 1)
    ref = cj.fit(model, x, y, epochs=1, params=start, optimizer="sgd", learning_rate=1.0,
                 **config)
    assert losses[0] == pytest.approx(ref.history.loss[0], rel=1e-5)
    for param in model.trainable_params:
        mine, theirs = start[param] - state[param], start[param] - np.asarray(ref.params[param])
        assert np.max(np.abs(mine - theirs)) <= 1e-5 * np.max(np.abs(theirs)), param


@pytest.mark.slow
def test_litert_trains_the_hand_recrop_step_as_fit_does() -> None:
    """MediaPipe's hand re-crop model at its batch 1 (PRELU, PAD, STRIDED_SLICE, MAX_POOL_2D,
    DEPTHWISE_CONV_2D, a regression output of pixel scale: learning rate 1e-8, SGD; Adam
    agrees to 1.1e-5 only, its per-element scaling amplifying the rounding of tiny
    gradients)."""
    model = cj.load(shared_model("mediapipe_hand_recrop_fp32.tflite"))
    x, y = _data(model, 1, "mse", np.random.default_rng(3))
    config = dict(loss="mse", optimizer="sgd", learning_rate=1e-8, batch_size=1)
    _same_training(model, export_training_graph(model, **config), x, y, 20, config)


@pytest.mark.parametrize("optimizer,kwargs", [("sgd", {"momentum": 0.5}),
                                               ("nesterov", {}),
                                               ("sgd", {"momentum": 0.8, "nesterov": True})])
def test_momentum_and_nesterov_train_as_fit_does(optimizer: str, kwargs: dict) -> None:
    """SGD with momentum as the optimizer's keyword, and Nesterov's (the ``nesterov`` code,
    momentum 0.9; the keyword): one slot per weight, named ``<param>/momentum``."""
    model = cj.load(f"{REPO_ROOT}/tests/data/keras/branching_cnn.tflite")
    x, y = _data(model, 8, "cce", np.random.default_rng(5))
    config = dict(loss="cce", optimizer=optimizer, learning_rate=0.01, batch_size=8,
                  optimizer_kwargs=kwargs)
    export = export_training_graph(model, **config)
    assert [n for n in export.state if n not in model.params] == \
        [f"{n}/momentum" for n in export.state if n in model.params]
    _same_training(model, export, x, y, 20, config)


def test_the_wof_holds_the_initial_state_at_its_tensors() -> None:
    model = cj.load(f"{REPO_ROOT}/tests/data/torch/mlp.tflite")
    export = export_training_graph(model, optimizer="adam", batch_size=4)
    graph = read_model(export.model).main
    buffers = decode_wof(export.wof, len(graph.tensors))
    by_name = {t.name: t.index for t in graph.tensors}
    for name, value in export.state.items():
        raw = buffers[by_name[name]]
        assert raw is not None and raw.tobytes() == np.ascontiguousarray(value).tobytes(), name
    assert sum(b is not None for b in buffers) == len(export.state)
    assert export.inputs[:2] == (model.inputs[0].name, "target")
    assert export.outputs == ("loss", *(f"new/{n}" for n in export.state))
    assert list(export.state)[-1] == "adam/step" and graph.tensors[by_name["adam/step"]].dtype \
        == "int32"


def _chain(first: str, second: str) -> bytes:
    """x -> ``first`` -> FULLY_CONNECTED (trainable) -> ``second`` -> output."""
    b = Builder()
    x = b.input("x", (1, 6))
    h = b.op(first, [x])
    w = b.constant("w", _normal(6, 6))
    y = b.op("FULLY_CONNECTED", [h, w, b.constant("bias", _normal(6))])
    b.output(b.op(second, [y]))
    return b.to_bytes("tflite")


def test_operators_without_a_rule_on_the_path_are_refused_in_one_line() -> None:
    model = cj.load(_chain("HARD_SWISH", "HARD_SWISH"))
    with pytest.raises(UnsupportedOperatorError) as e:
        export_training_graph(model, batch_size=2)
    message = str(e.value)
    assert "\n" not in message and "HARD_SWISH #2" in message
    assert "HARD_SWISH #0" not in message  # the frozen prefix needs no rule


def test_a_split_whose_first_part_the_loss_does_not_read() -> None:
    """x -> FULLY_CONNECTED -> SPLIT into 3 -> the loss reads part 1 only: the parts it
    does not read get zero cotangents (`Backward.cotangent`), and the step trains as fit."""
    b = Builder()
    x = b.input("x", (1, 4))
    h = b.op("FULLY_CONNECTED", [x, b.constant("w", _normal(6, 4)), b.constant("bias",
                                                                               _normal(6))])
    parts = b.op("SPLIT", [b.constant("axis", np.int32(1)), h], {"num_splits": 3}, outputs=3)
    b.output(parts[1])
    model = cj.load(b.to_bytes("tflite"))
    x, y = _normal(4, 4), _normal(4, 2)
    config = dict(loss="mse", optimizer="sgd", learning_rate=0.1, batch_size=4)
    _same_training(model, export_training_graph(model, **config), x, y, 5, config)


def test_every_operator_without_a_rule_is_named() -> None:
    """Two operators without a rule on the path, and one whose rule refuses its options
    (STRIDED_SLICE's new-axis mask): all three in the one line, nothing built."""
    b = Builder()
    x = b.input("x", (1, 6))
    h = b.op("FULLY_CONNECTED", [x, b.constant("w", _normal(6, 6)), -1])
    h = b.op("STRIDED_SLICE", [h, b.constant("begin", np.zeros(2, np.int32)),
                               b.constant("end", np.array([1, 6], np.int32)),
                               b.constant("strides", np.ones(2, np.int32))],
             {"new_axis_mask": 0, "ellipsis_mask": 1})
    b.output(b.op("GELU", [b.op("HARD_SWISH", [h])]))
    model = cj.load(b.to_bytes("tflite"))
    with pytest.raises(UnsupportedOperatorError) as e:
        export_training_graph(model, batch_size=1, loss="mse")
    message = str(e.value)
    assert "\n" not in message and "3 operator(s)" in message
    for named in ("STRIDED_SLICE #1 (ellipsis, new-axis or offset masks)", "HARD_SWISH #2",
                  "GELU #3"):
        assert named in message, message


def test_a_frozen_prefix_needs_no_rule() -> None:
    model = cj.load(_chain("HARD_SWISH", "TANH"))
    export = export_training_graph(model, batch_size=2, learning_rate=0.1)
    x = _normal(2, 6)
    y = _normal(2, 6)
    losses, _ = _steps(export, [x, y], 3)
    ref = cj.fit(model, x, y, epochs=3, batch_size=2, learning_rate=0.1)
    np.testing.assert_allclose(losses, ref.history.loss, rtol=1e-5)


def test_what_the_step_cannot_take_is_refused() -> None:
    model = cj.load(f"{REPO_ROOT}/tests/data/torch/mlp.tflite")
    with pytest.raises(ConfigError, match="takes sgd, momentum, nesterov or adam"):
        export_training_graph(model, optimizer="rmsprop")
    with pytest.raises(ConfigError, match="nesterov=True needs a non-zero momentum"):
        export_training_graph(model, optimizer="sgd", optimizer_kwargs={"nesterov": True})
    with pytest.raises(ConfigError, match="nothing trains"):
        export_training_graph(model, trainable=0)


def test_litert_trains_the_signatures_packaging_as_fit_does() -> None:
    """Resource variables through CALL_ONCE: ``train`` 20 times = fit; ``save`` returns the
    trained weights, ``infer`` computes with them, ``restore`` puts the initial state back
    (the next ``train`` gives the first step's loss again)."""
    from ai_edge_litert import interpreter as litert

    model = cj.load(shared_model("tfexamples_planestrike_mlp.tflite"))
    rng = np.random.default_rng(2)
    x = rng.uniform(-1, 1, (16, 8, 8)).astype(np.float32)
    y = np.eye(64, dtype=np.float32)[rng.integers(0, 64, 16)]
    config = dict(loss="cce", optimizer="adam", learning_rate=0.001, batch_size=16)
    export = export_training_graph(model, packaging="signatures", **config)
    assert export.wof is None
    interp = litert.Interpreter(model_content=export.model)
    assert set(interp.get_signature_list()) == {"train", "infer", "save", "restore"}
    names = {op.type for sg in read_model(export.model).subgraphs for op in sg.operators}
    assert {"CALL_ONCE", "VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"} <= names
    assert not any(n == "CUSTOM" for n in names)
    train = interp.get_signature_runner("train")
    losses = [float(train(flatten_input=x, target=y)["loss"]) for _ in range(20)]
    ref = cj.fit(model, x, y, epochs=20, **config)
    np.testing.assert_allclose(losses, ref.history.loss, rtol=1e-5)
    saved = interp.get_signature_runner("save")()
    assert set(saved) == set(export.state)
    for param in model.trainable_params:
        w_ref = np.asarray(ref.params[param])
        assert np.max(np.abs(saved[param] - w_ref)) <= 1e-5 * np.max(np.abs(w_ref)), param
    (out,) = interp.get_signature_runner("infer")(flatten_input=x[:1]).values()
    np.testing.assert_allclose(out, model.apply(ref.params, x[:1])[0], rtol=RTOL, atol=ATOL)
    interp.get_signature_runner("restore")(**export.state)
    assert float(train(flatten_input=x, target=y)["loss"]) == pytest.approx(losses[0], rel=1e-6)


@pytest.mark.parametrize("packaging", ["signatures", "functional"])
def test_the_export_stores_each_constant_once(packaging: str) -> None:
    """The plane-strike MLP with its last layer trained under Adam: the frozen weights,
    read by both ``train`` and ``infer``, and the zero-initialised slots of equal shapes
    are stored once (no two buffers hold equal bytes); ``infer`` still computes with them."""
    from circle_jax.formats.reader import unpack

    model = cj.load(shared_model("tfexamples_planestrike_mlp.tflite"))
    export = export_training_graph(model, packaging=packaging, loss="cce", optimizer="adam",
                                   learning_rate=1e-3, batch_size=4, trainable=2)
    stored = [b.data.tobytes() for b in unpack(export.model).buffers if b.data is not None]
    assert len(stored) == len(set(stored))
    if packaging == "signatures":
        from ai_edge_litert import interpreter as litert

        x = np.random.default_rng(4).uniform(-1, 1, (1, 8, 8)).astype(np.float32)
        infer = litert.Interpreter(model_content=export.model).get_signature_runner("infer")
        (out,) = infer(flatten_input=x).values()
        np.testing.assert_allclose(out, model.apply(model.params, x)[0], rtol=RTOL, atol=ATOL)


def test_every_reshape_of_the_step_takes_its_shape_as_an_input() -> None:
    """A RESHAPE of one input (its shape in the options only, as MediaPipe's face detector
    writes them) is written with its shape at the training batch as a second input, which
    onert's loader wants; LiteRT trains the step as fit does."""
    b = Builder()
    x = b.input("x", (1, 2, 3))
    flat = b.op("RESHAPE", [x], {"new_shape": [1, 6]}, shapes=[(1, 6)])
    b.output(b.op("FULLY_CONNECTED", [flat, b.constant("w", _normal(4, 6)),
                                      b.constant("b", _normal(4))]))
    model = cj.load(b.to_bytes("tflite"))
    assert len(model.ir.main.operators[0].inputs) == 1
    export = export_training_graph(model, loss="mse", batch_size=3, learning_rate=0.1)
    graph = read_model(export.model).main
    reshapes = [op for op in graph.operators if op.type == "RESHAPE"]
    assert reshapes and all(len(op.inputs) == 2 and op.inputs[1] >= 0 for op in reshapes)
    assert graph.tensors[reshapes[0].inputs[1]].data.tolist() == [3, 6]
    xs, y = _normal(3, 2, 3), _normal(3, 4)
    losses, _ = _steps(export, [xs, y], 3)
    ref = cj.fit(model, xs, y, epochs=3, loss="mse", batch_size=3, learning_rate=0.1)
    np.testing.assert_allclose(losses, ref.history.loss, rtol=1e-5)
