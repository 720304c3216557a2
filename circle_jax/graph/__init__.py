"""The model as data, between the file and the passes: the IR (`ir`: frozen dataclasses the
reader builds), whole-graph checks at load (`checks`), what is a param and which train
(`params_policy`), params' short aliases (`aliases`).

This ``__init__`` imports nothing, so the file layer (`circle_jax.formats`) reaches the IR
without JAX or the operator catalogue.
"""
