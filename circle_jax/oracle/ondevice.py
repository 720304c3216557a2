"""An on-device training file's own step against circle-jax's autodiff of its ``infer``.

The file's ``train`` signature (TF's converter-made gradients and optimizer, run by
`circle_jax.signatures.Program`) and circle-jax's `Trainer` on ``load(path,
signature="infer")`` (autodiff, circle-jax's loss and optimizer as ``config`` names them)
start from the same variables (the file's initial values, or a checkpoint its restore reads)
and take the same batches: the train signature's inputs named as ``infer``'s take the model
inputs, its one other input the targets; batch ``s`` is samples ``s*B .. s*B+B`` of the
data (wrapping), ``B`` the file's batch. After every step, per variable circle-jax trains:

- the update, ``after - before``, of each side (float64 of the float32 values);
- the gradient: circle-jax's by autodiff at its own variables; the file's, recovered as
  ``-update / learning_rate`` when the optimizer is plain SGD (other optimizers' updates are
  no function of the gradient alone: only the updates are compared);
- the loss each side computed before its update.

Two values agree when ``max|a - b| <= rtol * max|b|`` (b: the file's), or when
``max|a - b|`` is within ``atol`` plus two float32 spacings of the variable's largest value
(an update is the difference of two float32 values, the new one rounded once; a recovered
gradient that divided by the learning rate). The first departure is the first step where
the loss or a variable's gradient or update departs, and there the first variable in the
order the file's train assigns them. Each side keeps its own trajectory (circle-jax's
optimizer state is its own), so float32 rounding compounds slowly over the steps: compare
few. A difference reported as 0 is within that floor.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError
from ..graph.variables import variables
from ..model import load
from ..optim import optimizer_name
from ..signatures import Program
from ..signatures.restore import restored_variables
from ..train import TrainConfig, Trainer


@dataclass(frozen=True)
class VariableStep:
    """One variable at one step: relative differences (None: not compared), the file's
    scales (max|value|), whether it departs."""

    variable: str
    gradient: float | None
    update: float
    gradient_scale: float | None
    update_scale: float
    departs: bool = False


@dataclass(frozen=True)
class StepCompare:
    step: int
    loss_file: float
    loss_circle_jax: float
    variables: tuple[VariableStep, ...]


@dataclass
class SignatureCompare:
    """The comparison (module docstring): per step, the losses and per variable the
    relative differences; ``first``: (step, variable or "loss", "gradient" / "update" /
    "loss") of the first departure, None when none."""

    train: str
    infer: str
    rtol: float
    atol: float
    gradients_compared: bool
    steps: list[StepCompare] = field(default_factory=list)
    first: tuple[int, str, str] | None = None

    @property
    def agree(self) -> bool:
        return self.first is None

    def table(self) -> str:
        """A printable report."""
        lines = [f"the file's {self.train!r} step against circle-jax's autodiff of "
                 f"{self.infer!r} (rtol {self.rtol:g}, atol {self.atol:g}; gradients "
                 + ("compared" if self.gradients_compared else "not recoverable from the "
                    "file's optimizer: updates only") + ")"]
        for s in self.steps:
            lines.append(f"step {s.step}: loss file {s.loss_file:.7g}, circle-jax "
                         f"{s.loss_circle_jax:.7g}")
            for v in s.variables:
                g = "-" if v.gradient is None else f"{v.gradient:.2e}"
                lines.append(f"  {v.variable:32} gradient {g:>9}  update {v.update:.2e}"
                             + ("  DEPARTS" if v.departs else ""))
        lines.append("agree" if self.first is None else
                     "first departure: step {}, {} ({})".format(*self.first))
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {"train": self.train, "infer": self.infer, "rtol": self.rtol, "atol": self.atol,
                "agree": self.agree, "first": self.first, "steps": [
                    {"step": s.step, "loss_file": s.loss_file,
                     "loss_circle_jax": s.loss_circle_jax,
                     "variables": [vars(v) for v in s.variables]} for s in self.steps]}


def _relative(a: Any, b: Any, floor: float, rtol: float) -> tuple[float, float, bool]:
    """(max|a - b| / max|b|, max|b|, whether they depart: the difference is over ``floor``
    and over ``rtol`` of max|b|)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    diff, scale = float(np.abs(a - b).max(initial=0.0)), float(np.abs(b).max(initial=0.0))
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))
    return rel, scale, diff > floor and rel > rtol


def _split_inputs(program: Program, train: str, infer: str) -> tuple[list[str], str]:
    """(train's inputs named as infer's, in infer's order; train's target input)."""
    sig, inf = program.signature_defs[train], program.signature_defs.get(infer)
    if inf is None:
        raise ConfigError(f"the model has no signature {infer!r}")
    shared = [n for n in inf.inputs if n in sig.inputs]
    others = [n for n in sig.inputs if n not in inf.inputs]
    if len(shared) != len(inf.inputs) or len(others) != 1:
        raise ConfigError(f"signature {train!r} takes {list(sig.inputs)}: expected "
                          f"{infer!r}'s inputs {list(inf.inputs)} and one target")
    if len(sig.outputs) != 1:
        raise ConfigError(f"signature {train!r} has outputs {list(sig.outputs)}: expected "
                          "one, the loss")
    return shared, others[0]


def compare_train_signature(source: str | os.PathLike, xs: Sequence[Any], y: Any,
                            config: TrainConfig, *, steps: int = 1,
                            restore: str | os.PathLike | None = None,
                            train: str = "train", infer: str = "infer",
                            rtol: float = 1e-5, atol: float = 1e-7,
                            **load_options: Any) -> SignatureCompare:
    """The file's ``train`` against circle-jax's autodiff of ``infer`` under ``config``
    (the loss and optimizer the file is believed to use), ``steps`` steps on ``xs``
    (the model inputs) and ``y`` (see the module docstring)."""
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    program = Program(source)
    names, target = _split_inputs(program, train, infer)
    sig = program.signature(train)
    state = dict(program.initial_variables())
    if restore is not None:
        state = restored_variables(program, restore, state)
    model = load(source, signature=infer, restore=restore, **load_options)
    batch = sig.inputs[names[0]].shape[0] if sig.inputs[names[0]].shape else 1
    xs = [np.asarray(x) for x in xs]
    n = len(xs[0]) // batch
    if n < 1:
        raise ConfigError(f"{len(xs[0])} samples: the file's {train!r} takes batches of "
                          f"{batch}")
    cfg = replace(config, batch_size=batch)
    trainer = Trainer(model, cfg)
    where = program.signature_defs[train].subgraph_index
    order = {v: min(i for k, i in var.assigns if k == where)
             for v, var in variables(program.model).items()
             if any(k == where for k, _ in var.assigns)}
    assigned = sorted(order, key=order.__getitem__)
    compared = [v for v in assigned if v in trainer.trainable]
    if not compared:
        raise ConfigError(f"no variable the file's {train!r} assigns trains in circle-jax "
                          f"(trainable: {sorted(trainer.trainable)})")
    sgd = optimizer_name(cfg.optimizer) == "sgd" and not dict(
        cfg.optimizer_kwargs or {}).get("momentum")
    lr = float(cfg.learning_rate)
    k = trainer.loss_output

    def loss(p: dict, frozen: dict, x: tuple, t: Any) -> jax.Array:
        pred = model.apply({**frozen, **p}, *x)[k]
        return trainer.loss_fn(pred.astype(trainer.loss_dtype), t)

    grad = jax.jit(jax.value_and_grad(loss))
    step = jax.jit(trainer.train_step)
    tstate, frozen = trainer.init({**model.params, **{v: state[v] for v in model.params
                                                      if v in state}})
    report = SignatureCompare(train, infer, rtol, atol, sgd)
    (loss_name,) = sig.outputs
    for s in range(steps):
        lo = (s % n) * batch
        bx = tuple(x[lo:lo + batch] for x in xs)
        by = np.asarray(y)[lo:lo + batch]
        before_f = {v: np.asarray(state[v], np.float64) for v in compared}
        out, state = sig(state, {**dict(zip(names, bx)), target: by})
        before_c = {v: np.asarray(tstate.params[v], np.float64) for v in compared}
        loss_c, g_c = grad(dict(tstate.params), frozen, bx, by)
        tstate, _ = step(tstate, frozen, (bx, by))
        rows = []
        for v in compared:
            after = np.asarray(state[v], np.float64)
            upd_f = after - before_f[v]
            upd_c = np.asarray(tstate.params[v], np.float64) - before_c[v]
            # an update is a difference of float32 values: one rounding of the new value
            ulp = float(np.spacing(np.float32(np.abs(after).max(initial=0.0))))
            u, us, u_departs = _relative(upd_c, upd_f, atol + 2 * ulp, rtol)
            g = gs = None
            g_departs = False
            if sgd:
                g, gs, g_departs = _relative(g_c[v], -upd_f / lr, atol + 2 * ulp / lr, rtol)
            rows.append(VariableStep(v, g, u, gs, us, g_departs or u_departs))
            if report.first is None and g_departs:
                report.first = (s + 1, v, "gradient")
            elif report.first is None and u_departs:
                report.first = (s + 1, v, "update")
        lf, lc = float(np.asarray(out[loss_name])), float(loss_c)
        if report.first is None and _relative(lc, lf, atol, rtol)[2]:
            report.first = (s + 1, "loss", "loss")
        report.steps.append(StepCompare(s + 1, lf, lc, tuple(rows)))
    return report
