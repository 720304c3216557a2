"""Circle operators as pure JAX functions, one module per operator family."""

from .registry import OpContext, lookup, register, supported_operators

__all__ = ["OpContext", "lookup", "register", "supported_operators"]
