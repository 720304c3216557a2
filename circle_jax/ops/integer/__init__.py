"""Integer kernels: LiteRT's arithmetic on affine-quantized int8 / uint8 / int16 tensors.

An operator runs its integer kernel instead of its float one when its first output is int8,
uint8 or int16 and its tensors carry quantization parameters
(:func:`circle_jax.ops.registry.runs_integer`). Each kernel reproduces LiteRT's default
(no-delegate) kernels bit for bit: 32-bit integer accumulators (64-bit where LiteRT's are),
fixed-point output multipliers
with LiteRT's roundings (:mod:`.fixed_point`), saturation to the output type and the fused
activation's integer clamp (:mod:`.params`), tables where LiteRT uses tables.

One family per module, as for the float kernels: :mod:`.conv` (CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED, TRANSPOSE_CONV, BATCH_MATMUL), :mod:`.elementwise` (ADD, SUB, MUL,
SQUARED_DIFFERENCE, RSQRT, SOFTMAX), :mod:`.activations` (RELU, RELU6, RELU_N1_TO_1,
LEAKY_RELU, LOGISTIC, TANH, HARD_SWISH), :mod:`.pooling` (AVERAGE_POOL_2D, MAX_POOL_2D),
:mod:`.shape` (CONCATENATION, PAD), :mod:`.reduce` (MEAN, SUM); LiteRT's lookup tables are
built by :mod:`.tables`. QUANTIZE and DEQUANTIZE are in ``ops/quantize.py``; operators that
only move values (RESHAPE, TRANSPOSE, STRIDED_SLICE, GATHER, ...) use their generic kernels,
exact on stored integers.
"""

import importlib
import pkgutil

for _info in pkgutil.iter_modules(__path__):
    if _info.name not in ("fixed_point", "params", "tables"):
        importlib.import_module(f"{__name__}.{_info.name}")
