"""Build small PyTorch models, convert them with litert-torch, record torch's training losses.

Run by hand, never by CI: it needs torch and litert-torch, which the project does not depend
on. Use a virtualenv of its own (torch from PyPI is large; PyPI serves the CUDA build, which
runs on the CPU):

    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch litert-torch
    /work/venv-torch/bin/python scripts/make_torch_models.py [--out tests/data/torch]

For every case it builds a seeded torch model in eval mode, converts it with litert-torch
(float32, batch 1, torch's own NCHW layout) and writes `<case>.tflite`. It then trains fresh
copies of the model with torch for {mse, cce} x {sgd, adam} x batch {1, 16}, 3 epochs, lr 0.01,
no shuffling, and records each epoch's loss (the mean of the pre-update batch losses, as
onert_train and Keras report) in `torch_losses.json`, with the versions and the operators the
converter wrote. Losses: `nn.MSELoss()` on the one-hot targets, `nn.CrossEntropyLoss()` on the
labels (logits in). Optimizers: `torch.optim.SGD(lr=0.01)`, `torch.optim.Adam(lr=0.01)` (eps
1e-8). The inputs and one-hot targets go to `data.npz`.

A BatchNorm is folded by the converter into the convolution before it (w * s, (b - mean) * s
+ beta, s = gamma / sqrt(var + eps)): the file's function trains as "folded", a torch model
holding the folded convolution and no BatchNorm. The source model, whose conv weight w sits
behind the BatchNorm (eval mode: running statistics frozen, gamma and beta trained), trains
another function; its losses are recorded as "source" runs, to measure how far apart they are.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import Counter
from pathlib import Path

import litert_torch
import numpy as np
import torch
from ai_edge_litert.interpreter import Interpreter
from torch import nn

N_SAMPLES = 32
N_CLASSES = 10
EPOCHS = 3
LR = 0.01
LOSSES = ("mse", "cce")
OPTIMIZERS = ("sgd", "adam")
BATCHES = (1, 16)


class MLP(nn.Module):
    """64 -> 32 (ReLU) -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    """NCHW [1, 3, 8, 8] input; Conv2d(3 -> 4) + BatchNorm2d + ReLU, Conv2d(4 -> 4, groups 4),
    2x2 max pool, Linear(64 -> 10). The BatchNorm holds non-trivial statistics and affine
    parameters so that folding it changes the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.fc = nn.Linear(64, N_CLASSES)
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.randn(4, generator=g) * 0.2)
            self.bn.running_var.copy_(torch.rand(4, generator=g) + 0.5)
            self.bn.weight.copy_(torch.rand(4, generator=g) + 0.5)
            self.bn.bias.copy_(torch.randn(4, generator=g) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.conv(x)))
        h = nn.functional.max_pool2d(torch.relu(self.dw(h)), 2)
        return self.fc(torch.flatten(h, 1))


class FoldedCNN(nn.Module):
    """`CNN` with its BatchNorm folded into the convolution: the function the file holds."""

    def __init__(self, src: CNN) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.dw, self.fc = copy.deepcopy(src.dw), copy.deepcopy(src.fc)
        bn = src.bn
        s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
        with torch.no_grad():
            self.conv.weight.copy_(src.conv.weight * s[:, None, None, None])
            self.conv.bias.copy_((src.conv.bias - bn.running_mean) * s + bn.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = nn.functional.max_pool2d(torch.relu(self.dw(h)), 2)
        return self.fc(torch.flatten(h, 1))


class Residual(nn.Module):
    """h = ReLU(Linear(16 -> 16)); out = Linear(ReLU(Linear(h) + h)): h feeds two branches."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.branch = nn.Linear(16, 16), nn.Linear(16, 16)
        self.head = nn.Linear(16, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        return self.head(torch.relu(self.branch(h) + h))


class Attention(nn.Module):
    """Self-attention over [1, 4, 8] (nn.MultiheadAttention, 2 heads), mean over the
    sequence, Linear(8 -> 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.att = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, N_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.att(x, x, x, need_weights=False)
        return self.head((a + x).mean(dim=1))


CASES = {"mlp": (MLP, (64,)), "cnn": (CNN, (3, 8, 8)), "residual": (Residual, (16,)),
         "attention": (Attention, (4, 8))}


def make_data(index: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Seeded inputs and one-hot targets given by a fixed random projection's argmax."""
    rng = np.random.default_rng(2000 + index)
    x = rng.standard_normal((N_SAMPLES, *shape)).astype(np.float32)
    proj = rng.standard_normal((int(np.prod(shape)), N_CLASSES))
    labels = np.argmax(x.reshape(N_SAMPLES, -1) @ proj, axis=1)
    return x, np.eye(N_CLASSES, dtype=np.float32)[labels]


def fit(model: nn.Module, x: np.ndarray, y: np.ndarray, loss: str, opt: str,
        batch: int) -> list[float]:
    """torch's own loop: per epoch the mean of the pre-update batch losses."""
    model = copy.deepcopy(model).eval()  # eval: the BatchNorm keeps its running statistics
    params = [p for p in model.parameters() if p.requires_grad]
    optim = (torch.optim.SGD(params, lr=LR) if opt == "sgd" else torch.optim.Adam(params, lr=LR))
    lossfn = nn.MSELoss() if loss == "mse" else nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    epochs = []
    for _ in range(EPOCHS):
        losses = []
        for s in range(len(x) // batch):
            bx, by = xt[s * batch:(s + 1) * batch], yt[s * batch:(s + 1) * batch]
            target = by if loss == "mse" else by.argmax(1)
            optim.zero_grad()
            value = lossfn(model(bx), target)
            value.backward()
            optim.step()
            losses.append(float(value))
        epochs.append(float(np.mean(losses)))
    return epochs


def operators(path: Path) -> list[str]:
    it = Interpreter(model_path=str(path))
    return [o["op_name"] for o in it._get_ops_details()]


def forward_gap(path: Path, model: nn.Module, x: np.ndarray) -> float:
    """Largest |LiteRT(tflite) - torch| on the first 4 samples (a check of the conversion)."""
    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    gap = 0.0
    for i in range(4):
        it.set_tensor(inp, x[i:i + 1])
        it.invoke()
        with torch.no_grad():
            ref = model(torch.from_numpy(x[i:i + 1])).numpy()
        gap = max(gap, float(np.abs(it.get_tensor(out) - ref).max()))
    return gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "tests/data/torch"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    import importlib.metadata as md

    record: dict = {
        "torch": torch.__version__, "litert_torch": md.version("litert-torch"),
        "ai_edge_litert": md.version("ai-edge-litert"), "numpy": np.__version__,
        "samples": N_SAMPLES, "epochs": EPOCHS, "learning_rate": LR, "shuffle": False,
        "losses": {"mse": "nn.MSELoss() on one-hot targets",
                   "cce": "nn.CrossEntropyLoss() on the labels (the model outputs logits)"},
        "optimizers": {"sgd": "torch.optim.SGD(lr=0.01)",
                       "adam": "torch.optim.Adam(lr=0.01), betas (0.9, 0.999), eps 1e-8"},
        "epoch_loss": "mean of the pre-update batch losses", "cases": {}, "failed": {},
    }
    arrays: dict[str, np.ndarray] = {}
    for index, (name, (build, shape)) in enumerate(CASES.items()):
        torch.manual_seed(index)
        model = build().eval()
        x, y = make_data(index, shape)
        path = out / f"{name}.tflite"
        try:
            litert_torch.convert(model, (torch.from_numpy(x[:1]),)).export(str(path))
        except Exception as e:  # noqa: BLE001 - record why a case does not convert
            record["failed"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            print(name, "does not convert:", record["failed"][name], flush=True)
            continue
        arrays[f"{name}/x"], arrays[f"{name}/y"] = x, y
        trained = FoldedCNN(model) if isinstance(model, CNN) else model
        case = {"doc": build.__doc__, "input_shape": [1, *shape],
                "operators": dict(Counter(operators(path))),
                "litert_vs_torch_forward_max_abs": forward_gap(path, model, x), "runs": {}}
        if trained is not model:
            case["source_runs"] = {}
        for loss in LOSSES:
            for opt in OPTIMIZERS:
                for batch in BATCHES:
                    key = f"{loss}/{opt}/{batch}"
                    case["runs"][key] = fit(trained, x, y, loss, opt, batch)
                    if trained is not model:
                        case["source_runs"][key] = fit(model, x, y, loss, opt, batch)
                    print(name, key, case["runs"][key], flush=True)
        record["cases"][name] = case
    (out / "torch_losses.json").write_text(json.dumps(record, indent=1) + "\n")
    np.savez_compressed(out / "data.npz", **arrays)


if __name__ == "__main__":
    main()
