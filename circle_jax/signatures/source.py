"""An on-device training file behind a loaded signature: `circle_jax.load` and `Model.export`.

``load(path, signature="infer")`` makes the signature a plain model whose params are the
variables it reads (`circle_jax.passes.read_variables_as_constants`, a pass of load's one
pipeline): with ``restore=CHECKPOINT`` the variables first take what the file's own
``restore`` signature reads from the TF V1 checkpoint (:func:`restored_values`,
`circle_jax.signatures.restore`: it runs on the file's initial values, so a restored
variable takes the checkpoint's value and the others keep theirs). The model keeps the file
as an :class:`OnDeviceFile`: its
``export`` writes the whole file, every signature kept, with the params (and every other
variable's value known at load: initial or restored) as the variables' initial values
(`circle_jax.signatures.initialisers`), so the file's own ``train`` goes on from them.
What cannot be written back is refused in one line: an untied copy of a variable trained
apart from it, a nonzero added bias (they are no variable of the file).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..formats.writer import write_model
from ..graph import ir
from ..graph.params_policy import ParamRole
from ..graph.variables import VARIABLE_OPERATORS, init_subgraphs, variables
from ..passes import reachable
from .initialisers import with_initial_values
from .program import Program
from .restore import restored_variables


@dataclass(frozen=True)
class OnDeviceFile:
    """The file as read (``model``) and every variable's value at load (``state``: initial
    values, then the checkpoint's; shared_name -> array)."""

    model: ir.Model
    restored: Mapping[str, np.ndarray] | None = field(default=None, repr=False)
    restore: str | os.PathLike | None = None

    @property
    def checkpoint(self) -> str | None:
        """The checkpoint the variables were restored from, or None."""
        return None if self.restore is None else os.fspath(self.restore)

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Every variable's value at load: the restored ones (`restored_values`), else the
        file's initial values, computed here (at export, not at load: no second lowering
        of the file when it is only trained)."""
        if self.restored is not None:
            return dict(self.restored)
        return {n: np.asarray(v) for n, v in Program(self.model).initial_variables().items()}

    def attach(self, loaded: Any) -> None:
        """Make ``loaded`` (the model of a signature of this file) export the file, and
        train what the file's own ``train`` signature trains: a param is trainable when it is
        a float variable that signature assigns (every float variable when the file has no
        ``train``); others are frozen (a variable ``train`` keeps, such as a frozen feature
        extractor's; a constant of the signature's subgraph, such as the zero bias TF's
        converter gives CONV_2D)."""
        loaded.ondevice = self
        known = variables(self.model)
        train = next((s for s in self.model.signature_defs if s.key == "train"), None)
        within = None if train is None else (reachable(self.model, train.subgraph_index)
                                             - set(init_subgraphs(self.model)))
        for name in loaded.param_roles:
            var = known.get(loaded.rewrites.untied.get(name, name))
            if var is None:
                role = ParamRole(False, "a constant of the file, no variable")
            elif within is not None and not any(k in within for k, _ in var.assigns):
                role = ParamRole(False, "a variable the file's train does not assign")
            else:
                role = ParamRole(var.dtype.startswith("float"), "a variable "
                                 + ("the file's train assigns" if within else "of the file"))
            loaded.param_roles[name] = role

    def export(self, loaded: Any, params: Mapping[str, Any], file_format: str | None = None,
               metadata: Mapping[str, bytes | None] | None = None) -> bytes:
        """The file's bytes with ``params`` (over ``loaded.params``, a `circle_jax.Model` of a
        signature of it) and :attr:`state` as the variables' initial values."""
        values = {**loaded.params, **params}
        for copy, origin in loaded.rewrites.untied.items():
            if np.asarray(values[copy]).tobytes() != np.asarray(values[origin]).tobytes():
                raise ConfigError(f"param {copy!r}, an untied copy of variable {origin!r}, "
                                  "was trained apart from it: the file has one variable; "
                                  "load with tie_shared_weights=True (--tie_shared_weights)")
        for bias in loaded.rewrites.added_bias:
            if np.any(np.asarray(values[bias]) != 0):
                raise ConfigError(f"param {bias!r} is an added bias, no variable of the file: "
                                  "load with add_missing_bias='none' to export the file")
        known = variables(self.model)
        for name, value in values.items():
            if loaded.rewrites.untied.get(name, name) not in known and np.asarray(
                    value).tobytes() != np.asarray(loaded.params[name]).tobytes():
                raise ConfigError(f"param {name!r} is a constant of the file, no variable, "
                                  "and was trained: the file's signatures hold it apart; "
                                  "train only the variables (the default)")
        initial = {**self.state, **{n: np.asarray(v) for n, v in values.items() if n in known}}
        return write_model(with_initial_values(self.model, initial), file_format, metadata)


def restored_values(parsed: ir.Model, signature: str | None,
                    restore: str | os.PathLike | None) -> dict[str, np.ndarray] | None:
    """Every variable's value after the file's ``restore`` signature read the checkpoint
    ``restore`` (its initial value where the checkpoint has none), for the load's
    `circle_jax.passes.read_variables_as_constants`; None without ``restore``. Refused in one
    line when the signature the load selects (subgraph 0 without one) reads no variables."""
    if restore is None:
        return None
    keys = {s.key: s.subgraph_index for s in parsed.signature_defs}
    k = keys.get(signature, None) if signature is not None else 0
    if k is not None and k < len(parsed.subgraphs) and not any(
            op.type in VARIABLE_OPERATORS for op in parsed.subgraphs[k].operators):
        raise ConfigError(f"restore={os.fspath(restore)!r}: the model has no resource "
                          "variables to restore (it applies to on-device training files)")
    program = Program(parsed)
    state = restored_variables(program, restore, dict(program.initial_variables()))
    return {n: np.asarray(v) for n, v in state.items()}
