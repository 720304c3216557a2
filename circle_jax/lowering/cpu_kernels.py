"""Hand-written CPU kernels beside the XLA lowerings: built once per machine, used where
they apply, the XLA form everywhere else.

``cpu/depthwise.cc`` holds the 3x3 depthwise convolution's forward product and weight
gradient as XLA FFI custom calls (`circle_jax.lowering.depthwise` lowers to them; its
own `shift_sum` and `weight_gradient` are the readable reference they are tested against;
XLA CPU has no fast form of that weight gradient, benchmarks/README.md); ``cpu/conv.cc``
those of a 3x3 convolution of at most 4 input channels, an image's first layer
(`circle_jax.lowering.few_channels`, whose im2col form is their reference). Each file also
holds its layer with the bias and a clamping activation, forward and backward in one pass
each (`circle_jax.lowering.clamped`).

The rules:

- **Built on first use** with the machine's C++ compiler (``$CXX``, else ``c++`` or
  ``g++``; ``-O3 -march=native``, against the FFI headers of the installed jaxlib), 5-13 s
  once, into ``$CIRCLE_JAX_KERNEL_DIR`` (default ``~/.cache/circle-jax/kernels``,
  under ``$XDG_CACHE_HOME`` where set) under a name that changes with the source, the
  jaxlib version, the compiler and the CPU. Processes building at once take turns (a file
  lock). A compiled program kept on disk registers them before it loads
  (`circle_jax.train.programs`).
- **Used** for float32 4-d inputs, a 3x3 kernel, equal strides 1 or 2, dilation 1, in a
  program lowered for the CPU on one device (and, for `few_channels`, 1 to 4 input
  channels); anything else (other dtypes or kernels, GPU,
  a program split over several devices) takes the XLA lowering.
- **Off** with ``CIRCLE_JAX_CPU_KERNELS=0``, or where no compiler builds them (`status`
  says why); results then differ from the kernels' only by float32 summation order.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.interpreters import mlir

SOURCE_DIR = Path(__file__).with_name("cpu")
#: one source file per operator family, compiled in parallel and linked into one library
SOURCES = ("depthwise.cc", "conv.cc")
#: the custom-call targets ``SOURCES`` define
TARGETS = ("circle_jax_depthwise_forward", "circle_jax_depthwise_weight_gradient",
           "circle_jax_depthwise_clamped_forward", "circle_jax_depthwise_masked_gradient",
           "circle_jax_conv3x3_forward", "circle_jax_conv3x3_weight_gradient",
           "circle_jax_conv3x3_clamped_forward", "circle_jax_conv3x3_masked_gradient")
FLAGS = ("-O3", "-march=native", "-fPIC", "-std=c++17", "-w")
#: set to "0" to lower everything through XLA
SWITCH = "CIRCLE_JAX_CPU_KERNELS"


def kernel_dir() -> Path:
    """Where built kernels are kept (see the module docstring)."""
    if os.environ.get("CIRCLE_JAX_KERNEL_DIR"):
        return Path(os.environ["CIRCLE_JAX_KERNEL_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "circle-jax" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def _why_off() -> str | None:
    """Why the kernels are off whatever is built (the switch, no compiler); None: on."""
    if os.environ.get(SWITCH, "1") == "0":
        return f"{SWITCH}=0"
    return "no C++ compiler ($CXX, c++ or g++) on PATH" if _compiler() is None else None


@functools.cache
def _cpu() -> str:
    """What ``-march=native`` depends on: the CPU's model name and flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor() or platform.machine()


@functools.cache
def _library_path(compiler: str) -> Path:
    import jaxlib

    h = hashlib.sha256()
    for source in sorted(SOURCE_DIR.iterdir()):
        h.update(source.name.encode() + source.read_bytes())
    for part in (jaxlib.__version__, compiler, os.path.getmtime(compiler), FLAGS, _cpu()):
        h.update(repr(part).encode())
    return kernel_dir() / f"kernels-{h.hexdigest()[:20]}.so"


def _build(path: Path, compiler: str) -> None:
    """Compile ``SOURCES`` (in parallel) and link them into ``path`` (a temporary file
    renamed into place, under a lock that other processes building it wait on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        tmp = path.with_suffix(f".{os.getpid()}")
        objects = [tmp.with_suffix(f".{os.getpid()}.{name}.o") for name in SOURCES]
        try:
            compiles = [subprocess.Popen(
                [compiler, *FLAGS, f"-I{jax.ffi.include_dir()}", "-c", str(SOURCE_DIR / name),
                 "-o", str(o)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for name, o in zip(SOURCES, objects)]
            try:
                for c in compiles:
                    _, err = c.communicate(timeout=300)
                    if c.returncode:
                        raise subprocess.CalledProcessError(c.returncode, c.args, stderr=err)
            finally:
                for c in compiles:
                    if c.poll() is None:
                        c.kill()
            subprocess.run([compiler, "-shared", *map(str, objects), "-o", str(tmp)],
                           check=True, capture_output=True, timeout=300)
            os.replace(tmp, path)
        finally:
            for leftover in (tmp, *objects):
                leftover.unlink(missing_ok=True)


_LOCK = threading.Lock()
_NOT_BUILT = "not built yet"
#: (whether the kernels are registered, the library or why not); None: not looked for
_state: tuple[bool, str] | None = None


def _load(build: bool) -> tuple[bool, str]:
    """(whether the kernels are registered, the library or why not); ``build``: compile
    them first where they are not built."""
    why = _why_off()
    if why is not None:
        return False, why
    compiler = _compiler()
    path = _library_path(compiler)
    if not path.exists():
        if not build:
            return False, _NOT_BUILT
        try:
            _build(path, compiler)
        except (OSError, subprocess.SubprocessError) as e:
            err = getattr(e, "stderr", b"") or b""
            detail = err.decode(errors="replace").strip().splitlines()[:1] or [str(e)]
            return False, f"building the kernels failed: {detail[0][:200]}"
    library = ctypes.CDLL(str(path))
    for name in TARGETS:
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, name)),
                                    platform="cpu")
    return True, str(path)


def _loaded(build: bool) -> tuple[bool, str]:
    global _state
    with _LOCK:
        if _state is None or (build and _state == (False, _NOT_BUILT)):
            _state = _load(build)
        return _state


def available() -> bool:
    """Whether the kernels are built (building them now if needed) and registered."""
    return _loaded(True)[0]


def status() -> str:
    """"on: <library>" or "off: <why>" ("not built yet" before the first use), building
    nothing: what ``circle-jax train -v 2`` reports."""
    on, detail = _loaded(False)
    return f"{'on' if on else 'off'}: {detail}"


def cache_key() -> str:
    """What a compiled program kept on disk depends on (`circle_jax.train.programs`):
    the library the kernels are, or would be once built, or why they are off."""
    why = _why_off()
    return f"off: {why}" if why is not None else f"on: {_library_path(_compiler()).name}"


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
