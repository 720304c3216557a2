"""Tests of circle_jax.ops."""
