"""The install-time build of circle-jax's optional C++ CPU kernels (everything else is in
pyproject.toml).

``circle_jax/lowering/cpu/*.cc`` are compiled into one shared library per instruction-set
level (on x86-64: the baseline, x86-64-v3 and x86-64-v4; elsewhere one generic build),
each ``circle_jax/lowering/cpu/kernels_<level>`` with the platform's extension suffix;
`circle_jax.lowering.cpu_kernels` loads the highest level the running CPU has. The rules:

- **No machine-dependent floats**: no ``-march=native``, no ``-ffast-math`` and
  ``-ffp-contract=off`` (no fused multiply-adds), so every level and every compiler that
  builds them computes the same bits; the levels differ only in vector width.
- **Optional**: where the build fails (no C++ compiler, no jaxlib headers when built
  without isolation), the install goes on without that library and the library lowers
  those convolutions through XLA (``cpu_kernels.status()`` says why).
- **Each level from its own objects**: every library compiles its sources into its own
  folder (the levels share source names, and build in parallel), and each object file
  records the level it was compiled for (``CIRCLE_JAX_LEVEL``, read back by
  `circle_jax.lowering.cpu_kernels`, which refuses a library of mixed levels).
- Against the XLA FFI headers of jaxlib (a build requirement): the FFI's C ABI is versioned,
  so the kernels run under any later jaxlib.
"""

from __future__ import annotations

import copy
import os
import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["circle_jax/lowering/cpu/depthwise.cc", "circle_jax/lowering/cpu/conv.cc"]
HEADERS = ["circle_jax/lowering/cpu/common.h"]
FLAGS = ["-O3", "-g0", "-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-w"]
#: level name -> its -march (the names `circle_jax.lowering.cpu_kernels.LEVELS` knows)
X86_64_LEVELS = {"x86_64_v4": "x86-64-v4", "x86_64_v3": "x86-64-v3", "x86_64": "x86-64"}


def _levels() -> dict[str, list[str]]:
    """Each library to build: its level and that level's extra flags."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        return {name: [f"-march={march}"] for name, march in X86_64_LEVELS.items()}
    return {"generic": []}


class OptionalKernels(build_ext):
    """build_ext with jaxlib's FFI headers, the levels in parallel (each in its own object
    folder), failures skipped."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        try:
            import jaxlib
        except ImportError:
            print("circle-jax: jaxlib is not importable at build time: the CPU kernels are "
                  "not built", file=sys.stderr)
            self.extensions = []
        else:
            include = os.path.join(os.path.dirname(jaxlib.__file__), "include")
            for ext in self.extensions:
                ext.include_dirs.append(include)
        super().run()

    def build_extension(self, ext: Extension) -> None:
        # A copy of the command per library: setuptools names object files after their
        # sources, so the levels' objects would overwrite one another in one folder.
        own = copy.copy(self)
        own.build_temp = os.path.join(self.build_temp, ext.name.rsplit(".", 1)[-1])
        super(OptionalKernels, own).build_extension(ext)


setup(
    ext_modules=[
        Extension(f"circle_jax.lowering.cpu.kernels_{name}", SOURCES, language="c++",
                  depends=HEADERS, define_macros=[("CIRCLE_JAX_LEVEL", f'"{name}"')],
                  extra_compile_args=FLAGS + extra, optional=True)
        for name, extra in _levels().items()],
    cmdclass={"build_ext": OptionalKernels},
)
