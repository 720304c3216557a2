"""Hand-written CPU kernels beside the XLA lowerings: built when the package is installed,
used where they apply, the XLA form everywhere else.

``cpu/depthwise.cc`` holds the 3x3 depthwise convolution's forward product and weight
gradient as XLA FFI custom calls (`circle_jax.lowering.depthwise` lowers to them; its
own `shift_sum` and `weight_gradient` are the readable reference they are tested against;
XLA CPU has no fast form of that weight gradient, benchmarks/README.md); ``cpu/conv.cc``
those of a 3x3 convolution of at most 4 input channels, an image's first layer
(`circle_jax.lowering.few_channels`, whose im2col form is their reference). Each file also
holds its layer with the bias and a clamping activation, forward and backward in one pass
each (`circle_jax.lowering.clamped`).

The rules:

- **Built at install time** (``setup.py``: ``pip install`` compiles them, nothing compiles
  at run time), one library per instruction-set level, ``cpu/kernels_<level>``: on x86-64
  the baseline, ``x86_64_v3`` (AVX2) and ``x86_64_v4`` (AVX-512); elsewhere ``generic``.
  No ``-march=native``, no fused multiply-adds (``-ffp-contract=off``), no fast math: every
  level computes the same bits, whichever machine compiled it.
- **Loaded** on first use, where every object of the library was compiled for its level
  (`compiled_for`): the highest installed level whose instructions this CPU has
  (`LEVELS`; ``/proc/cpuinfo``'s flags; without them, the baseline only).
  ``CIRCLE_JAX_CPU_KERNELS=<level>`` asks for one level; ``=0`` turns them off. A compiled
  program kept on disk registers them before it loads (`circle_jax.train.programs`).
- **Used** for float32 4-d inputs, a 3x3 kernel, equal strides 1 or 2, dilation 1, in a
  program lowered for the CPU on one device (and, for `few_channels`, 1 to 4 input
  channels); anything else (other dtypes or kernels, GPU,
  a program split over several devices) takes the XLA lowering.
- **Off** where switched off, where the install built none (no C++ compiler then) or the
  CPU has none of the installed levels (`status` says which); results then differ from the
  kernels' only by float32 summation order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir

#: where ``setup.py`` puts the libraries (beside their sources)
LIBRARY_DIR = Path(__file__).with_name("cpu")
#: the custom-call targets each library defines
TARGETS = ("circle_jax_depthwise_forward", "circle_jax_depthwise_weight_gradient",
           "circle_jax_depthwise_clamped_forward", "circle_jax_depthwise_masked_gradient",
           "circle_jax_conv3x3_forward", "circle_jax_conv3x3_weight_gradient",
           "circle_jax_conv3x3_clamped_forward", "circle_jax_conv3x3_masked_gradient")
#: each source file's record of the level its object was compiled for (``setup.py``)
LEVEL_MARKERS = ("circle_jax_conv_level", "circle_jax_depthwise_level")
_V3 = frozenset({"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"})
#: each level ``setup.py`` builds, best first, and the CPU flags it needs
LEVELS: dict[str, frozenset[str]] = {
    "x86_64_v4": _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
    "x86_64_v3": _V3,
    "x86_64": frozenset(),
    "generic": frozenset(),
}
#: "0" lowers everything through XLA; a level's name asks for that level
SWITCH = "CIRCLE_JAX_CPU_KERNELS"


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The running CPU's feature flags (empty where ``/proc/cpuinfo`` is not readable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def installed() -> dict[str, Path]:
    """The installed libraries by level, best first."""
    found = {}
    for level in LEVELS:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = LIBRARY_DIR / f"kernels_{level}{suffix}"
            if path.is_file():
                found[level] = path
                break
    return found


def _choose() -> tuple[Path | None, str]:
    """(the library to load, or None, and its level or why none)."""
    asked = os.environ.get(SWITCH, "1")
    if asked == "0":
        return None, f"{SWITCH}=0"
    libraries = installed()
    if not libraries:
        return None, ("not built at install (setup.py builds them where a C++ compiler "
                      "and jaxlib's headers are present; reinstall to build them)")
    runnable = [lv for lv in libraries if LEVELS[lv] <= _cpu_flags()]
    if asked not in ("1", ""):
        if asked not in libraries:
            return None, f"{SWITCH}={asked} names no installed level ({', '.join(libraries)})"
        if asked not in runnable:
            return None, f"{SWITCH}={asked}: this CPU lacks {sorted(LEVELS[asked] - _cpu_flags())}"
        return libraries[asked], asked
    if not runnable:
        return None, f"this CPU has none of the installed levels ({', '.join(libraries)})"
    return libraries[runnable[0]], runnable[0]


_LOCK = threading.Lock()
#: (whether the kernels are registered, the library and level or why not, the library's
#: file where registered); None: not yet
_state: tuple[bool, str, Path | None] | None = None


def _load() -> tuple[bool, str, Path | None]:
    path, detail = _choose()
    if path is None:
        return False, detail, None
    try:
        library = ctypes.CDLL(str(path))
    except OSError as e:
        return False, f"{path.name} does not load: {str(e)[:200]}", None
    built = compiled_for(library)
    if set(built) != {detail}:
        return (False, f"{path.name} is linked from objects of levels {built}, not {detail} "
                "only (reinstall to rebuild it)", None)
    for name in TARGETS:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, name)),
                                    platform="cpu")
    return True, f"{path} ({detail})", path


def compiled_for(library: ctypes.CDLL) -> list[str]:
    """The level each of the library's object files was compiled for (`LEVEL_MARKERS`)."""
    built = []
    for marker in LEVEL_MARKERS:
        function = getattr(library, marker, None)
        if function is None:
            built.append("none recorded")
        else:
            function.restype = ctypes.c_char_p
            built.append(function().decode())
    return built


def _loaded() -> tuple[bool, str, Path | None]:
    global _state
    with _LOCK:
        if _state is None:
            _state = _load()
        return _state


def available() -> bool:
    """Whether the kernels are installed, runnable here and registered (loading them)."""
    return _loaded()[0]


def status() -> str:
    """"on: <library> (<level>)" or "off: <why>": what ``circle-jax train -v 2`` reports."""
    on, detail, _ = _loaded()
    return f"{'on' if on else 'off'}: {detail}"


@functools.cache
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:20]


def cache_key() -> str:
    """What a compiled program kept on disk depends on (`circle_jax.train.programs`):
    the library the kernels are (its level and bytes), or why they are off."""
    on, detail, path = _loaded()
    return f"on: {detail} {_digest(path)}" if on else f"off: {detail}"


def on_one_cpu(ctx: mlir.LoweringRuleContext) -> bool:
    """Whether the program being lowered runs unsplit on one device (a custom call has no
    rule for splitting its operands over several)."""
    axis = ctx.module_context.axis_context
    return type(axis).__name__ == "ShardingContext" and getattr(axis, "num_devices", 0) == 1


def kernel_geometry(x: Any, g: Any) -> bool:
    """Whether the kernels take a convolution of ``x`` (an array or its aval) with geometry
    ``g``: [N, H, W, C], a 3x3 filter, dilation 1, equal strides 1 or 2."""
    return x.ndim == 4 and tuple(g.kernel) == (3, 3) and tuple(g.dilations) == (1, 1) \
        and tuple(g.strides) in ((1, 1), (2, 2))


def attributes_3x3(x: jax.core.ShapedArray, *others: jax.core.ShapedArray,
                   geometry: Any) -> dict[str, int] | None:
    """The kernels' attributes for a float32 convolution `kernel_geometry` takes
    (``others``: the filter, the output's cotangent, ...; all float32 too); None where
    they do not apply."""
    g = geometry
    if not kernel_geometry(x, g) or any(a.dtype != np.float32 for a in (x, *others)):
        return None
    return {"stride": g.strides[0], "pad_top": g.pads[0][0], "pad_left": g.pads[1][0]}


def register_lowerings(primitive: Any, reference: Callable[..., Any], target: str, *,
                       attributes: Callable[..., dict[str, Any]] = lambda **params: {}
                       ) -> None:
    """``primitive``'s lowerings: ``reference`` (its parameters as keywords) everywhere; on
    the CPU the custom call ``target`` where `attributes_3x3` applies, the program runs on
    one device and the kernels are `available`, else ``reference``. ``attributes``: the
    call's further attributes, from the primitive's parameters other than ``geometry``."""
    fallback = mlir.lower_fun(reference, multiple_results=primitive.multiple_results)

    def rule(ctx: mlir.LoweringRuleContext, *args: Any, geometry: Any, **params: Any
             ) -> Sequence[Any]:
        attrs = attributes_3x3(*ctx.avals_in, geometry=geometry)
        if attrs is None or not on_one_cpu(ctx) or not available():
            return fallback(ctx, *args, geometry=geometry, **params)
        attrs = {k: np.int64(v) for k, v in attrs.items()} | attributes(**params)
        return jax.ffi.ffi_lowering(target)(ctx, *args, **attrs)

    mlir.register_lowering(primitive, fallback)
    mlir.register_lowering(primitive, rule, platform="cpu")
