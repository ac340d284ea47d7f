"""Regular files only: inputs and their hashes are read through `open_regular`, which cannot
block on a FIFO (a `mkfifo docs/x.pdf` would otherwise hang a nightly job in `open()` forever)."""

from __future__ import annotations

import errno
import hashlib
import os
import stat


def open_regular(path: str | os.PathLike):
    """Open a file for reading only if it is a regular file: O_NONBLOCK, so that a FIFO cannot
    block the open, then fstat on the open descriptor (no race with a swapped path). OSError
    otherwise, with a clear strerror."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = special_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise OSError(errno.EINVAL, f"{kind}, not a regular file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def special_kind(mode: int) -> str | None:
    """What a non-regular file is, for messages; None for a regular file."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def sha256_of(path: str | os.PathLike) -> tuple[str, os.stat_result]:
    """The sha256 of a regular file's bytes, and its stat as read (OSError otherwise)."""
    h = hashlib.sha256()
    with open_regular(path) as f:
        st = os.fstat(f.fileno())
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest(), st
