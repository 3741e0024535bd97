"""A cgroup filesystem's files as gq reads and writes them: control files written in one
write, nothing buffered and never created (the kernel refuses what a cgroup does not have),
read whole; a refusal or an unreadable file as False or empty text, which callers take as
"not here" (no such controller, no such cgroup); and directories made. Shared by
:mod:`gq.exec.cgroups.job_cgroups` and :mod:`gq.exec.cgroups.hierarchies`.
"""

from __future__ import annotations

import os


def make(path: str) -> None:
    """mkdir -p, again where another host of the instance removed an empty parent meanwhile
    (``remove_device`` as it exits)."""
    for attempt in range(3):
        try:
            os.makedirs(path, exist_ok=True)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def put(path: str, data: bytes) -> None:
    """Write a control file: one write, nothing buffered, created never (OSError)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write(path: str, control: str, value: str) -> bool:
    """Write a control file; False where the kernel refuses (missing, busy, not allowed)."""
    try:
        put(os.path.join(path, control), value.encode())
    except OSError:
        return False
    return True


def read(path: str, control: str) -> str:
    """A control file's text; empty where it cannot be read (no such cgroup or file)."""
    try:
        with open(os.path.join(path, control)) as handle:
            return handle.read()
    except OSError:
        return ""


def number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() else None
