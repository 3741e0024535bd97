"""The cgroup hierarchies this process can see, and where in them gq may make its cgroups:
each hierarchy's mount (v2's unified one, or v1's freezer, memory, pids and cpu), the
calling process's own cgroup in each, and the instance's base directory there (on v2,
beside systemd's ``supervisor`` leaf of a delegated unit).
:func:`gq.exec.cgroups.job_cgroups.detect` picks a backend from what these find.
"""

from __future__ import annotations

import os
import re

from gq.exec.cgroups import files

V2 = "unified"  # the v2 hierarchy's key in a backend's bases and a job's paths
V1_HIERARCHIES = ("freezer", "memory", "pids", "cpu")
# The leaf of its unit's cgroup that systemd starts the daemon in (DelegateSubgroup=, as
# packaging/gq.service asks): gq's cgroups go beside it on v2.
SUPERVISOR = "supervisor"


def bases(
    mounts: dict[str, tuple[str, str]],
    own: dict[str, str],
    hierarchies: tuple[str, ...],
    base_name: str,
) -> dict[str, str]:
    """The base directory in each of ``hierarchies`` where this process may make cgroups."""
    bases = {}
    for hierarchy in hierarchies:
        if hierarchy not in mounts or hierarchy not in own:
            continue
        directory = _directory(*mounts[hierarchy], own[hierarchy])
        if directory is not None and hierarchy == V2:
            directory = _beside_supervisor(directory, base_name)
        if directory is not None and _usable(os.path.join(directory, base_name)):
            bases[hierarchy] = os.path.join(directory, base_name)
    return bases


def _beside_supervisor(directory: str, base_name: str) -> str:
    """Where gq's base goes on v2: in the daemon's own cgroup, or where that is the leaf
    systemd starts a delegated unit's main process in (DelegateSubgroup=supervisor), beside
    it, in the unit's cgroup (v2 passes controllers only below cgroups that hold no
    processes). Only where systemd marked that cgroup delegated (its ``trusted.delegate``
    attribute): a cgroup that merely has that name is not gq's to change."""
    if os.path.basename(directory) != SUPERVISOR:
        return directory
    unit = os.path.dirname(directory)
    if _delegated(unit) and _usable(os.path.join(unit, base_name)):
        return unit
    return directory


def _delegated(path: str) -> bool:
    for name in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, name).strip() in (b"1", b"yes", b"true"):
                return True
        except OSError:
            continue
    return False


def mounts() -> dict[str, tuple[str, str]]:
    """Mount point and root of each hierarchy (V2, or a v1 controller of interest)."""
    found: dict[str, tuple[str, str]] = {}
    for line in files.read("/proc/self", "mountinfo").splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        separator = fields.index("-", 6)
        if len(fields) < separator + 4:
            continue
        fstype, options = fields[separator + 1], fields[separator + 3].split(",")
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            found.setdefault(V2, (point, root))
        elif fstype == "cgroup":
            for hierarchy in V1_HIERARCHIES:
                if hierarchy in options:
                    found.setdefault(hierarchy, (point, root))
    return found


def own_cgroups() -> dict[str, str]:
    """The calling process's cgroup in each hierarchy (V2, or a v1 controller)."""
    found: dict[str, str] = {}
    for line in files.read("/proc/self", "cgroup").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for hierarchy in controllers.split(",") if controllers else [V2]:
            found[hierarchy] = path
    return found


def _directory(point: str, root: str, path: str) -> str | None:
    """Where cgroup ``path`` lies under a mount of the hierarchy's ``root``; None where that
    mount does not show it (a container's view, another cgroup namespace)."""
    if root != "/":
        if path != root and not path.startswith(root + "/"):
            return None
        path = path[len(root) :]
    parts = [part for part in path.split("/") if part]
    if ".." in parts:
        return None
    return os.path.join(point, *parts)


def _usable(base: str) -> bool:
    """Whether this process may make cgroups in ``base``, made here where missing (and
    kept: the instance's jobs go there). Never makes the parents: they are our own cgroup."""
    try:
        os.mkdir(base)
    except FileExistsError:
        pass
    except OSError:
        return False
    return os.access(base, os.W_OK | os.X_OK)


def _unescape(text: str) -> str:
    """A mountinfo field as the path it stands for (spaces and the like come as \\040)."""
    return re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), text)
