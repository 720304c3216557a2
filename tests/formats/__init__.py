"""Tests of circle_jax.formats."""
