"""Regular files only: inputs and their hashes are read through `open_regular`, which cannot
block on a FIFO (a `mkfifo docs/x.pdf` would otherwise hang a nightly job in `open()` forever).

And nothing written through a link: the writers reach every folder of the output tree with
`OutputTree.folder`, which opens it from the tree's root one name at a time with O_NOFOLLOW
(and `dir_fd`), so a symbolic link (or a file) planted where the tree needs a folder is a
`PlantedPath` naming it, before anything is written or deleted. The root itself (the folder the
user named) may be reached through links."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; nothing is taken for abandoned there
    fcntl = None

from ..errors import WriteError, path_text


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


def file_stamp(doc) -> tuple | None:
    """What identifies the version of a document's file: device, inode, size, mtime (None if it
    cannot be read now; reading it will say why)."""
    try:
        st = os.stat(doc.path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def changed_since(doc, stamp: tuple | None) -> str | None:
    """How the document's file differs from `stamp` (replaced, rewritten, gone), or None. A run
    reads a document page by page in several processes: a file replaced meanwhile would give
    pages of two versions under the first one's name and checksum."""
    now = file_stamp(doc)
    if stamp is None or now == stamp:
        return None
    if now is None:
        return "the file is gone"
    if now[:2] != stamp[:2]:
        return "the file was replaced by another"
    return "the file was rewritten"


# -- the output tree: folders opened from its root without following links --------------------


class PlantedPath(OSError, WriteError):
    """A symbolic link, or something that is not a folder, where the output tree needs a folder
    of its own (or a link where it writes a file): nothing is written or deleted through it.
    An OSError, so a writer's caller fails that one document with this reason (`strerror`), and
    a WriteError (exit 73) for callers that go by our types."""

    def __str__(self) -> str:
        return self.strerror


# POSIX: every folder below the root is opened relative to its parent's descriptor with
# O_NOFOLLOW, and files are made, listed and removed relative to the folder's descriptor.
# Elsewhere (Windows): the same checks with lstat, then the operations by path.
_AT = os.open in os.supports_dir_fd and hasattr(os, "O_NOFOLLOW") and hasattr(os, "O_DIRECTORY")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_BINARY", 0)


def _link(shown: Path, target: str | None, doing: str) -> PlantedPath:
    return PlantedPath(errno.ELOOP, f"{path_text(shown)} is a symbolic link (to {path_text(target or '?')}): "
                                    f"refusing to {doing} through it", str(shown))


def _check(at: Path, st: os.stat_result, doing: str) -> os.stat_result:
    """`st` (the lstat of `at`, where the tree needs a folder) if it is one; else PlantedPath."""
    if stat.S_ISLNK(st.st_mode):
        raise _link(at, _readlink(at), doing)
    if not stat.S_ISDIR(st.st_mode):
        raise PlantedPath(errno.ENOTDIR, f"{path_text(at)} is {special_kind(st.st_mode) or 'a file'}, not a folder: "
                                         f"refusing to {doing} there", str(at))
    return st


def _readlink(path: Path | str, dir_fd: int | None = None) -> str | None:
    try:
        return os.readlink(path, dir_fd=dir_fd)
    except OSError:
        return None


class OutputFolder:
    """A folder of the output tree, reached from the tree's root one name at a time, none of
    them a link (`OutputTree.folder`). Files are made, listed and removed through it."""

    def __init__(self, root: Path, path: Path, fd: int | None):
        self.root, self.path, self.fd = root, path, fd

    def _at(self, name: str) -> str | Path:
        return name if self.fd is not None else self.path / name  # with dir_fd=self.fd

    def check_target(self, name: str) -> None:
        """PlantedPath if `name` here is a symbolic link (no file the writers make is one)."""
        try:
            st = os.stat(self._at(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise _link(self.path / name, _readlink(self._at(name), self.fd), "write")

    def verify(self) -> None:
        """Still the folder opened (no name on the way swapped for a link since): checked just
        before the renames that put files in place."""
        st = _walk(self.root, self.path, "write")
        if self.fd is not None and st is not None and _ident(st) != _ident(os.fstat(self.fd)):
            raise PlantedPath(errno.ESTALE, f"{path_text(self.path)} was replaced by another folder while it was "
                                            "written to: refusing to write there", str(self.path))

    def create(self, name: str) -> int:
        """A new file `name` here (never through a link; O_EXCL), open for writing."""
        return os.open(self._at(name), _NEW_FILE, 0o666, dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """Remove the entry `name` (a link itself, never what it points to) where it is there;
        an OSError naming it where it is there and stays (a folder, an immutable file)."""
        try:
            os.unlink(self._at(name), dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(self.path / name)) from None

    def unlink(self, name: str) -> bool:
        """Remove the entry `name` (a link itself, never what it points to); False if it failed."""
        try:
            os.unlink(self._at(name), dir_fd=self.fd)
            return True
        except OSError:
            return False

    def identity(self) -> tuple[int, int] | None:
        """(device, inode) of this folder; None if it cannot be read."""
        try:
            return _ident(os.fstat(self.fd) if self.fd is not None else os.stat(self.path))
        except OSError:
            return None

    def hold(self, fd: int) -> None:
        """Mark the file `fd` (made by create) as in use for as long as it is open: an advisory
        lock, which the kernel lets go of when its holder closes it or dies. Where the file system
        has no such locks, abandoned cannot take one either and removes nothing."""
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                pass

    def abandoned(self, name: str, older_than: float) -> bool:
        """True if the regular file `name` here is older than `older_than` seconds and no live
        process holds it (see hold): what a killed writer leaves."""
        if fcntl is None:
            return False
        try:
            fd = os.open(self._at(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or time.time() - st.st_mtime < older_than:
                return False
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while its writer lives
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        try:
            return os.listdir(self.fd if self.fd is not None and os.listdir in os.supports_fd else self.path)
        except OSError:
            return []

    def fsync(self) -> None:
        # Makes renames durable on POSIX; not possible (nor needed) on Windows.
        if self.fd is not None:
            try:
                os.fsync(self.fd)
            except OSError:
                pass


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _walk(root: Path, folder: Path, doing: str) -> os.stat_result | None:
    """lstat of every name below `root` down to `folder`: PlantedPath for a link or a
    non-folder among them (`doing` to `folder` itself, "write" to those above it); the stat
    of `folder` (None when a name is missing)."""
    try:
        st, at = os.stat(root), root
        for part in folder.relative_to(root).parts:
            at = at / part
            st = _check(at, os.lstat(at), doing if at == folder else "write")
    except FileNotFoundError:
        return None
    return st


class OutputTree:
    """The folders below `root` a write uses, each opened once (see OutputFolder); `root` itself
    is the caller's folder and may be reached through links, nothing below it may be. With
    root=None every folder is its own root: only the files written in it are checked."""

    def __init__(self, root: Path | None):
        self.root = Path(root) if root is not None else None
        self._folders: dict[Path, OutputFolder] = {}
        self._fds: list[int] = []

    def __enter__(self) -> "OutputTree":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._folders.clear()

    def folder(self, path: Path, create: bool = True, doing: str | None = None) -> OutputFolder | None:
        """The folder at `path` (made, with the folders above it, if `create`; else None when
        it is not there). PlantedPath if a name on the way below the root is a link or not a
        folder (refusing to `doing` there: "write", or "write or delete" where nothing is made);
        OSError as usual otherwise."""
        path = Path(path)
        if path in self._folders:
            return self._folders[path]
        root = self.root if self.root is not None and path.is_relative_to(self.root) else path
        doing = doing or ("write" if create else "write or delete")
        if _walk(root, path, doing) is None and not create:
            return None
        os.makedirs(root, exist_ok=True)
        if not _AT:
            os.makedirs(path, exist_ok=True)
            _walk(root, path, doing)  # checked again once made
            self._folders[path] = OutputFolder(root, path, None)
            return self._folders[path]
        fd = self._keep(os.open(root, _DIR_FLAGS))
        at = root
        for part in path.relative_to(root).parts:
            at = at / part
            try:
                fd = self._keep(os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
                continue
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile: opened (and checked) below like any other
            except OSError as e:  # a link or a file in the way (ELOOP, ENOTDIR; EMLINK, EFTYPE on BSDs)
                if e.errno not in (errno.ENOTDIR, errno.ELOOP, getattr(errno, "EMLINK", -1), getattr(errno, "EFTYPE", -1)):
                    raise
                _check(at, os.stat(part, dir_fd=fd, follow_symlinks=False), doing if at == path else "write")
            fd = self._keep(os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd))
        self._folders[path] = OutputFolder(root, path, fd)
        return self._folders[path]

    def _keep(self, fd: int) -> int:
        self._fds.append(fd)
        return fd
