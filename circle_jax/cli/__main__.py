"""``python -m circle_jax.cli``."""

from circle_jax.cli import console_main

console_main()
