"""The attempt's folder as the supervisor sees it: hostile ground (docs/security.md, "What a
trial's code can reach").

The supervisor runs as root under `--run-as`, and the trial's user owns its attempt folder while
it runs, so every name inside that folder may be swapped for a symlink, a FIFO or another folder
between two looks. The supervisor therefore never resolves a path there. `TrialTree` holds a
descriptor of the attempt folder, opened before the trial got it (its parent belongs to the
worker, so the folder itself cannot be swapped), and reaches everything below it one component
at a time with `openat(..., O_NOFOLLOW)`: a symlink anywhere fails the open, a FIFO or a device
is refused before it is read, `..` is never a step. Deletions (checkpoint retention) unlink
names relative to a descriptor of their folder, or remove a folder with `shutil.rmtree(dir_fd=)`,
which never follows a link. `seal` walks the same way and changes only what it opened.

The supervisor's own files (the command's output, its config, the points it accepted) live
beside the attempt folder, in `attempt-<n>.worker/`, which the trial cannot write.

Standard library only; Linux and other POSIX systems with `openat`."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO the trial planted must not block the supervisor; it is refused after.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafePath(ValueError):
    """A relative path the supervisor will not follow (absolute, empty, or with `..`)."""


def parts_of(relative: str | os.PathLike[str]) -> list[str]:
    """The components of a path below the attempt folder; raises UnsafePath for one that could
    leave it."""
    text = os.fspath(relative)
    if text.startswith("/") or "\x00" in text:
        raise UnsafePath(f"{text!r} is not a path inside the attempt folder")
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"{text!r} leads out of the attempt folder")
    return parts


class TrialTree:
    """A descriptor of one attempt folder and what may be done below it without following a link.
    Create it with `TrialTree.create` (the folder is made here, by the worker) and close it when
    the attempt is over."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def create(cls, path: Path) -> TrialTree:
        """Makes the attempt folder (its parents are the worker's) and opens it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        return cls(path, os.open(path, _DIR_FLAGS))

    @classmethod
    def open(cls, path: Path) -> TrialTree:
        """An existing folder (not a link to one), opened."""
        return cls(path, os.open(path, _DIR_FLAGS))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> TrialTree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- opening ---------------------------------------------------------------------------------

    def open_dir(self, relative: str | os.PathLike[str]) -> int | None:
        """A descriptor of a folder below the attempt folder (the caller closes it), or None when
        any step of the way is missing, not a folder, or a link."""
        fd = os.dup(self.fd)
        try:
            for part in parts_of(relative):
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
        except OSError:
            os.close(fd)
            return None
        return fd

    def open_file(self, relative: str | os.PathLike[str]) -> BinaryIO | None:
        """A regular file below the attempt folder, opened for reading (blocking reads: a regular
        file never blocks), or None when it is missing, a link, a FIFO or anything not a file."""
        *folders, name = parts_of(relative) or [""]
        if not name:
            return None
        folder = self.open_dir("/".join(folders))
        if folder is None:
            return None
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=folder)
        except OSError:
            return None
        finally:
            os.close(folder)
        return _regular(fd)

    def read_bytes(self, relative: str | os.PathLike[str], limit: int = 1 << 20) -> bytes | None:
        """At most `limit` bytes of a regular file below the attempt folder, or None."""
        handle = self.open_file(relative)
        if handle is None:
            return None
        with handle:
            return handle.read(limit)

    def entries(self, relative: str | os.PathLike[str]) -> dict[str, os.stat_result]:
        """Names in a folder below the attempt folder with their `lstat` (links not followed)."""
        fd = self.open_dir(relative)
        if fd is None:
            return {}
        try:
            found = {}
            for name in os.listdir(fd):
                with contextlib.suppress(OSError):
                    found[name] = os.stat(name, dir_fd=fd, follow_symlinks=False)
            return found
        finally:
            os.close(fd)

    def walk_files(self, relative: str | os.PathLike[str] = ".", limit: int = 10_000) -> Iterator[str]:
        """Relative paths of the regular files below a folder of the attempt (links neither
        followed nor listed), at most `limit` of them."""
        fd = self.open_dir(relative)
        if fd is None:
            return
        base = "/".join(parts_of(relative))
        count = 0
        try:
            for folder, _dirs, files, folder_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                for name in sorted(files):
                    with contextlib.suppress(OSError):
                        if stat.S_ISREG(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
                            count += 1
                            yield "/".join(p for p in (base, *parts_of(folder), name) if p)
                    if count >= limit:
                        return
        finally:
            os.close(fd)

    # -- changing ------------------------------------------------------------------------------

    def remove(self, relative: str | os.PathLike[str], name: str) -> bool:
        """Deletes `name` (a regular file, or a whole folder) from a folder below the attempt
        folder, never following a link; a link itself is left alone. Answers whether it went."""
        if name in ("", ".", "..") or "/" in name:
            raise UnsafePath(f"{name!r} is not a name")
        folder = self.open_dir(relative)
        if folder is None:
            return False
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(name, dir_fd=folder)
            elif stat.S_ISREG(info.st_mode):
                os.unlink(name, dir_fd=folder)
            else:
                return False
            return True
        except OSError:
            return False
        finally:
            os.close(folder)

    def hand_over(self, uid: int, gid: int) -> None:
        """Gives the (still empty) attempt folder to the trial's user, alone."""
        os.fchown(self.fd, uid, gid)
        os.fchmod(self.fd, 0o700)

    def seal(self, trial_uid: int | None) -> int:
        """After the attempt, once none of its processes is left: every folder and regular file
        below is the worker's and read-only. Links, FIFOs, sockets and devices are left as they
        are; a regular file with other hard links is left too unless the trial's user owns it (a
        link to somebody else's file must not become readable). Answers how many were sealed."""
        uid, gid = os.geteuid(), os.getegid()
        owner = uid if trial_uid is None else trial_uid
        sealed = _seal_one(self.fd, uid, gid)
        for _folder, dirs, files, folder_fd in os.fwalk(".", dir_fd=self.fd, follow_symlinks=False):
            for name in dirs + files:
                try:
                    fd = os.open(name, _FILE_FLAGS, dir_fd=folder_fd)
                except OSError:
                    continue  # a link (ELOOP), a socket (ENXIO), gone
                try:
                    info = os.fstat(fd)
                    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and info.st_uid != owner:
                        continue
                    if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
                        sealed += _seal_one(fd, uid, gid)
                finally:
                    os.close(fd)
        return sealed


def remove_tree(folder: Path) -> None:
    """Deletes a folder of the worker's (an attempt that ended, or one left behind by an attempt
    returned unrun), sealed or not, best effort; links in it are removed, never followed."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for base, _dirs, _files in os.walk(folder):  # sealed folders have no write bit
        with contextlib.suppress(OSError):
            os.chmod(base, 0o700)
    shutil.rmtree(folder, ignore_errors=True)


def _seal_one(fd: int, uid: int, gid: int) -> int:
    info = os.fstat(fd)
    if uid == 0 and info.st_uid != 0:
        os.fchown(fd, uid, gid)
    read = 0o555 if stat.S_ISDIR(info.st_mode) else 0o444
    os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~0o7222 | read)
    return 1


def _regular(fd: int) -> BinaryIO | None:
    """The descriptor as a blocking binary file when it is a regular file; closed otherwise."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")
