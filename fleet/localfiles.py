"""Files on the control machine: the one atomic writer and the one lock of fleet's local
files (the bundle and patch-plan caches, the wheel cache, the sandbox's state).

On a host the same two jobs are ``fleet/onhost/files.py``'s (``replace_file``,
``FileLock``); this module is their local counterpart (``tests/unit/test_layout.py`` checks
that no other module of fleet writes a temp file and renames it, or takes a flock).

- :func:`atomic_write`: a reader sees the old file or the new one, never a part: a new
  temp file beside the target (``mkstemp``: a unique name opened ``O_EXCL``, so nothing
  planted under a guessable name is followed), then a rename over the target; the temp
  file is removed again when anything fails.
- :func:`locked`: an exclusive ``flock`` held for a block, across processes and threads.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | str,
    *,
    mode: int = 0o600,
    dir_mode: int = 0o700,
    durable: bool = False,
) -> None:
    """``path`` holds ``data`` (text is UTF-8) from one instant to the next. Missing
    directories are made (``dir_mode``); the file gets ``mode``. ``durable``: fsync the
    file and its directory too (state that must survive a crash, not a cache)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            os.fchmod(fh.fileno(), mode)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
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


@contextmanager
def locked(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive lock file (made with its directory when missing): one download, unpack,
    image build or sandbox change at a time per name, across processes and threads alike
    (each holder opens the file: flock is per open file)."""
    lock = Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
