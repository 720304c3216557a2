"""Digests of 15 training runs, to check that a change to the training step computes the same
values bit for bit: per run its per-epoch losses in hex and digests of the final params and
optimizer state.

    python benchmarks/step_digests.py > before.txt   # on the tree before the change
    python benchmarks/step_digests.py > after.txt    # after; then: diff before.txt after.txt

The runs cover the step's transforms and drivers: SGD/MSE, Adam/CCE, shuffle with a
validation split, stream and in-step accumulation, mixed bfloat16 with a dynamic loss scale,
partial training, a trailing partial batch, momentum, a new head with LoRA, QAT with moving
ranges, Keras's sparse Adam on an embedding, the checkpoint driver (save mid-epoch, resume)
and `make_train_step` jitted. Digests depend on the machine (XLA's CPU code): compare runs
on one machine only. Not a test.
"""
import hashlib
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import circle_jax as cj  # noqa: E402
from circle_jax.checkpoints import fit_checkpointed  # noqa: E402
from circle_jax.train import Trainer, fit, make_train_step  # noqa: E402
from tests.paths import shared_model  # noqa: E402
from tests.toy_models import cnn, reshape_mlp, token_model, toy_data  # noqa: E402

QDATA = ROOT / "tests" / "data" / "quantized"


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(tree)):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def report(name, r):
    losses = [float(v).hex() for v in r.history.loss]
    print(name, losses, digest(r.params), digest(r.state.opt_state), flush=True)


x, y = toy_data(40)
m = reshape_mlp()
report("sgd_mse", fit(m, x, y, epochs=2, batch_size=8, learning_rate=0.05))
report("adam_cce", fit(m, x, y, epochs=2, batch_size=8, loss="cce", optimizer="adam"))
report("shuffle_val", fit(m, x, y, epochs=2, batch_size=8, loss="cce", shuffle=True,
                          validation_split=0.2, seed=3))
report("acc_stream", fit(m, x, y, epochs=2, batch_size=4, accumulate=2, optimizer="adam"))
report("acc_in_step", fit(m, x, y, epochs=2, batch_size=8, accumulate=2,
                          accumulate_mode="in_step", optimizer="adam"))
report("mixed_bf16_scale", fit(m, x, y, epochs=2, batch_size=8, precision="mixed_bfloat16",
                               loss_scale="dynamic", optimizer="adam", loss="cce"))
report("partial_1", fit(m, x, y, epochs=2, batch_size=8, trainable=2, optimizer="adam"))
report("tail", fit(m, x, y, epochs=2, batch_size=16, drop_remainder=False, loss="cce"))
report("momentum", fit(m, x, y, epochs=2, batch_size=8, optimizer="sgd",
                       optimizer_kwargs={"momentum": 0.9}))
toy = cj.load(cnn().to_bytes("circle"))
xc = np.random.default_rng(1).random((16, *toy.inputs[0].shape[1:]), dtype=np.float32)
yc = np.eye(3, dtype=np.float32)[np.arange(16) % 3]
report("new_head_lora", fit(toy, xc, yc, new_head=3, lora=2, lora_targets="conv", epochs=2,
                            batch_size=8, loss="cce", optimizer="adam", seed=1))
qat = cj.load(QDATA / "full_int8_float_io.tflite", qat=True, qat_ranges="ema",
              qat_range_decay=0.5)
xq = np.random.default_rng(2).random((16, *qat.inputs[0].shape[1:]), dtype=np.float32)
yq = np.random.default_rng(3).random((16, *qat.outputs[0].shape[1:]), dtype=np.float32)
report("qat_ema", fit(qat, xq, yq, epochs=2, batch_size=8, learning_rate=0.05))
tok = token_model(numerics="keras")
xt = np.random.default_rng(4).integers(0, 11, (12, 5)).astype(np.int32)
yt = np.random.default_rng(5).integers(0, 11, (12, 5)).astype(np.int32)
report("sparse_adam", fit(tok, xt, yt, epochs=2, batch_size=1,
                          loss="sparse_categorical_crossentropy", optimizer="adam"))
mn = cj.load(shared_model("onert_micro_simple_mnist_model.circle"))
rng = np.random.default_rng(0)
xm = rng.random((40, 11, 11, 1), dtype=np.float32)
ym = np.eye(2, dtype=np.float32)[rng.integers(0, 2, 40)]
with tempfile.TemporaryDirectory() as d:
    tr = Trainer(mn, epochs=1, batch_size=4, learning_rate=0.01, loss="cce", optimizer="adam")
    a = fit_checkpointed(mn, xm, ym, trainer=tr, save=Path(d) / "r.ckpt", every_steps=5)
    b = fit_checkpointed(mn, xm, ym, trainer=tr, resume=Path(d) / "r.ckpt",
                         save=Path(d) / "r.ckpt")
    report("checkpoint_a", a)
    report("checkpoint_b", b)
init, step, _ = make_train_step(m, batch_size=8, loss="cce", optimizer="adam")
s = jax.jit(init)(None)
for i in range(0, 24, 8):
    s, met = jax.jit(step)(s, ((x[i:i + 8],), y[i:i + 8]))
print("make_train_step", float(met.loss).hex(), digest(s))
