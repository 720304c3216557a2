"""Write files atomically: readers see the old file or the complete new one, never a part."""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterable
from typing import BinaryIO

from circle_jax.errors import DataError

PathLike = str | os.PathLike
"""A filesystem path."""

Writer = Callable[[BinaryIO], None]
"""A function that writes a file's bytes to an open binary file."""


def _same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name the same existing file (links and ``..`` resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _protected(protect: PathLike | Iterable[PathLike] | None) -> list[PathLike]:
    if protect is None:
        return []
    if isinstance(protect, (str, bytes, os.PathLike)):
        return [protect]
    return list(protect)


def _fsync_dir(directory: str) -> None:
    """Make a rename durable; best effort (some systems cannot open directories)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def cannot_create_in(directory: PathLike) -> str | None:
    """Why no file can be created in ``directory`` (the OS's words), or None when one can:
    a file is created there and removed, as `atomic_write`'s temporary file will be, so
    permissions, read-only mounts and pseudo file systems (/proc) all show before any work
    whose result would be lost."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".circle-jax-probe.", dir=os.fspath(directory))
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(probe)
    return None


def _special(target: str) -> bool:
    """Whether ``target`` (links followed) exists and is neither a regular file nor a
    directory: a device such as /dev/null, a FIFO, a socket."""
    try:
        mode = os.stat(target).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_writable(path: PathLike) -> None:
    """DataError (one line naming ``path``) unless `atomic_write` can write ``path``: not a
    directory; a device or FIFO this process may write; else in a directory that exists
    and takes a new file (`cannot_create_in`)."""
    target = os.fspath(path)
    if os.path.isdir(target):
        raise DataError(f"cannot write {target!r}: it is a directory, expected a file path")
    if _special(target):
        if not os.access(target, os.W_OK):
            raise DataError(f"cannot write {target!r}: no permission to write it")
        return
    target = os.path.realpath(target) if os.path.islink(target) else target
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise DataError(f"cannot write {target!r}: directory {directory!r} does not exist")
    why = cannot_create_in(directory)
    if why is not None:
        raise DataError(f"cannot write {target!r}: cannot create a file in {directory!r} "
                        f"({why})")


def atomic_write(
    path: PathLike,
    data: bytes | bytearray | memoryview | Writer,
    *,
    protect: PathLike | Iterable[PathLike] | None = None,
) -> None:
    """Write ``data`` (bytes, or a function writing to a binary file) to ``path`` atomically.

    The bytes go to a temporary file in the target's directory, which is flushed,
    fsynced and renamed onto ``path`` with ``os.replace``; a symbolic link is written
    through (its target replaced, the link kept), and a device or FIFO (``/dev/null``) is
    written directly, as a shell's ``>`` would, never replaced by a file. If anything fails the
    temporary file is removed and ``path`` is left as it was; an OSError of the temporary
    file (a full disk) is raised naming ``path``, the file the caller asked for. ``protect`` names
    input files that must never be overwritten (e.g. the model being exported):
    if ``path`` is one of them, :class:`DataError` is raised before anything is written.
    """
    target = os.fspath(path)
    for p in _protected(protect):
        if _same_file(target, p) or os.path.abspath(target) == os.path.abspath(os.fspath(p)):
            raise DataError(
                f"refusing to write {target!r}: it is the input file {os.fspath(p)!r}; "
                "choose a different output path"
            )
    if os.path.isdir(target):
        raise DataError(f"cannot write {target!r}: it is a directory, expected a file path")
    if _special(target):
        with open(target, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
        return
    target = os.path.realpath(target) if os.path.islink(target) else target

    directory = os.path.dirname(os.path.abspath(target))
    base = os.path.basename(target)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # the umask applies, as for a plain open()
            break
        except FileExistsError:
            continue
        except OSError as e:  # of the temporary file
            raise _of_target(e, target) from e

    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(target):
            try:
                os.chmod(tmp, os.stat(target).st_mode & 0o7777)  # keep the old file's mode
            except OSError:
                pass
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.filename in (None, tmp):
            raise _of_target(e, target) from e
        raise
    _fsync_dir(directory)


def _of_target(error: OSError, target: str) -> OSError:
    """``error`` (of the temporary file, or of no file) as an error of ``target``, the file
    the caller named: ``[Errno 28] No space left on device: 'model.circle'``."""
    return OSError(error.errno, error.strerror or str(error), target)
