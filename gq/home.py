"""Where a daemon keeps its state, and which daemon a client talks to.

Two modes, one layout:
- **personal**: ``GQ_HOME`` (default ``$XDG_STATE_HOME/gq`` or ``~/.local/state/gq``),
  everything private (0700), the daemon runs as its user;
- **system**: ``/var/lib/gq`` (``GQ_SYSTEM_HOME`` moves it), run by root for every user of
  the node: the directory 0755 and the socket 0666 so that anyone can ask; the database
  0600; the spool 0711 (each job's snapshot is readable by its owner alone).

A client picks, in order: ``GQ_HOME`` set → personal there; else the system socket exists →
system; else personal in the default place (see :func:`locate`).
"""

from __future__ import annotations

import os
import stat

from gq.errors import StateDirectoryTooDeep, UnsafeStateDirectory

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from pathlib import Path

PERSONAL, SYSTEM = "personal", "system"
SYSTEM_ROOT = "/var/lib/gq"
SOCKET_NAME = "gq.sock"
SOCKET_PATH_MAX = 107  # bytes of a unix socket's path (sun_path, less its NUL)


class Home:
    """A state directory and its mode.

    Every command finds its daemon through one, so it is a plain class that imports pathlib
    (and with it re and enum, as long as the rest of a ``gq status`` takes) only when a
    path other than the socket's is asked for."""

    __slots__ = ("_root", "_path", "_mode")

    def __init__(self, root: Path | str, mode: str = PERSONAL):
        self._root = absolute(os.fspath(root))
        self._path: Path | None = None
        self._mode = mode

    @property
    def root(self) -> Path:
        if self._path is None:
            from pathlib import Path

            self._path = Path(self._root)
        return self._path

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def socket_path(self) -> str:
        """The socket's path, without pathlib (what a client connects to)."""
        return f"{self._root}/{SOCKET_NAME}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Home) and (self._root, self._mode) == (other._root, other._mode)

    def __hash__(self) -> int:
        return hash((self._root, self._mode))

    def __repr__(self) -> str:
        return f"Home(root={self.root!r}, mode={self._mode!r})"

    @property
    def system(self) -> bool:
        return self.mode == SYSTEM

    @property
    def db(self) -> Path:
        return self.root / "gq.db"

    @property
    def migration_lock(self) -> Path:
        return self.root / "gq.db.lock"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def socket(self) -> Path:
        return self.root / SOCKET_NAME

    @property
    def daemon_pidfile(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def hosts(self) -> Path:
        """Execution hosts' sockets and pidfiles, one pair per device."""
        return self.root / "hosts"

    @property
    def terminals(self) -> Path:
        """Interactive jobs' terminal sockets, one per job, each its submitter's alone to
        connect to: the directory lets anyone through (0711) but shows no one its names."""
        return self.root / "terminals"

    @property
    def progress(self) -> Path:
        """Step counts of jobs gq's worker does not run, one file per run, each its job's
        to write (gq.exec.job.rank_progress): like ``terminals``, anyone may pass, no one list."""
        return self.root / "progress"

    @property
    def tag(self) -> str:
        """A short name unique to this state directory (its jobs' cgroups go by it)."""
        import hashlib

        return hashlib.sha256(str(self.root).encode()).hexdigest()[:12]

    def check_safe(self) -> None:
        """System mode: the state directory, and every directory above it, belong to root
        (or the daemon's own user) and nobody else may change them, as sshd asks of a user's
        keys. Otherwise another user could swap its files for links to files that root then
        writes (its log, its socket, the spool). A sticky directory above it (/tmp) is fine:
        nobody can rename what root made there."""
        if not self.system:
            return
        from pathlib import Path

        me = os.geteuid()
        given = self.root.absolute()
        for path in dict.fromkeys([given, Path(os.path.realpath(given))]):
            for directory in (path, *path.parents):
                try:
                    info = os.lstat(directory)
                except FileNotFoundError:
                    continue  # made by the daemon, in a directory checked here
                except OSError as exc:
                    raise UnsafeStateDirectory(
                        f"cannot check the state directory {given}: {directory}: {exc.strerror}"
                    ) from None
                problem = None
                if info.st_uid not in (0, me):
                    problem = f"is owned by uid {info.st_uid}"
                elif (
                    stat.S_ISDIR(info.st_mode)
                    and info.st_mode & 0o022
                    and not (directory != path and info.st_mode & stat.S_ISVTX)
                ):
                    problem = "may be written by other users"
                if problem:
                    raise UnsafeStateDirectory(
                        f"the system daemon keeps its state only where no other user can "
                        f"change it: {directory} {problem}; choose another GQ_SYSTEM_HOME "
                        f"than {given}, or fix that directory's owner and mode"
                    )

    def check_socket_room(self) -> None:
        """Its sockets' paths fit a unix socket's address (107 bytes): the daemon's, each
        device's host's (hosts/gpu63.sock), each interactive job's (terminals/JOB.sock, job
        ids of up to six digits). A deeper directory would leave the daemon unable to reach
        its hosts."""
        root = len(os.fsencode(self._root))  # (as socket_path: no pathlib for a client)
        longest = root + max(
            len(f"/{SOCKET_NAME}"), len("/hosts/gpu63.sock"), len("/terminals/999999.sock")
        )
        if longest > SOCKET_PATH_MAX:
            raise StateDirectoryTooDeep(
                f"the state directory {self.root} is too deep for its sockets ({longest} "
                f"bytes of path, at most {SOCKET_PATH_MAX}): choose a shorter GQ_HOME"
            )

    def ensure(self) -> Home:
        """Create the directories with the mode's permissions (the daemon calls this)."""
        self.check_safe()
        top = 0o755 if self.system else 0o700
        self.root.mkdir(mode=top, parents=True, exist_ok=True)
        self.check_safe()  # another user may have made it in the meantime (under /tmp, say)
        self.spool.mkdir(mode=0o711 if self.system else 0o700, exist_ok=True)
        self.hosts.mkdir(mode=0o700, exist_ok=True)
        self.terminals.mkdir(mode=0o711 if self.system else 0o700, exist_ok=True)
        self.progress.mkdir(mode=0o711 if self.system else 0o700, exist_ok=True)
        if self.system:  # an existing directory keeps its mode through mkdir: set it
            os.chmod(self.root, top)
            os.chmod(self.spool, 0o711)
            os.chmod(self.terminals, 0o711)
            os.chmod(self.progress, 0o711)
        self.check_socket_room()  # (after the checks of who may change it: they say more)
        return self


def absolute(path: str) -> str:
    """``path`` as ``pathlib.Path(path).absolute()`` writes it, without importing pathlib:
    joined to the working directory if relative (which is looked up only then: it may have
    been deleted), with no empty or '.' parts (no '//' but a leading pair, no trailing '/');
    '..' is kept, as the directory above a symbolic link is not the link's parent's."""
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    lead = "//" if path.startswith("//") and not path.startswith("///") else "/"
    return lead + "/".join(part for part in path.split("/") if part not in ("", "."))


def _personal_root() -> str:
    """GQ_HOME (made absolute), else the default place."""
    if explicit := os.environ.get("GQ_HOME"):
        return absolute(os.path.expanduser(explicit))
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return absolute(os.path.join(state, "gq"))


def _system_root() -> str:
    return absolute(os.environ.get("GQ_SYSTEM_HOME") or SYSTEM_ROOT)


def personal() -> Home:
    return Home(_personal_root(), PERSONAL)


def system() -> Home:
    return Home(_system_root(), SYSTEM)


def locate() -> Home:
    """The daemon a client talks to: GQ_HOME, else the system daemon if its socket exists,
    else the user's personal daemon."""
    if os.environ.get("GQ_HOME"):
        return personal()
    node = system()
    if os.path.exists(node.socket_path):
        return node
    return personal()
