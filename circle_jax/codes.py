"""Settings named by a readable name or by onert_train's numeric code (JAX-free).

A `CodeTable` is the one definition of what a setting accepts: the library resolves with it
(`losses.loss_name`, `losses.get_reduction`, `optim.optimizer_name`) and the command line
parses and documents its flags with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


def normalize_name(name: str) -> str:
    """Names compare case-insensitively, with spaces, hyphens and underscores alike:
    ``"Sum over batch-size"`` -> ``"sum_over_batch_size"``."""
    return "_".join(name.strip().lower().replace("-", " ").replace("_", " ").split())


@dataclass(frozen=True)
class CodeTable:
    """What one setting accepts: canonical ``names``, extra ``aliases`` and onert_train's
    numeric ``codes`` (each mapping to a canonical name).

    ``what`` names the setting in messages ("loss", "loss reduction", "optimizer").
    """

    what: str
    names: tuple[str, ...]
    codes: Mapping[int, str]
    aliases: Mapping[str, str] = field(default_factory=dict)

    def resolve(self, spec: str | int) -> str:
        """The canonical name of a name, alias or onert code; ValueError names the choices."""
        if isinstance(spec, bool):
            raise ValueError(f"{self.what} must be a name or an onert code, got {spec!r}")
        if isinstance(spec, int):
            if spec in self.codes:
                return self.codes[spec]
            raise ValueError(f"unknown onert {self.what} code {spec}: use {self.code_help(' or ')}")
        if isinstance(spec, str):
            key = normalize_name(spec)
            if key in self.names:
                return key
            if key in self.aliases:
                return self.aliases[key]
        raise ValueError(f"unknown {self.what} {spec!r}: use one of {', '.join(self.spellings())}"
                         f" or onert codes {', '.join(map(str, self.codes))}")

    def parse(self, text: str) -> str | int:
        """A command-line value: an onert code stays an int (it selects onert's numerics where
        they differ), anything else becomes its canonical name."""
        value: str | int = int(text) if text.strip().lstrip("-").isdigit() else text
        name = self.resolve(value)
        return value if isinstance(value, int) else name

    def spellings(self) -> list[str]:
        """Every accepted name: canonical names first, then aliases."""
        return [*self.names, *(a for a in self.aliases if a not in self.names)]

    def code_help(self, sep: str = ", ") -> str:
        """onert_train's code table as text: ``1 (mean squared error), 2 (...)``."""
        return sep.join(f"{c} ({n.replace('_', ' ')})" for c, n in self.codes.items())
