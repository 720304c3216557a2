"""The processes of a multi-process run meet on the coordinator's port before JAX joins them.

``jax.distributed.initialize`` ends the process (a native abort, or a segmentation fault)
where Python cannot catch it: when the coordinator's port is taken, when process 0 cannot be
reached, and when a process is still missing after the timeout. `meet` finds each of those
first, on plain TCP sockets, and raises a `TrainingError` naming it. Rules:

- process 0 listens on the coordinator's port (all interfaces, as JAX's coordinator does) and
  waits until every other process has connected and sent its id; then it tells each to go,
  waits for each to hang up (so that the port's closed connections wait on their side, not
  on the coordinator's), and closes the port for JAX's coordinator to take;
- every other process connects (retrying until the timeout: process 0 may start later),
  sends its id and waits for the word to go;
- an id sent twice, an unknown id, or silence past the timeout is an error on both sides.
"""

from __future__ import annotations

import os
import socket
import time

from ..errors import TrainingError

#: how often a process that cannot reach process 0 yet tries again (seconds)
RETRY_S = 0.2
_GO = b"go\n"


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); a `TrainingError` where the port is
    not in 1..65535."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TrainingError(f"coordinator address {address!r} is not HOST:PORT with a port "
                            "in 1..65535")
    return host.strip("[]"), int(port)


def _reason(e: OSError) -> str:
    """The OS's reason alone (``socket.create_server`` adds the address it tried)."""
    return os.strerror(e.errno) if e.errno else str(e)


def meet(address: str, num_processes: int, process_id: int, timeout_s: float) -> None:
    """Return once all ``num_processes`` processes have met at ``address`` (see the module's
    rules); a `TrainingError` where they cannot within ``timeout_s`` seconds."""
    host, port = split_address(address)
    if num_processes == 1:
        return
    deadline = time.monotonic() + timeout_s
    if process_id == 0:
        _gather(port, num_processes, deadline, address)
    else:
        _join(host, port, process_id, deadline, address)


def _gather(port: int, num_processes: int, deadline: float, address: str) -> None:
    dual = socket.has_dualstack_ipv6()
    try:
        server = socket.create_server(("", port), family=socket.AF_INET6 if dual
                                      else socket.AF_INET, dualstack_ipv6=dual)
    except OSError as e:
        raise TrainingError(f"process 0 cannot listen on port {port} of {address!r}: "
                            f"{_reason(e)}") from None
    waiting = set(range(1, num_processes))
    joined: list[socket.socket] = []
    try:
        while waiting:
            server.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                conn, _ = server.accept()
            except TimeoutError:
                raise TrainingError(
                    f"processes {', '.join(map(str, sorted(waiting)))} did not reach "
                    f"{address!r} in time") from None
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                sent = conn.recv(32).strip()
            except OSError:
                conn.close()
                continue
            k = int(sent) if sent.isdigit() else -1
            if k not in waiting:
                conn.close()
                raise TrainingError(f"a process at {address!r} says it is process "
                                    f"{sent.decode(errors='replace')!r}: expected one of "
                                    f"{sorted(waiting)} (ids 1..{num_processes - 1}, each once)")
            waiting.discard(k)
            joined.append(conn)
        for conn in joined:
            conn.sendall(_GO)
        for conn in joined:  # each hangs up first
            conn.settimeout(max(deadline - time.monotonic(), 1.0))
            try:
                conn.recv(1)
            except OSError:
                pass
    finally:
        for conn in joined:
            conn.close()
        server.close()


def _join(host: str, port: int, process_id: int, deadline: float, address: str) -> None:
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=RETRY_S * 5)
            break
        except OSError as e:
            if time.monotonic() + RETRY_S > deadline:
                raise TrainingError(f"process 0 cannot be reached at {address!r}: "
                                    f"{_reason(e)}") from None
            time.sleep(RETRY_S)
    with conn:
        try:
            conn.sendall(f"{process_id}\n".encode())
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            answer = conn.recv(len(_GO))
        except OSError:
            answer = b""
        if answer != _GO:
            raise TrainingError(f"process 0 at {address!r} did not let process {process_id} "
                                "join (another process with the same id, or the others "
                                "missing past the timeout)")
