"""The hand-written CPU kernels (`circle_jax.lowering.cpu_kernels`: the forward product and
weight gradient of the 3x3 depthwise convolution and of the 3x3 convolution of few input
channels) against the readable XLA forms they replace (`circle_jax.lowering.depthwise`'s
`shift_sum` and `weight_gradient`, `circle_jax.lowering.few_channels.im2col_conv` and its
autodiff) and a float64 numpy sum; where they apply and where the XLA form stays; their AD
rules; a kept program calling them loaded by a fresh process.

Tolerance: 2e-6 of the largest reference value. Both sides are float32 sums of at most
N * OH * OW products (the weight gradient) in another order; 2e-6 is about 16 float32
ulps, above the largest difference measured over these shapes (6.6e-7) and far below
any indexing error (a wrong tap or border is a difference of order 1)."""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import circle_jax as cj
from circle_jax.lowering import cpu_kernels
from circle_jax.lowering.depthwise import channelwise, shift_sum, weight_gradient
from circle_jax.lowering.few_channels import few_channels_conv, im2col_conv
from circle_jax.ops.conv import Geometry
from tests.paths import REPO_ROOT

FORWARD, WEIGHT_GRADIENT = "circle_jax_depthwise_forward", "circle_jax_depthwise_weight_gradient"
CONV_FORWARD, CONV_WEIGHT_GRADIENT = ("circle_jax_conv3x3_forward",
                                      "circle_jax_conv3x3_weight_gradient")
TOLERANCE = 2e-6


pytestmark = pytest.mark.usefixtures("cpu_kernels")


def _geometry(stride: int, pads: tuple) -> Geometry:
    return Geometry((3, 3), (stride, stride), (1, 1), pads)


def _numpy_taps(x: np.ndarray, g: Geometry, out: tuple[int, int]
                ) -> list[tuple[int, int, np.ndarray]]:
    """(ky, kx, the tap's [N, OH, OW, C] slice of the padded input) in float64."""
    (top, bottom), (left, right) = g.pads
    s = g.strides[0]
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    return [(ky, kx, xp[:, ky:ky + s * (out[0] - 1) + 1:s, kx:kx + s * (out[1] - 1) + 1:s])
            for ky in range(3) for kx in range(3)]


def _numpy(x: np.ndarray, w: np.ndarray, ct: np.ndarray, g: Geometry
           ) -> tuple[np.ndarray, np.ndarray]:
    """A depthwise convolution's (forward, weight gradient) in float64; w [9, C]."""
    out, dw = np.zeros(ct.shape), np.zeros(w.shape)
    for ky, kx, tap in _numpy_taps(x, g, ct.shape[1:3]):
        out += tap * w[3 * ky + kx]
        dw[3 * ky + kx] = np.sum(tap * ct, axis=(0, 1, 2))
    return out, dw


SHAPES = [  # (N, H, W, C), stride, ((top, bottom), (left, right))
    ((1, 5, 7, 3), 1, ((1, 1), (1, 1))),      # odd channels: one lane
    ((3, 8, 8, 8), 2, ((0, 1), (0, 1))),      # TFLite SAME at stride 2, even size
    ((2, 9, 6, 24), 2, ((1, 1), (1, 1))),     # 8 lanes
    ((9, 16, 16, 64), 1, ((1, 1), (1, 1))),   # 16 lanes, more samples than chunks
    ((4, 7, 7, 16), 1, ((0, 0), (0, 0))),     # VALID
    ((2, 4, 4, 256), 1, ((1, 1), (1, 1))),
    ((5, 10, 11, 12), 2, ((1, 2), (0, 1))),   # 4 lanes, uneven padding
    ((1, 1, 1, 4), 1, ((1, 1), (1, 1))),      # a 1x1 input: every tap but the centre pads
]


@pytest.mark.parametrize("shape, stride, pads", SHAPES, ids=str)
def test_the_kernels_compute_the_xla_forms(shape, stride, pads) -> None:
    g = _geometry(stride, pads)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((9, shape[-1])).astype(np.float32)
    forward = jax.jit(lambda x, w: channelwise(x, w, g))
    assert FORWARD in forward.lower(x, w).as_text()
    y = np.asarray(forward(x, w))
    ct = rng.standard_normal(y.shape).astype(np.float32)
    grad = jax.jit(jax.grad(lambda w: jnp.sum(channelwise(x, w, g) * ct)))
    assert WEIGHT_GRADIENT in grad.lower(w).as_text()
    dw = np.asarray(grad(w))
    want_y, want_dw = _numpy(x, w, ct, g)
    for got, xla, exact in ((y, shift_sum(x, w, g), want_y),
                            (dw, weight_gradient(x, ct, g), want_dw)):
        scale = np.abs(exact).max()
        assert np.abs(got - exact).max() <= TOLERANCE * scale
        assert np.abs(got - np.asarray(xla)).max() <= TOLERANCE * scale
    assert np.array_equal(dw, np.asarray(grad(w)))  # the same bits every call


def _numpy_conv(x: np.ndarray, w: np.ndarray, ct: np.ndarray, g: Geometry
                ) -> tuple[np.ndarray, np.ndarray]:
    """A full convolution's (forward, weight gradient) in float64; w [3, 3, I, O]."""
    out, dw = np.zeros(ct.shape), np.zeros(w.shape)
    for ky, kx, tap in _numpy_taps(x, g, ct.shape[1:3]):
        out += np.einsum("nhwi,io->nhwo", tap, w[ky, kx])
        dw[ky, kx] = np.einsum("nhwi,nhwo->io", tap, ct)
    return out, dw


CONV_SHAPES = [  # (N, H, W, I), O, stride, pads
    ((32, 64, 64, 3), 8, 2, ((0, 1), (0, 1))),  # MobileNet's first layer at half size
    ((2, 9, 7, 1), 5, 1, ((1, 1), (1, 1))),     # one input channel, odd outputs: one lane
    ((3, 8, 8, 4), 16, 1, ((0, 0), (0, 0))),    # 16 lanes, VALID
    ((9, 10, 11, 2), 12, 2, ((1, 1), (1, 1))),  # 4 lanes
    ((1, 1, 1, 3), 4, 1, ((1, 1), (1, 1))),
]


@pytest.mark.parametrize("shape, outputs, stride, pads", CONV_SHAPES, ids=str)
def test_the_few_channel_kernels_compute_im2col(shape, outputs, stride, pads) -> None:
    g = _geometry(stride, pads)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((3, 3, shape[-1], outputs)).astype(np.float32)
    forward = jax.jit(lambda x, w: few_channels_conv(x, w, g))
    assert CONV_FORWARD in forward.lower(x, w).as_text()
    y = np.asarray(forward(x, w))
    ct = rng.standard_normal(y.shape).astype(np.float32)

    def loss(conv):
        return lambda x, w: jnp.sum(conv(x, w, g) * ct)

    grads = jax.jit(jax.grad(loss(few_channels_conv), argnums=(0, 1)))
    assert CONV_WEIGHT_GRADIENT in grads.lower(x, w).as_text()
    dx, dw = map(np.asarray, grads(x, w))
    xla_dx, xla_dw = jax.grad(loss(im2col_conv), argnums=(0, 1))(x, w)
    want_y, want_dw = _numpy_conv(x, w, ct, g)
    for got, xla, exact in ((y, im2col_conv(x, w, g), want_y), (dw, xla_dw, want_dw),
                            (dx, xla_dx, None)):  # the input's gradient is im2col's
        scale = np.abs(np.asarray(xla) if exact is None else exact).max()
        if exact is not None:
            assert np.abs(got - exact).max() <= TOLERANCE * scale
        assert np.abs(got - np.asarray(xla)).max() <= TOLERANCE * scale


@pytest.mark.parametrize("geometry, dtype", [
    (Geometry((5, 5), (1, 1), (1, 1), ((2, 2), (2, 2))), np.float32),   # not 3x3
    (Geometry((3, 3), (1, 2), (1, 1), ((1, 1), (0, 1))), np.float32),   # unequal strides
    (Geometry((3, 3), (1, 1), (2, 2), ((2, 2), (2, 2))), np.float32),   # dilated
    (Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1))), np.float16),   # half precision
], ids=str)
def test_what_the_kernels_do_not_cover_lowers_through_xla(geometry, dtype) -> None:
    x = np.ones((2, 6, 6, 4), dtype)
    w = np.ones((geometry.kernel[0] * geometry.kernel[1], 4), dtype)
    step = jax.jit(jax.value_and_grad(lambda w: jnp.sum(channelwise(x, w, geometry))))
    text = step.lower(w).as_text()
    assert FORWARD not in text and WEIGHT_GRADIENT not in text


def test_float64_and_a_program_split_over_devices_lower_through_xla() -> None:
    """The depthwise weight gradient and the clamped layer's kernels, in a program on one
    CPU device only."""
    code = """
import ctypes
import os
import platform
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from circle_jax.lowering import cpu_kernels
from circle_jax.lowering.clamped import DEPTHWISE
from circle_jax.lowering.depthwise import channelwise
from circle_jax.ops.conv import Geometry
g = Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)))
b = np.zeros(4, np.float32)
loss = lambda w, x: jnp.sum(channelwise(x, w, g)) + jnp.sum(DEPTHWISE(x, w, b, g, 3) ** 2)
step = jax.jit(jax.grad(loss))
w, x = np.ones((9, 4), np.float32), np.ones((4, 6, 6, 4), np.float32)
assert cpu_kernels.available()
one = step.lower(w, x).as_text()
mesh = jax.make_mesh((2,), ("data",))
xs = jax.device_put(x, NamedSharding(mesh, P("data")))
split = step.lower(w, xs).as_text()
with jax.enable_x64(True):
    wide = step.lower(w.astype(np.float64), x.astype(np.float64)).as_text()
print([[t in text for t in cpu_kernels.TARGETS[1:4]] for text in (one, split, wide)])
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO_ROOT, timeout=300)
    assert p.stdout.strip() == str([[True] * 3, [False] * 3, [False] * 3]), p.stderr[-2000:]


def test_every_installed_level_is_registered_and_nothing_is_compiled() -> None:
    """The install built every level ``setup.py`` names for this machine (the kernels' files
    sit beside their sources), each from objects compiled for that level alone, the best
    one this CPU runs is loaded, and loading compiles nothing: the module runs no compiler."""
    levels = list(cpu_kernels.installed())
    want = [lv for lv in cpu_kernels.LEVELS if lv.startswith("x86_64")] \
        if platform.machine().lower() in ("x86_64", "amd64") else ["generic"]
    assert levels == want
    for level, path in cpu_kernels.installed().items():
        assert cpu_kernels.compiled_for(ctypes.CDLL(str(path))) == [level] * 2, level
    assert cpu_kernels.status().startswith("on: ") and cpu_kernels.status().endswith(
        f"({[lv for lv in levels if cpu_kernels.LEVELS[lv] <= cpu_kernels._cpu_flags()][0]})")
    source = open(cpu_kernels.__file__, encoding="utf-8").read()
    assert "subprocess" not in source and "os.system" not in source


_LEVEL_RUN = """
import sys, numpy as np, jax, jax.numpy as jnp
from circle_jax.lowering import cpu_kernels
from circle_jax.lowering.depthwise import channelwise
from circle_jax.lowering.clamped import DEPTHWISE, FEW_CHANNELS
from circle_jax.lowering.few_channels import few_channels_conv
from circle_jax.ops.conv import Geometry
assert cpu_kernels.status().endswith("(" + sys.argv[2] + ")"), cpu_kernels.status()
g = Geometry((3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)))
rng = np.random.default_rng(0)
x, ct = rng.standard_normal((8, 16, 16, 24), np.float32), rng.standard_normal((8, 8, 8, 24))
w, b = rng.standard_normal((9, 24), np.float32), rng.standard_normal(24, np.float32)
x3, w3 = x[..., :3], rng.standard_normal((3, 3, 3, 24), np.float32)
loss = lambda w, b, w3: (jnp.sum(channelwise(x, w, g) * ct) + jnp.sum(DEPTHWISE(x, w, b, g, 3) * ct)
                         + jnp.sum(few_channels_conv(x3, w3, g) * ct)
                         + jnp.sum(FEW_CHANNELS(x3, w3, b, g, 3) * ct))
value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(w, b, w3)
out = jax.jit(lambda x: DEPTHWISE(x, w, b, g, 3) + few_channels_conv(x[..., :3], w3, g))(x)
np.save(sys.argv[1], np.concatenate([np.ravel(value), *map(np.ravel, grads), np.ravel(out)]))
"""


def test_every_level_computes_the_same_bits(tmp_path) -> None:
    """No machine-dependent floats: each installed level this CPU runs (``-march`` levels,
    fused multiply-adds off) gives the same bits for the forward products, the clamped
    layers and every weight and bias gradient, channel counts of every lane width."""
    levels = [lv for lv in cpu_kernels.installed()
              if cpu_kernels.LEVELS[lv] <= cpu_kernels._cpu_flags()]
    for level in levels:
        env = {**os.environ, cpu_kernels.SWITCH: level}
        p = subprocess.run([sys.executable, "-c", _LEVEL_RUN, str(tmp_path / level), level],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
    bits = {lv: np.load(tmp_path / f"{lv}.npy").tobytes() for lv in levels}
    assert len(set(bits.values())) == 1, "levels differ"


def test_the_bits_do_not_depend_on_the_threads(tmp_path) -> None:
    """The weight gradients' sums over the batch (and the depthwise layer's bias gradient)
    add up in chunks the batch alone fixes:
    one CPU (``taskset -c 0``: XLA's intra-op pool of one thread) and all of them give the
    same bits."""
    code = f"""
import numpy as np, jax, jax.numpy as jnp
from circle_jax.lowering.depthwise import channelwise
from circle_jax.lowering.clamped import DEPTHWISE
from circle_jax.lowering.few_channels import few_channels_conv
from circle_jax.ops.conv import Geometry
g = Geometry((3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)))
rng = np.random.default_rng(0)
x, ct = rng.standard_normal((32, 16, 16, 8), np.float32), rng.standard_normal((32, 8, 8, 8))
w = rng.standard_normal((9, 8), np.float32)
dw = jax.jit(jax.grad(lambda w: jnp.sum(channelwise(x, w, g) * ct)))(w)
x3, w3 = x[..., :3], rng.standard_normal((3, 3, 3, 8), np.float32)
dw3 = jax.jit(jax.grad(lambda w: jnp.sum(few_channels_conv(x3, w, g) * ct)))(w3)
b = rng.standard_normal(8, np.float32)
dwb = jax.jit(jax.grad(lambda w, b: jnp.sum(DEPTHWISE(x, w, b, g, 3) * ct), argnums=(0, 1)))(w, b)
np.save({str(tmp_path)!r} + "/" + str(len(__import__("os").sched_getaffinity(0))) + ".npy",
        np.concatenate([np.ravel(dw), np.ravel(dw3), *map(np.ravel, dwb)]))
"""
    for prefix in (["taskset", "-c", "0"], []):
        p = subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True,
                           text=True, cwd=REPO_ROOT, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    files = sorted(os.listdir(tmp_path))
    assert files[0] == "1.npy" and len(files) == 2, files  # one CPU, then several
    assert np.load(tmp_path / files[0]).tobytes() == np.load(tmp_path / files[1]).tobytes()


@pytest.mark.parametrize("setting, why", [
    ({cpu_kernels.SWITCH: "0"}, "CIRCLE_JAX_CPU_KERNELS=0"),
    ({cpu_kernels.SWITCH: "x86_64_v9"},
     "CIRCLE_JAX_CPU_KERNELS=x86_64_v9 names no installed level"),
], ids=["switch", "no-such-level"])
def test_off_where_switched_off_or_not_installed(setting, why, tmp_path) -> None:
    """Off: the XLA forms, the same values (to float32 summation order), and why."""
    code = """
import numpy as np, jax, jax.numpy as jnp
from circle_jax.lowering import cpu_kernels
from circle_jax.lowering.depthwise import channelwise, weight_gradient
from circle_jax.ops.conv import Geometry
g = Geometry((3, 3), (1, 1), (1, 1), ((1, 1), (1, 1)))
x, ct = np.ones((2, 5, 5, 4), np.float32), np.ones((2, 5, 5, 4), np.float32)
grad = jax.jit(jax.grad(lambda w: jnp.sum(channelwise(x, w, g) * ct)))
w = np.ones((9, 4), np.float32)
assert cpu_kernels.TARGETS[1] not in grad.lower(w).as_text()
np.testing.assert_array_equal(grad(w), weight_gradient(x, ct, g))
print(cpu_kernels.available(), cpu_kernels.status(), "|", cpu_kernels.cache_key())
"""
    env = {**os.environ, **setting}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO_ROOT, timeout=120, env=env)
    assert p.stdout.strip().split(" | ")[0].startswith(f"False off: {why}"), p.stderr[-2000:]
    assert p.stdout.strip().split(" | ")[1].startswith("off:")


def test_off_where_the_install_built_none(monkeypatch, tmp_path) -> None:
    """An install without a C++ compiler has no libraries: off, saying so, and a kept
    program's key says it too."""
    monkeypatch.setattr(cpu_kernels, "LIBRARY_DIR", tmp_path)
    monkeypatch.setattr(cpu_kernels, "_state", None)
    monkeypatch.delenv(cpu_kernels.SWITCH, raising=False)
    assert cpu_kernels.installed() == {}
    path, why = cpu_kernels._choose()
    assert path is None and why.startswith("not built at install")
    assert cpu_kernels.cache_key() == f"off: {why}"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="the levels are x86-64's")
def test_a_library_of_another_levels_objects_is_refused(monkeypatch, tmp_path) -> None:
    """A library whose objects were compiled for another level (what a parallel build into
    one object folder linked) is not loaded: off, naming the levels found."""
    v3 = cpu_kernels.installed()["x86_64_v3"]
    (tmp_path / v3.name.replace("kernels_x86_64_v3", "kernels_x86_64")).write_bytes(
        v3.read_bytes())
    monkeypatch.setattr(cpu_kernels, "LIBRARY_DIR", tmp_path)
    monkeypatch.setattr(cpu_kernels, "_state", None)
    monkeypatch.setenv(cpu_kernels.SWITCH, "x86_64")
    assert cpu_kernels.status().startswith("off: kernels_x86_64.") and cpu_kernels.status(
        ).endswith("objects of levels ['x86_64_v3', 'x86_64_v3'], not x86_64 only "
                   "(reinstall to rebuild it)")
    assert not cpu_kernels.available() and cpu_kernels.cache_key().startswith("off: ")


@pytest.mark.slow  # a build or float64 AD traces: the slow tier (CI runs it)
def test_second_derivatives_and_per_sample_gradients() -> None:
    """The weight-gradient primitive's own transposes (w.r.t. the input and the output's
    cotangent) and its vmap rule, against autodiff of the reference `weight_gradient` in
    float64 (the XLA forms; the kernels' values are the test above)."""
    g = _geometry(2, ((0, 1), (1, 1)))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 7, 6, 5))
    w = rng.standard_normal((9, 5))
    with jax.enable_x64(True):
        ct = rng.standard_normal(np.shape(shift_sum(x, w, g)))

        def mixed(f):  # d/dx of <dL/dw, v>, L = <conv(x, w), ct>
            return jax.grad(lambda x: jnp.sum(jax.grad(lambda w: jnp.sum(f(x, w) * ct))(w)
                                              * w))(x)

        np.testing.assert_allclose(mixed(lambda x, w: channelwise(x, w, g)),
                                   mixed(lambda x, w: shift_sum(x, w, g)), rtol=1e-12)
        w4 = rng.standard_normal((3, 3, 5, 2))[:, :, :4]  # 4 input channels, 2 outputs
        x4, ct2 = x[..., :4], ct[..., :2]

        def mixed4(f):
            return jax.grad(lambda x: jnp.sum(jax.grad(lambda w: jnp.sum(f(x, w) * ct2))(w4)
                                              * w4))(x4)

        np.testing.assert_allclose(mixed4(lambda x, w: few_channels_conv(x, w, g)),
                                   mixed4(lambda x, w: im2col_conv(x, w, g)), rtol=1e-12)
        per_sample = jax.vmap(jax.grad(lambda w, x, c: jnp.sum(channelwise(x[None], w, g)
                                                              * c[None])),
                              in_axes=(None, 0, 0))(w, x, ct)
        want = [weight_gradient(x[i:i + 1], ct[i:i + 1], g) for i in range(3)]
        np.testing.assert_allclose(per_sample, np.stack(want), rtol=1e-12)

        def sample_loss(conv):
            return lambda w, x, c: jnp.sum(conv(x[None], w, g) * c[None])

        per_sample = jax.vmap(jax.grad(sample_loss(few_channels_conv)),
                              in_axes=(None, 0, 0))(w4, x4, ct2)
        want = [jax.grad(sample_loss(im2col_conv))(w4, x4[i], ct2[i]) for i in range(3)]
        np.testing.assert_allclose(per_sample, np.stack(want), rtol=1e-12)


@pytest.mark.slow  # a build or float64 AD traces: the slow tier (CI runs it)
def test_a_kept_program_with_kernels_runs_in_a_fresh_process(tmp_path) -> None:
    """Two runs of the command line with one compile cache: the second loads the kept
    epoch and trains the same bits: loading a kept program registers the kernels first."""
    b = cj.Builder("depthwise")
    rng = np.random.default_rng(0)
    x = b.input("x", (1, 8, 8, 4))
    h = b.op("DEPTHWISE_CONV_2D", [x, b.constant("dw/w", rng.standard_normal(
        (1, 3, 3, 4)).astype(np.float32)), b.constant("dw/b", np.zeros(4, np.float32))],
        {"padding": "SAME", "stride_h": 2, "stride_w": 2, "depth_multiplier": 1,
         "fused_activation_function": "RELU6"})
    f = b.op("RESHAPE", [h, b.constant("shape", np.array([1, 64], np.int32))])
    b.output(b.op("FULLY_CONNECTED", [f, b.constant("fc/w", rng.standard_normal(
        (3, 64)).astype(np.float32) * 0.1), b.constant("fc/b", np.zeros(3, np.float32))]))
    (tmp_path / "m.circle").write_bytes(b.to_bytes("circle"))
    np.save(tmp_path / "x.npy", rng.standard_normal((16, 8, 8, 4)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.standard_normal((16, 3)).astype(np.float32))
    outputs = []
    for run in range(2):
        out = tmp_path / f"out{run}.circle"
        argv = [sys.executable, "-m", "circle_jax.cli", "train", str(tmp_path / "m.circle"),
                "--load_input", str(tmp_path / "x.npy"), "--load_expected",
                str(tmp_path / "y.npy"), "--epoch", "2", "--batch_size", "4",
                "--compile_cache", str(tmp_path / "cache"), "--export_circle", str(out)]
        p = subprocess.run([*argv, "-v", "1"], capture_output=True, text=True, cwd=tmp_path,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        outputs.append(out.read_bytes())
    assert "loading the compiled training epoch from the cache" in p.stdout + p.stderr
    assert outputs[0] == outputs[1]
    assert any(f.endswith(".jaxexec") for f in os.listdir(tmp_path / "cache" / "programs"))
