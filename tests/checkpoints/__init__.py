"""Tests of circle_jax.checkpoints."""
