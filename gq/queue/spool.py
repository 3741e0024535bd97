"""Snapshots of submitted scripts, so editing or deleting the original changes no queued job.

The client reads the script with its own rights and sends the bytes; the daemon writes them
here and never opens a user's path itself. Each job's directory belongs to the daemon (so
nobody can swap the snapshot for a link), and the snapshot to the job's owner, mode 0500:
readable by its owner and root only, runnable by the owner's job.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from gq.home import Home


def job_dir(home: Home, job_id: int) -> Path:
    return home.spool / str(job_id)


def snapshot(home: Home, job_id: int, name: str, content: bytes, uid: int | None,
             gid: int | None) -> Path:
    """Write a new job's snapshot. A directory already there for this id is a leftover of a
    submission whose row never committed (the daemon died in between): it goes first."""
    target_dir = job_dir(home, job_id)
    if target_dir.exists() or target_dir.is_symlink():
        discard(home, job_id)
    target_dir.mkdir(mode=0o711 if home.system else 0o700)
    target = target_dir / name
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
    try:
        written = memoryview(content)
        while written:
            written = written[os.write(fd, written):]
        if uid is not None and gid is not None and (uid, gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)
    return target


def discard(home: Home, job_id: int) -> None:
    shutil.rmtree(job_dir(home, job_id), ignore_errors=True)


def discard_snapshots(home: Home, paths: Iterable[str]) -> None:
    """Delete snapshots by their paths, as the queue stored them (never outside the spool)."""
    for path in paths:
        directory = os.path.dirname(path)
        name = os.path.basename(directory)
        if os.path.dirname(directory) == str(home.spool) and name.isdigit():
            discard(home, int(name))
