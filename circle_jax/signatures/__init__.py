"""Signatures over resource variables: LiteRT's on-device training files run as the file says.

:class:`Program` turns each signature into a pure function ``(variables, inputs) ->
(outputs, variables)``; :class:`Interpreter` is LiteRT's stateful face over them
(``get_signature_list``, ``get_signature_runner``), for scripts written against LiteRT.
"""

from __future__ import annotations

from .interpreter import Interpreter, SignatureRunner
from .program import Program, Signature

__all__ = ["Interpreter", "Program", "Signature", "SignatureRunner"]
