"""Data parallelism: every global batch sharded over a 1-D ``"data"`` mesh axis.

Params, optimizer state and loss-scale state are replicated on every device of the mesh; a
scanned epoch's batches ``[steps, batch, ...]`` are sharded on their batch axis (axis 1),
so each device computes the loss and gradients of its slice of every batch and XLA inserts
the all-reduce that sums them (the step is the single-device step, partitioned by
``jax.jit`` from its inputs' ``NamedSharding``). Losses are those of one device up to the
order of the reduction's sums.

Several processes (hosts) form one mesh after `initialize` (``jax.distributed``; on CPU
the collectives go through gloo, so two processes on one machine are a multi-host run).
Each process then places only its own slice of every global batch on its devices (all
processes read the same data), results come back replicated, and only process 0 prints or
writes files (`is_main_process`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ..errors import TrainingError
from .rendezvous import meet, split_address

#: the mesh axis that batches are sharded over
DATA_AXIS = "data"


def initialize(coordinator_address: str, num_processes: int, process_id: int, *,
               timeout_s: int = 300) -> None:
    """Join a multi-process run (``jax.distributed.initialize``) before any JAX computation.

    ``coordinator_address`` is ``HOST:PORT`` of process 0, which listens there; every process
    gives the same address and process count and its own id in ``[0, num_processes)``.
    The processes first meet on that port (`circle_jax.distributed.rendezvous.meet`: a taken
    port, an unreachable process 0 or a process missing past ``timeout_s`` is a
    `TrainingError`, where JAX would end the process). CPU collectives go through gloo. A
    second call in the same process does nothing.
    """
    split_address(coordinator_address or "")
    if num_processes < 1:
        raise TrainingError(f"the number of processes must be >= 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise TrainingError(f"process id {process_id} is not in [0, {num_processes})")
    if jax.distributed.is_initialized():
        return
    meet(coordinator_address, num_processes, process_id, timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               initialization_timeout=timeout_s)
    # Connect the collectives now, with the lines gloo writes on stdout sent to stderr (where
    # they do not mix with a program's output), and wait for every process to be there.
    from jax.experimental import multihost_utils

    with _stdout_to_stderr():
        multihost_utils.sync_global_devices("circle_jax.distributed.initialize")


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 (what native code prints too) goes to descriptor 2 meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def is_main_process() -> bool:
    """True in process 0 (the one that prints and writes files) and in single-process runs."""
    return jax.process_index() == 0


def data_mesh(devices: int | Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh with axis ``"data"``: all devices (None), the first ``devices`` of them
    (an int; with several processes, an equal number from each), or these devices."""
    every = jax.devices()
    if devices is None:
        chosen = every
    elif isinstance(devices, int) and not isinstance(devices, bool):
        procs = jax.process_count()
        if devices < 1:
            raise TrainingError(f"the number of devices must be >= 1, got {devices}")
        if devices > len(every):
            hint = (f"; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
                    f"{-(-devices // procs)} before JAX starts"
                    if jax.default_backend() == "cpu" else "")
            raise TrainingError(f"{devices} devices asked for, JAX sees {len(every)} "
                                f"({jax.default_backend()}){hint}")
        if devices % procs:
            raise TrainingError(f"{devices} devices cannot be split evenly over {procs} "
                                "processes")
        per = devices // procs
        chosen = [d for p in range(procs) for d in
                  [d for d in every if d.process_index == p][:per]]
    else:
        chosen = list(devices)
        if not chosen:
            raise TrainingError("an empty list of devices")
    return Mesh(np.array(chosen), (DATA_AXIS,))


@dataclass(frozen=True)
class DataParallel:
    """Where a training run's arrays live: batches sharded over ``axis``, the rest replicated.

    ``mesh`` may have other axes; arrays are replicated over them.
    """

    mesh: Mesh
    axis: str = DATA_AXIS

    def __post_init__(self) -> None:
        if self.axis not in self.mesh.axis_names:
            raise TrainingError(f"the mesh has no axis {self.axis!r} (axes: "
                                f"{', '.join(map(str, self.mesh.axis_names))})")

    @classmethod
    def of(cls, devices: int | Sequence[jax.Device] | None = None,
           mesh: Mesh | None = None) -> DataParallel | None:
        """The placement for ``fit(devices=..., mesh=...)``: None (one device, as before)
        when neither is given in a single-process run; all devices of a multi-process run."""
        if devices is not None and mesh is not None:
            raise TrainingError("give devices or a mesh, not both")
        if mesh is not None:
            axis = DATA_AXIS if DATA_AXIS in mesh.axis_names or len(mesh.axis_names) != 1 \
                else mesh.axis_names[0]
            return cls(mesh, axis)
        if devices is None and jax.process_count() == 1:
            return None
        return cls(data_mesh(devices))

    @property
    def size(self) -> int:
        """Devices a batch is split over."""
        return int(self.mesh.shape[self.axis])

    @property
    def platform(self) -> str:
        """The mesh's backend ("cpu", "gpu", "tpu"), which chooses the operator lowerings."""
        return str(self.mesh.devices.flat[0].platform)

    def check_batch(self, batch_size: int, micro_batches: int = 1) -> None:
        """Refuse a batch that does not split evenly over the devices (and, accumulating
        in-step, into ``micro_batches`` equal parts on each device)."""
        if batch_size % self.size:
            raise TrainingError(f"batch size {batch_size} is not divisible by the {self.size} "
                                f"devices of the data mesh; use a multiple of {self.size}")
        if batch_size % (self.size * micro_batches):
            n = self.size * micro_batches
            raise TrainingError(f"batch size {batch_size} does not split into {micro_batches} "
                                f"micro-batches on each of {self.size} devices; use a "
                                f"multiple of {n}")

    def sharding(self, batch_axis: int | None) -> NamedSharding:
        """Sharded on ``batch_axis`` over the data axis (replicated when None)."""
        spec = PartitionSpec() if batch_axis is None else \
            PartitionSpec(*([None] * batch_axis), self.axis)
        return NamedSharding(self.mesh, spec)

    def put(self, tree: Any, batch_axis: int | None = None) -> Any:
        """``tree``'s arrays (every process holds the same values) as global arrays: sharded
        on ``batch_axis`` (each process transfers only its devices' slices), or replicated."""
        sharding = self.sharding(batch_axis)

        def one(a: Any) -> jax.Array:
            if isinstance(a, jax.Array) and a.sharding == sharding:
                return a
            host = np.asarray(a)
            return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

        return jax.tree.map(one, tree)

    def put_batches(self, tree: Any) -> Any:
        """An epoch's batches ``[steps, batch, ...]``, sharded on the batch axis."""
        return self.put(tree, batch_axis=1)

    def replicate(self, tree: Any) -> Any:
        """Every device holds the whole of each array (params, optimizer state)."""
        return self.put(tree)


def local(tree: Any) -> Any:
    """Replicated global arrays as ordinary arrays on this process's first device (so that
    code which reads or writes them needs no other process); other leaves unchanged."""
    def one(a: Any) -> Any:
        if isinstance(a, jax.Array) and len(a.sharding.device_set) > 1:
            if not a.is_fully_replicated:
                raise TrainingError("only replicated arrays can be read in one process")
            return a.addressable_data(0)
        return a

    return jax.tree.map(one, tree)
