"""Tests of circle_jax.train."""
