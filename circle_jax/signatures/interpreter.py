"""``Interpreter``: LiteRT's stateful face over a file's signatures, in LiteRT's own words.

    it = circle_jax.Interpreter(model_path="model.tflite")   # or model_content=bytes
    it.get_signature_list()        # {"train": {"inputs": ["x", "y"], "outputs": ["loss"]}, ...}
    train = it.get_signature_runner("train")
    train(x=x, y=y)                # {"loss": array(...)}: numpy, as LiteRT returns

As LiteRT's interpreter does, it keeps the file's resource variables across calls (every
signature sees the same ones) and runs an init subgraph (CALL_ONCE) the first time a
signature that names it runs. Each call is the signature's pure function
(`circle_jax.signatures.Program`), jitted unless it takes strings; ``variables`` shows the
state, ``set_variables`` replaces some of it. Errors are one line: a signature or input
name that does not exist (`circle_jax.DataError`, a ValueError as LiteRT's), an unknown Flex
operator when its signature's runner is made, a variable read that holds nothing
(`circle_jax.VariableError`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..errors import ConfigError, DataError
from ..graph.variables import init_subgraphs
from ..lowering import LoweringOptions
from .program import Program, Signature


class SignatureRunner:
    """One signature of an :class:`Interpreter`: call it with the inputs by name."""

    def __init__(self, interpreter: Interpreter, signature: Signature) -> None:
        self._interpreter = interpreter
        self.signature = signature
        self._fn: Callable[..., Any] = jax.jit(signature) if signature.jittable else signature

    def __call__(self, **inputs: Any) -> dict[str, np.ndarray]:
        """The outputs by name (numpy); the interpreter's variables are updated."""
        it = self._interpreter
        it._initialise(self.signature.init_subgraphs)
        self.signature.check_variables(it._variables)  # concrete here, traced under jit
        outputs, it._variables = self._fn(it._variables, inputs)
        return {name: np.asarray(v) for name, v in outputs.items()}

    def get_input_details(self) -> dict[str, dict[str, Any]]:
        """Per input name: the tensor's name, shape and dtype (a subset of LiteRT's)."""
        return _details(self.signature.inputs)

    def get_output_details(self) -> dict[str, dict[str, Any]]:
        """Per output name: the tensor's name, shape and dtype (a subset of LiteRT's)."""
        return _details(self.signature.outputs)


def _details(tensors: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {"name": t.name, "index": t.index, "shape": np.asarray(t.shape, np.int32),
                   "dtype": np.dtype(object if t.dtype == "string" else t.dtype).type}
            for name, t in tensors.items()}


class Interpreter:
    """A model file's signatures over variables kept between calls (see the module
    docstring). Exactly one of ``model_path`` and ``model_content`` (the file's bytes);
    ``lowering`` as `circle_jax.load`'s."""

    def __init__(self, model_path: str | os.PathLike | None = None,
                 model_content: bytes | None = None, *,
                 lowering: str | LoweringOptions | None = None) -> None:
        if (model_path is None) == (model_content is None):
            raise ConfigError("Interpreter takes exactly one of model_path and model_content")
        self._program = Program(model_path if model_path is not None else bytes(model_content),
                                lowering)
        self._variables: dict[str, Any] = {}
        self._ran: set[int] = set()
        self._runners: dict[str, SignatureRunner] = {}

    def allocate_tensors(self) -> None:
        """Nothing (shapes are the file's, values JAX's): kept so that scripts written
        against LiteRT, which call it first, run unchanged."""

    @property
    def program(self) -> Program:
        """The file's signatures as pure functions."""
        return self._program

    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        """Signature key -> its input and output names, as LiteRT's."""
        return {key: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
                for key, s in self._program.signature_defs.items()}

    def get_signature_runner(self, signature_key: str | None = None) -> SignatureRunner:
        """The runner of ``signature_key`` (None: the file's only signature)."""
        keys = list(self._program.signature_defs)
        if signature_key is None:
            if len(keys) != 1:
                raise DataError(f"signature_key is None and the model has {len(keys)} "
                                f"signatures ({', '.join(map(repr, keys)) or 'none'}); None "
                                "names the only one of a one-signature model")
            signature_key = keys[0]
        if signature_key not in self._runners:
            self._runners[signature_key] = SignatureRunner(
                self, self._program.signature(signature_key))
        return self._runners[signature_key]

    @property
    def variables(self) -> dict[str, np.ndarray]:
        """The variables' values now, by shared_name (numpy copies, in the dtype the file
        declares: a 64-bit variable JAX computed in 32 bits is widened, exactly); a variable
        nothing has assigned yet is absent."""
        known = self._program.variables
        out = {}
        for name, v in self._variables.items():
            a, declared = np.array(v), known[name].dtype if name in known else ""
            wide = declared in ("int64", "uint64", "float64") and a.dtype.itemsize == 4
            out[name] = a.astype(declared) if wide and a.dtype.kind == declared[0] else a
        return out

    def set_variables(self, values: Mapping[str, Any]) -> None:
        """Give the named variables these values (a variable the file does not have is
        refused in one line). The file's init subgraphs run first if they have not: the
        values replace the initial ones, and no later CALL_ONCE overwrites them."""
        known = self._program.variables
        unknown = [n for n in values if n not in known]
        if unknown:
            raise DataError(f"the model has no variable {unknown[0]!r} (variables: "
                            + ", ".join(map(repr, known)) + ")")
        self._initialise(tuple(init_subgraphs(self._program.model)))
        self._variables = {**self._variables, **{n: np.asarray(v) for n, v in values.items()}}

    def _initialise(self, init_subgraphs: tuple[int, ...]) -> None:
        """Run each of these init subgraphs that has not run yet (CALL_ONCE's semantics)."""
        for k in init_subgraphs:
            if k not in self._ran:
                self._variables = self._program.initialise(k, self._variables)
                self._ran.add(k)
