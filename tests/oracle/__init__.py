"""Tests of circle_jax.oracle."""
