"""Step-by-step comparison of onert's training with circle-jax's, from the same weights on
the same batches.

Both runtimes start from the model file's weights and take the same sequential batches
(onert_train's order, wrapping into the next epoch when ``steps`` asks for more). After every
step, onert's weights are read back from the model it exports (`circle_jax.interop.
onert_steps`) and compared, tensor by tensor, with circle-jax's; the losses are compared
too. Values agree when ``|a - b| <= atol + rtol * |b|`` elementwise (b: onert's); a NaN
or infinity agrees only with the same on the other side (`abs_diff`).

Rules of the comparison:

- A constant read by several operators is one tensor of the file. When circle-jax unties
  it (one copy per reader, the onert profile's default), onert's exported value is matched
  with the nearest copy (onert 0.1.0 writes the last reader's).
- The first divergence is the first step where a loss or a weight differs, and there the
  weight tensor read first in operator order; its ``operator`` is its reader (operators are
  named by their index in the file, as overlays key them). For a tensor
  with several readers trained as one (``tie_shared_weights``), circle-jax replays the
  steps with the tensor untied: when onert's value equals one reader's copy, that reader
  is named and the cause stated.
- The export check trains nothing: it compares onert's loss on the first batch after the
  last step (``train`` without update) with the loss circle-jax computes for the model
  onert exports, within `EXPORT_TOLERANCE`. It is reported apart from ``agree``.
- The float64 arbiter (``arbiter=True``) trains the same steps in float64 and says which
  runtime's weights are nearer (their largest distance to it), or that they tie when the
  two distances are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from ..errors import DataError
from ..formats.reader import read_model
from ..interop.onert_steps import PeerRefused, onert_steps
from ..lowering.interpreter import param_table
from ..model import Model, load
from ..train import TrainConfig, Trainer

__all__ = ["CompareReport", "PeerRefused", "Tolerance", "compare_with_onert"]


@dataclass(frozen=True)
class Tolerance:
    """Agreement of two float32 runs: ``|a - b| <= atol + rtol * |b|``. The defaults leave
    room for float32 sums taken in another order (relative error ~1e-6 per reduction,
    growing with the steps) while a different rule of training (a shared bias trained as one
    or per reader) moves weights by 1e-3 or more after one step."""

    atol: float = 1e-5
    rtol: float = 1e-4

    def close(self, a: Any, b: Any) -> bool:
        b = np.asarray(b, np.float64)
        if np.shape(a) != b.shape:
            return False
        with np.errstate(invalid="ignore"):  # inf * 0 where b is not finite: no tolerance
            room = np.where(np.isfinite(b), self.atol + self.rtol * np.abs(b), 0.0)
        return bool(np.all(abs_diff(a, b) <= room))


def abs_diff(a: Any, b: Any) -> np.ndarray:
    """``|a - b|`` in float64, where non-finite values agree only with themselves: 0 where
    both hold the same value (the same infinity) or both NaN, infinite where one is NaN
    or not finite and the other differs (two runs that diverge alike agree)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        d = np.abs(a - b)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))


@dataclass
class CompareReport:
    """The outcome; ``as_json()`` is the ``--report`` document.

    Attributes:
      agree: every step's loss and weights agree.
      first_divergence: None, or ``{step, tensor, operator, max_abs_diff, readers, cause}``.
      steps: per step ``{step, loss: {circle-jax, onert}, max_weight_diff, tensor}`` (and
        ``arbiter`` distances to float64 with ``arbiter=True``, and which runtime is
        ``nearer``: "circle-jax", "onert" or "tie").
      export: onert's trained loss, its export's loss, and whether they agree.
      settings: the hyper-parameters and tolerances used.
    """

    agree: bool
    first_divergence: dict[str, Any] | None
    steps: list[dict[str, Any]]
    export: dict[str, Any]
    settings: dict[str, Any]
    tensors: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"agree": self.agree, "first_divergence": self.first_divergence,
                "steps": self.steps, "export": self.export, "settings": self.settings,
                "tensor_diffs": self.tensors}

    def table(self) -> str:
        """The report for a terminal: one line per step, then the verdicts."""
        arb = any("arbiter" in s for s in self.steps)
        head = f"{'step':>5} {'loss circle-jax':>16} {'loss onert':>12} {'max |dw|':>10}"
        lines = [head + (f" {'cj-f64':>9} {'onert-f64':>9}" if arb else "") + "  tensor"]
        for s in self.steps:
            row = (f"{s['step']:>5} {s['loss']['circle-jax']:>16.6f} {s['loss']['onert']:>12.6f}"
                   f" {s['max_weight_diff']:>10.3g}")
            if arb:
                row += f" {s['arbiter']['circle-jax']:>9.2g} {s['arbiter']['onert']:>9.2g}"
            lines.append(row + f"  {s['tensor'] or '-'}")
        t = self.settings["tolerance"]
        if self.agree:
            lines.append(f"agree: {len(self.steps)} steps within atol {t['atol']:g} + rtol "
                         f"{t['rtol']:g}*|onert|")
        else:
            d = self.first_divergence or {}
            op = d.get("operator")
            lines.append(f"DISAGREE at step {d.get('step')}: tensor {d.get('tensor')!r}"
                         + (f" (operator {op})" if op is not None else
                            f" (read by operators {d.get('readers')})")
                         + f", max |diff| {d.get('max_abs_diff', 0):.3g}")
            if d.get("cause"):
                lines.append(f"  {d['cause']}")
        e = self.export
        lines.append(f"export: onert's trained loss {e['trained_loss']:.6f}, its exported "
                     f"model's {e['export_loss']:.6f}: " + (
                         "the export computes the trained function" if e["agree"] else
                         "the export is NOT the function onert trained"))
        if arb:
            last = self.steps[-1]["arbiter"]
            cj, on = _distinct(last["circle-jax"], last["onert"])
            lines.append(f"float64 arbiter after step {self.steps[-1]['step']}: circle-jax "
                         f"{cj} away, onert {on}: " + (
                             "they tie (equally near)" if last["nearer"] == "tie" else
                             f"{last['nearer']} is nearer"))
        return "\n".join(lines)


def compare_with_onert(
    source: str | bytes,
    x: Sequence[np.ndarray],
    y: np.ndarray,
    config: TrainConfig | None = None,
    *,
    steps: int | None = None,
    tolerance: Tolerance = Tolerance(),
    arbiter: bool = False,
    **load_options: Any,
) -> CompareReport:
    """Train ``source`` (a path or the file's bytes) with onert and with circle-jax, step by
    step, and compare (see the module docstring). ``x``: one array per model input, ``y``:
    output 0's targets; ``config``: the training settings (batch size, learning rate, loss,
    reduction, optimizer, trainable ops; circle+ values fill the rest); ``steps``: default
    ``config.epochs`` epochs where the config sets them, else one; ``load_options``:
    `circle_jax.load`'s (numerics, tie_shared_weights, ...).
    Raises `PeerRefused` when onert cannot run the case (its message quoted)."""
    raw = source if isinstance(source, bytes) else open(source, "rb").read()
    model = load(raw, **load_options)
    trainer = Trainer(model, config)
    codes = _onert_codes(model, trainer.config)
    xs, y = [np.asarray(a) for a in x], np.asarray(y)
    b, n = trainer.config.batch_size, y.shape[0]
    if n < b:
        raise DataError(f"{n} samples are fewer than one batch of {b}")
    steps = steps or n // b * (config.epochs if config is not None and config.epochs else 1)
    starts = [(s % (n // b)) * b for s in range(steps)]
    bx = [[a[i:i + b] for a in xs] for i in starts]
    by = [y[i:i + b] for i in starts]
    files = _file_tensors(raw, model)
    peer = onert_steps(raw, bx, by, sorted(files.values()), **codes)
    ours = _run(trainer, bx, by)
    rows, diffs, first = [], {}, None
    for s in range(steps):
        worst, bad = ("", 0.0), []
        for name, i in files.items():
            d, _ = _nearest(ours[s + 1], _copies(model, name), peer.weights[s + 1][i])
            diffs.setdefault(name, {})[str(s + 1)] = d
            if d >= worst[1]:
                worst = (name, d)
            if not _close_any(tolerance, ours[s + 1], _copies(model, name),
                              peer.weights[s + 1][i]):
                bad.append(name)
        loss = {"circle-jax": ours.loss[s], "onert": peer.loss[s]}
        rows.append({"step": s + 1, "loss": loss, "max_weight_diff": worst[1],
                     "tensor": worst[0] or None})
        loss_ok = tolerance.close(loss["circle-jax"], loss["onert"])
        if first is None and (bad or not loss_ok):
            first = _divergence(model, raw, trainer, s, bad, ours, peer, files, bx, by,
                                tolerance, load_options)
    report = CompareReport(
        agree=first is None, first_divergence=first, steps=rows,
        export=_export_check(peer, trainer, bx[0], by[0], load_options),
        settings={**_settings(trainer), "steps": steps, "onert": codes,
                  "tolerance": {"atol": tolerance.atol, "rtol": tolerance.rtol}},
        tensors=diffs)
    if arbiter:
        _arbitrate(report, model, trainer, bx, by, ours, peer, files)
    return report


@dataclass
class _Run:
    loss: list[float]
    weights: list[dict[str, np.ndarray]]

    def __getitem__(self, s: int) -> dict[str, np.ndarray]:
        return self.weights[s]


def _run(trainer: Trainer, bx: list, by: list, params: dict | None = None,
         dtype: Any = None) -> _Run:
    """circle-jax's steps: the losses and every param before the first and after each step
    (in ``dtype`` when given: the arbiter's float64)."""
    state, frozen = trainer.init(params)
    step = jax.jit(trainer.train_step)

    def cast(a: np.ndarray) -> np.ndarray:
        return a.astype(dtype) if dtype is not None and a.dtype.kind == "f" else a

    def weights() -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in {**frozen, **state.params}.items()}

    run = _Run([], [weights()])
    for xs, y in zip(bx, by):
        state, metrics = step(state, frozen, (tuple(cast(a) for a in xs), cast(y)))
        run.loss.append(float(metrics.loss))
        run.weights.append(weights())
    return run


def _onert_codes(model: Model, cfg: TrainConfig) -> dict[str, Any]:
    """onert_train's settings for ``cfg``, or `PeerRefused` naming what onert lacks."""
    from ..losses import LOSS_TABLE, get_reduction, loss_name
    from ..losses.reduction import REDUCTION_TABLE
    from ..optim import optimizer_name
    from ..optim.optimizers import OPTIMIZER_TABLE

    def code(table: Any, name: str) -> int:
        found = [c for c, n in table.codes.items() if n == name]
        if not found:
            raise PeerRefused(f"onert_train has no {table.what} {name!r} (it has "
                              f"{table.code_help()})")
        return found[0]

    lacks = [what for what, on in (("--shuffle", cfg.shuffle), ("--accumulate", cfg.accumulate
             > 1), ("--precision", cfg.precision not in (None, "float32", "fp32")),
             ("--loss_scale", cfg.loss_scale not in (None, "none")))
             if on]
    if lacks:
        raise PeerRefused(f"onert_train has no {', '.join(lacks)}")
    spec = cfg.trainable
    if isinstance(spec, str):
        spec = {"all": -1, "none": 0}[spec]
    if not isinstance(spec, int):
        raise PeerRefused("onert trains the last N operators only (--num_of_trainable_ops), "
                          "not named params")
    return {"learning_rate": cfg.learning_rate,
            "loss": code(LOSS_TABLE, loss_name(cfg.loss)),
            "reduction": code(REDUCTION_TABLE, get_reduction(cfg.reduction).value),
            "optimizer": code(OPTIMIZER_TABLE, optimizer_name(cfg.optimizer)),
            "trainable_ops": spec}


def _file_tensors(raw: bytes, model: Model) -> dict[str, int]:
    """Param name -> tensor index, for the float constants of the file's subgraph 0 (its
    own tensors; untied copies and added biases are the loaded model's)."""
    return {name: i for name, (k, i) in param_table(read_model(raw)).items()
            if k == 0 and name in model.param_keys}


def _copies(model: Model, name: str) -> list[str]:
    """``name`` and its untied copies."""
    return [name, *(new for new, old in model.rewrites.untied.items() if old == name)]


def _nearest(weights: dict[str, np.ndarray], names: list[str], value: np.ndarray
             ) -> tuple[float, str]:
    """(max |difference|, name) of the copy nearest ``value``."""
    return min((float(np.max(abs_diff(weights[n], value), initial=0.0)), n) for n in names)


def _close_any(tol: Tolerance, weights: dict[str, np.ndarray], names: list[str],
               value: np.ndarray) -> bool:
    return any(tol.close(weights[n], value) for n in names)


def _readers(model: Model, index: int) -> list[int]:
    """The operators of the main subgraph reading tensor ``index``, by their index in the
    file (what reports and overlays name; operators a pass added have none)."""
    return [op.origin for op in model.ir.main.operators
            if index in op.inputs and op.origin is not None]


def _divergence(model: Model, raw: bytes, trainer: Trainer, s: int, bad: list[str],
                ours: _Run, peer: Any, files: dict[str, int], bx: list, by: list,
                tol: Tolerance, load_options: dict[str, Any]) -> dict[str, Any]:
    """The first divergence at step ``s`` (0-based), localised (see the module docstring)."""
    if not bad:
        return {"step": s + 1, "tensor": None, "operator": None, "readers": [],
                "max_abs_diff": float(abs_diff(ours.loss[s], peer.loss[s])),
                "cause": "the losses differ while every weight agrees: the forward passes "
                         "differ"}
    name = min(bad, key=lambda n: min(_readers(model, files[n]) or [1 << 30]))
    i = files[name]
    readers = sorted({r for c in _copies(model, name)
                      for r in _readers(model, model.param_keys[c][1])})
    d, _ = _nearest(ours[s + 1], _copies(model, name), peer.weights[s + 1][i])
    found = {"step": s + 1, "tensor": name, "operator": readers[0] if len(readers) == 1 else
             None, "readers": readers, "max_abs_diff": d, "cause": None}
    if len(readers) > 1 and len(_copies(model, name)) == 1:
        reader = _untied_reader(raw, trainer, s, name, peer.weights[s + 1][i], bx, by,
                                tol, load_options)
        if reader is not None:
            found["operator"] = reader
            found["cause"] = (f"onert's update of {name!r} equals circle-jax's update of the "
                              f"copy read by operator {reader} alone: onert trains one copy "
                              "per reading operator (circle-jax's default; drop "
                              "--tie_shared_weights)")
    return found


def _untied_reader(raw: bytes, trainer: Trainer, s: int, name: str,
                   value: np.ndarray, bx: list, by: list, tol: Tolerance,
                   load_options: dict[str, Any]) -> int | None:
    """Replay steps 1..s+1 with ``name`` untied: the operator whose copy then equals
    onert's ``value``, or None."""
    untied = load(raw, **{**load_options, "tie_shared_weights": False})
    replay = _run(Trainer(untied, trainer.config), bx[:s + 1], by[:s + 1])
    for copy in _copies(untied, name):
        if tol.close(replay[s + 1][copy], value):
            return min(_readers(untied, untied.param_keys[copy][1]))
    return None


EXPORT_TOLERANCE = Tolerance(atol=1e-6, rtol=1e-5)
"""The export check compares two float32 forward passes from the same weights: only the
order of float32 sums differs (~1e-7 relative on these models)."""


def _export_check(peer: Any, trainer: Trainer, xs: list, y: np.ndarray,
                  load_options: dict[str, Any]) -> dict[str, Any]:
    exported = load(peer.exported, **{**load_options, "tie_shared_weights": True})
    ev = Trainer(exported, trainer.config)
    loss, _ = ev.evaluate(exported.params, xs, y, batch_size=len(y))
    return {"trained_loss": peer.final_loss, "export_loss": loss,
            "agree": EXPORT_TOLERANCE.close(loss, peer.final_loss)}


def _settings(trainer: Trainer) -> dict[str, Any]:
    c = trainer.config
    return {"batch_size": c.batch_size, "learning_rate": c.learning_rate,
            "numerics": trainer.model.numerics.as_dict(),
            "untied_copies": dict(trainer.model.rewrites.untied)}


def _arbitrate(report: CompareReport, model: Model, trainer: Trainer, bx: list, by: list,
               ours: _Run, peer: Any, files: dict[str, int]) -> None:
    """Add to every step the distance of each runtime's weights to float64 training."""
    with jax.enable_x64(True):
        wide = Trainer(model, replace(trainer.config, precision="float64"))
        ref = _run(wide, bx, by, dtype=np.float64)
    for s, row in enumerate(report.steps):
        cj = max(_nearest(ref[s + 1], [n], ours[s + 1][n])[0] for n in ours[s + 1]
                 if ours[s + 1][n].dtype.kind == "f")
        on = max(_nearest(ref[s + 1], _copies(model, n), peer.weights[s + 1][i])[0]
                 for n, i in files.items())
        row["arbiter"] = {"circle-jax": cj, "onert": on, "nearer": nearer(cj, on)}


def nearer(circle_jax: float, onert: float) -> str:
    """Which runtime's distance to float64 training is smaller: "circle-jax", "onert", or
    "tie" when the two are equal."""
    if circle_jax == onert:
        return "tie"
    return "circle-jax" if circle_jax < onert else "onert"


def _distinct(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` printed with 3 significant digits, or as many more as it takes for
    two different values not to print alike."""
    for digits in (3, 6, 9, 17):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb or a == b:
            return sa, sb
    return sa, sb
