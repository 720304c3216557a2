"""One line naming the machine a benchmark ran on, printed with its figures: timings from
two machines (the development VM has been an AMD EPYC and an Intel Xeon host on different
days) are not comparable, and ratios to onert measured in the same run are."""

from __future__ import annotations

import os


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def describe() -> str:
    """``<CPU model>, <usable cores> of <cores> cores, load <1-minute load average>``."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = f", load {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"{cpu_model()}, {usable} of {os.cpu_count()} cores{load}"
