"""A Jupyter kernel's pending note: why its job waited, left by its launcher
(gq.cli.kernel_launch) for the kernel's first cell to say (gq.exec.job.notebook), as a notebook
shows no launcher's log.

Jupyter's connection file is often in /tmp (nbclient and papermill put it there), where
anyone may plant a link or a FIFO beside it. So the note is kept in a directory of its
owner's alone: ``$XDG_RUNTIME_DIR/gq/kernel-notes`` where that runtime directory is the
user's and private, else ``${XDG_CACHE_HOME:-~/.cache}/gq/kernel-notes``. Each time, that
directory is opened without following a link and must be the user's, mode 0700; its files
are then named relative to it, opened without following a link and without blocking (a
FIFO), and only a regular file of the user's is read, and only so much of it. A note is a
courtesy: anything unexpected means no note, never an error. The launcher and the kernel
run as the same user, and the launcher names the note on the kernel's command line.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterator

from gq import defaults

_UNDER_BASE = os.path.join("gq", "kernel-notes")
_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_FAILED = (OSError, ValueError)  # ValueError: a path with a NUL in it


def place(connection_file: str) -> str | None:
    """The note's path for the kernel on ``connection_file``, its directory made: one per
    connection file, so that two kernels never share one. None where the user has no
    private directory to keep it in."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(connection_file))).hexdigest()
    for base in _bases():
        directory = os.path.join(base, _UNDER_BASE)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            os.close(_open_directory(directory))
        except _FAILED:
            continue
        return os.path.join(directory, f"kernel-{digest[:32]}")
    return None


def write(note: str, text: str) -> bool:
    """Leave ``text`` as the note, replacing one left before, whole or not at all; False
    where it could not be."""
    data = text.encode("utf-8", "replace")[: defaults.KERNEL_NOTE_BYTES]
    try:
        with _in_directory(note) as (directory, name):
            partial = f"{name}.new"
            with open(_create(partial, directory), "wb") as handle:
                if not _regular_of_mine(handle.fileno()):
                    return False
                handle.write(data)
            os.replace(partial, name, src_dir_fd=directory, dst_dir_fd=directory)
            return True
    except _FAILED:
        return False


def take(note: str) -> str | None:
    """The note's text (its first KERNEL_NOTE_BYTES), removed once read; None where there
    is none, or where something other than a regular file of the user's has its name."""
    try:
        with _in_directory(note) as (directory, name):
            fd = os.open(name, os.O_RDONLY | _OPEN, dir_fd=directory)
            try:
                if not _regular_of_mine(fd):
                    return None
                data = os.read(fd, defaults.KERNEL_NOTE_BYTES)
            finally:
                os.close(fd)
            os.unlink(name, dir_fd=directory)
    except _FAILED:
        return None
    return data.decode("utf-8", "replace").strip()


def forget(note: str) -> None:
    """Remove the note, if it is still there: its kernel will not read it."""
    with contextlib.suppress(*_FAILED), _in_directory(note) as (directory, name):
        os.unlink(name, dir_fd=directory)


def _bases() -> list[str]:
    """Where the note's directory may go, the best first: the runtime directory (a tmpfs,
    emptied at logout) where it is the user's own, else the user's cache."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # as the XDG spec says: a relative one is ignored
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    bases = [runtime] if _private_runtime(runtime) else []
    if os.path.isabs(cache):
        bases.append(cache)
    return bases


def _private_runtime(path: str) -> bool:
    """The runtime directory the spec asks for: absolute, a real directory (no link) of the
    user's, which no one else may enter (0700). Its notes' directory is checked again."""
    if not os.path.isabs(path):
        return False
    try:
        info = os.lstat(path)
    except _FAILED:
        return False
    return stat.S_ISDIR(info.st_mode) and _mine(info) and not info.st_mode & 0o077


@contextlib.contextmanager
def _in_directory(note: str) -> Iterator[tuple[int, str]]:
    """The note's directory, open and checked, and the note's name in it."""
    path, name = os.path.split(note)
    directory = _open_directory(path)
    try:
        yield directory, name
    finally:
        os.close(directory)


def _open_directory(path: str) -> int:
    """``path`` opened as a directory (not through a link), refused unless it is the
    user's and no one else may enter or change it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if not _mine(info) or stat.S_IMODE(info.st_mode) != 0o700:
        os.close(fd)
        raise PermissionError(f"{path} is not a directory of yours alone (0700)")
    return fd


def _create(name: str, directory: int) -> int:
    """A new file ``name`` in ``directory``, for writing; one found there was left by a
    launcher that died as it wrote (no one else can add to the directory) and goes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN
    try:
        return os.open(name, flags, 0o600, dir_fd=directory)
    except FileExistsError:
        os.unlink(name, dir_fd=directory)
        return os.open(name, flags, 0o600, dir_fd=directory)


def _regular_of_mine(fd: int) -> bool:
    info = os.fstat(fd)
    return stat.S_ISREG(info.st_mode) and _mine(info)


def _mine(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid()
