# Durable files and locks ON THE HOST: the one atomic writer and the one lock that every
# on-host script uses (patch writes vLLM's files, serve writes a profile's run directory).
#
#   write_temp     a complete, fsynced temp file beside the target (a new unique name)
#   rename_temp    a complete temp file renamed over its target (then fsync_dir)
#   replace_file   write_temp + rename_temp + fsync of the directory: a reader sees the
#                  old file or the new one, never a part
#   FileLock       an exclusive flock, waited for up to a bound, then Refused(host-busy)
import errno
import fcntl
import os
import time
from typing import Optional, Tuple

from fleet.onhost._common import Refused


def fsync_dir(directory: str) -> None:
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


def write_temp(path: str, data: bytes, like: Optional[str] = None, mode: int = 0o600) -> str:
    """A complete, fsynced temp file next to ``path`` (same directory, same filesystem).

    A new, unique name (mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW), created with ``mode`` (the
    mode and owner of ``like`` when given), so nothing that already sits there (a symlink
    planted under a guessable name) is ever opened; the temp file is removed again if
    anything fails before it is complete."""
    fd, tmp = _new_temp(path, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if like is not None:
            st = os.stat(like)
            os.chmod(tmp, st.st_mode & 0o7777)
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except OSError:
                pass
    except BaseException:
        unlink_quietly(tmp)
        raise
    return tmp


def _new_temp(path: str, mode: int) -> Tuple[int, str]:
    """A new file ``.<name>.fleet-tmp-<random>`` beside ``path``, opened as mkstemp opens
    one (O_CREAT|O_EXCL|O_NOFOLLOW): a name already taken is never opened."""
    directory = os.path.dirname(path) or "."
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    for _attempt in range(100):
        name = ".%s.fleet-tmp-%s" % (os.path.basename(path), os.urandom(6).hex())
        tmp = os.path.join(directory, name)
        try:
            return os.open(tmp, flags, mode & 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", path)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def drop_stale_temps(path: str) -> None:
    """Remove temp files an interrupted writer of ``path`` left beside it."""
    directory = os.path.dirname(path) or "."
    prefix = ".%s.fleet-tmp-" % os.path.basename(path)
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        if entry.startswith(prefix):
            unlink_quietly(os.path.join(directory, entry))


def replace_file(path: str, data: bytes, like: Optional[str] = None, mode: int = 0o600) -> None:
    """``path`` holds ``data`` from one instant to the next (temp + fsync + rename); the
    directory is created (0700) when missing."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = write_temp(path, data, like, mode)
    try:
        rename_temp(tmp, path)
    except BaseException:
        unlink_quietly(tmp)
        raise
    fsync_dir(directory)


def rename_temp(tmp: str, path: str) -> None:
    """Rename ``tmp`` (a complete file of ``write_temp``) over ``path``: the second half
    of ``replace_file``, for a writer that renames several files only once all of them
    are written (``fleet patch``: it records each rename, then ``fsync_dir``)."""
    os.replace(tmp, path)


class FileLock:
    """An exclusive flock on ``path`` (created 0600), waited for up to ``wait_s`` seconds
    (0: not at all); past that, ``Refused(busy, "host-busy")``."""

    def __init__(self, path: str, wait_s: float, busy: str) -> None:
        self.path = path
        self.wait_s = wait_s
        self.busy = busy
        self.fd = -1

    def __enter__(self) -> "FileLock":
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    os.close(self.fd)
                    self.fd = -1
                    raise
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = -1
                    raise Refused(self.busy, "host-busy") from None
                time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def lock_held(path: str) -> bool:
    """Does another process hold the flock on ``path`` now?"""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
