"""Tests of circle_jax.cli."""
