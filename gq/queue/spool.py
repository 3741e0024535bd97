"""Snapshots of submitted scripts, so editing or deleting the original changes no queued job.

The client reads the script with its own rights and sends the bytes; the daemon writes them
here and never opens a user's path itself. Each job's directory and snapshot belong to the
daemon: the directory is closed to everyone else (0700), so nobody can read another user's
script, swap it for a link, or grow it past what was counted against their --max-spool; the
snapshot itself is 0555, so that the job's process, which gets it from its host as an open
descriptor, can read and run it.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path

from gq.home import Home

_BLOCK = 4096


def footprint(size: int) -> int:
    """What a snapshot of ``size`` bytes costs the spool's disk: its blocks, and a block
    each for the file's and its directory's inodes (so that empty scripts cost something
    too, and a user's millions of them meet --max-spool)."""
    return -(-size // _BLOCK) * _BLOCK + 2 * _BLOCK


def job_dir(home: Home, job_id: int) -> Path:
    return home.spool / str(job_id)


def snapshot(home: Home, job_id: int, name: str, content: bytes) -> Path:
    """Write a new job's snapshot. A directory already there for this id is a leftover of a
    submission whose row never committed (the daemon died in between): it goes first."""
    target_dir = job_dir(home, job_id)
    if target_dir.exists() or target_dir.is_symlink():
        discard(home, job_id)
    target_dir.mkdir(mode=0o700)
    target = target_dir / name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o555)
    try:
        written = memoryview(content)
        while written:
            written = written[os.write(fd, written) :]
    finally:
        os.close(fd)
    return target


def first_line(path: str, limit: int = 256) -> bytes:
    """The start of a snapshot's first line (a ``#!`` line is at most 256 bytes long)."""
    return read(path, limit, whole=False).split(b"\n")[0]


def open_regular(path: str | os.PathLike, access: int = os.O_RDONLY) -> int:
    """A snapshot opened so that nothing at its path blocks or redirects root (no link
    followed, no terminal taken, no FIFO waited for), and only if it is a regular file
    (OSError otherwise). Snapshots of gq versions before 0007 belong to their user, who
    may have made them anything."""
    fd = os.open(path, access | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return fd


def read(path: str, limit: int, whole: bool = True) -> bytes:
    """A snapshot's content, at most ``limit`` bytes (past it: ValueError, or its first
    ``limit`` bytes if not ``whole``)."""
    fd = open_regular(path)
    try:
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        content = b"".join(chunks)
    finally:
        os.close(fd)
    if len(content) > limit:
        if whole:
            raise ValueError(f"{path} is over {limit} bytes")
        content = content[:limit]
    return content


def discard(home: Home, job_id: int) -> None:
    """Delete a job's snapshot. It is emptied first: a process that still holds it open
    (a job's own descriptor 3, passed on) would otherwise keep its blocks after the
    unlink, where --max-spool no longer counts them."""
    directory = job_dir(home, job_id)
    _each_snapshot_in(directory, os.O_WRONLY, lambda fd: os.ftruncate(fd, 0))
    shutil.rmtree(directory, ignore_errors=True)


def _each_snapshot_in(directory: str | os.PathLike, access: int, action) -> None:
    """``action(fd)`` on each regular file of a job's directory, opened as open_regular
    does; what cannot be opened so is left alone."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        try:
            fd = open_regular(os.path.join(directory, name), access)
        except OSError:
            continue
        try:
            action(fd)
        finally:
            os.close(fd)


def make_private(home: Home) -> int:
    """Snapshots written by gq before 0007 belong to their user, who could make them
    writable and grow them, in directories others may enter: make them the daemon's, 0555
    in 0700 directories, as new ones are. How many it changed (the daemon runs it at
    start; a second run changes nothing)."""
    changed = 0
    me, my_group = os.geteuid(), os.getegid()

    def make_mine(fd: int) -> None:
        os.fchown(fd, me, my_group)
        os.fchmod(fd, 0o555)

    for entry in os.scandir(home.spool):
        if not entry.is_dir(follow_symlinks=False) or not entry.name.isdigit():
            continue
        info = entry.stat(follow_symlinks=False)
        if info.st_uid == me and stat.S_IMODE(info.st_mode) == 0o700:
            continue
        os.chmod(entry.path, 0o700, follow_symlinks=False)
        os.chown(entry.path, me, my_group, follow_symlinks=False)
        _each_snapshot_in(entry.path, os.O_RDONLY, make_mine)
        changed += 1
    return changed


def discard_snapshots(home: Home, paths: Iterable[str]) -> None:
    """Delete snapshots by their paths, as the queue stored them (never outside the spool)."""
    for path in paths:
        directory = os.path.dirname(path)
        name = os.path.basename(directory)
        if os.path.dirname(directory) == str(home.spool) and name.isdigit():
            discard(home, int(name))
