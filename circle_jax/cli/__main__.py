"""``python -m circle_jax.cli``."""

from circle_jax.cli import main

raise SystemExit(main())
