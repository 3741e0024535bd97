"""An interactive job's pseudo-terminal, as its execution host holds it (``gq run --pty``).

The host opens the pair; the job's process gets the slave as its controlling terminal and
its standard streams (:func:`gq.exec.host.spawn.start_as_submitter`). The host keeps the master
only until the submitter's gq takes it: it listens on a socket of the job's own
(``terminals/<job>.sock``, which only the job's user may connect to), checks the peer's
uid (SO_PEERCRED), passes the master beside a :class:`~gq.exec.host.messages.TerminalHandedOver`
line (SCM_RIGHTS) and closes its own copy. From then on the client holds the only master:
its exit, or its terminal's, hangs the job's session up (the kernel's SIGHUP), as a closed
terminal hangs up a login shell, with no root process relaying anything. The host reads
nothing from the terminal, and of the client's connection only whether it is still there
(the client never writes to it): closed while the job runs, the job was hung up.

A terminal outlives its job's process until it is taken (or no one took it in time): a
command that ends before its gq attaches still leaves its output to be read.
"""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import selectors
import socket
import struct
import termios
import time

from gq.errors import LaunchError
from gq.exec.host.messages import LaunchSpec, TerminalHandedOver
from gq.exec.protocol import encode, terminal_socket

log = logging.getLogger("gq.host")
_DEFAULT_SIZE = struct.pack("HHHH", 24, 80, 0, 0)  # rows, columns: until the client's comes
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class Terminals:
    """A host's interactive jobs' terminals, by job: each from its job's start until its gq
    has taken it and the job has ended, or until no gq took it in time."""

    def __init__(self, directory: str | None, wait: float, selector: selectors.BaseSelector):
        self.directory = directory
        self.wait = wait  # seconds a started job's terminal waits to be taken
        self.selector = selector
        self.by_job: dict[int, Terminal] = {}

    def open(self, spec: LaunchSpec) -> int:
        """The job's new terminal; the slave, for the job's process (the caller closes it
        once the process has it; :meth:`discard` if it never starts)."""
        if self.directory is None:
            raise LaunchError(
                f"job {spec.id} is interactive; this execution host has no directory for terminals"
            )
        try:
            terminal, slave = Terminal.open(spec, self.directory, self.wait, self.selector)
        except OSError as exc:
            raise LaunchError(f"cannot open a terminal for job {spec.id}: {exc}") from None
        self.by_job[spec.id] = terminal
        return slave

    def has(self, job: int) -> bool:
        return job in self.by_job

    def on_event(self, terminal: Terminal, running: bool) -> bool:
        """Its gq connects (the master goes to it), or, once it has it, leaves. True where
        the job (``running`` still) has thereby lost its terminal: it is hung up."""
        if not terminal.handed_over:
            if terminal.hand_over() and not running:  # it ended before: its output remains
                self.discard(terminal.job)
            return False
        gone = terminal.client_gone()
        terminal.stop_watching()
        return gone and running

    def job_ended(self, job: int) -> bool:
        """The job's process has exited: its terminal, if its gq has it, is closed; True
        where that gq had gone first (the job ended on the hang-up). A terminal not taken
        yet stays, so that a command that ended first still shows its output."""
        terminal = self.by_job.get(job)
        if terminal is None or not terminal.handed_over:
            return False
        gone = terminal.client_gone()
        self.discard(job)
        return gone

    def last_used(self, job: int) -> float | None:
        """When the job's terminal was last typed on or written to (wall clock), as ``w``
        reads a login's; None for a job without one."""
        terminal = self.by_job.get(job)
        if terminal is None:
            return None
        try:
            status = os.stat(terminal.tty)
        except OSError:
            return None
        return max(status.st_atime, status.st_mtime)

    def untaken(self, now: float) -> list[Terminal]:
        """The terminals no gq took in time (their gq died while the job was pending),
        closed: which hangs up the jobs still running."""
        expired = [t for t in self.by_job.values() if not t.handed_over and now >= t.deadline]
        for terminal in expired:
            self.discard(terminal.job)
        return expired

    def discard(self, job: int) -> None:
        terminal = self.by_job.pop(job, None)
        if terminal is not None:
            terminal.close()

    def close(self) -> None:
        for job in list(self.by_job):
            self.discard(job)


class Terminal:
    """One job's terminal: the master until it is handed over, then the client's connection
    (watched for its closing). Registered in the host's selector with itself as the data."""

    def __init__(
        self,
        job: int,
        run: int,
        uid: int,
        path: str,
        master: int,
        tty: str,
        listener: socket.socket,
        deadline: float,
        selector: selectors.BaseSelector,
    ):
        self.job, self.run, self.uid, self.path = job, run, uid, path
        self.tty = tty  # the slave's name (/dev/pts/N): its times are the job's idle time
        self.master: int | None = master
        self.listener: socket.socket | None = listener
        self.client: socket.socket | None = None
        self.deadline = deadline  # monotonic: untaken then, it is closed (the job hung up)
        self.selector = selector
        selector.register(listener, selectors.EVENT_READ, self)

    @classmethod
    def open(
        cls, spec: LaunchSpec, directory: str, wait: float, selector: selectors.BaseSelector
    ) -> tuple[Terminal, int]:
        """A new pair for the job, and its socket; the terminal and the slave (the job's,
        to be closed by the caller once the job's process has it). OSError if the node has
        no pseudo-terminal or socket to spare."""
        master, slave = os.openpty()
        try:
            tty = os.ttyname(slave)
            fcntl.ioctl(master, termios.TIOCSWINSZ, _DEFAULT_SIZE)
            uid = os.geteuid() if spec.uid is None else spec.uid
            if os.geteuid() == 0 and uid != 0:
                # The user's own terminal, as login and sshd make it: theirs, their tty group's
                # to write to (mesg), and reopened by name (/dev/pts/N) by what needs to.
                os.fchown(slave, uid, _tty_group(spec.gid))
                os.fchmod(slave, 0o620)
            path = terminal_socket(directory, spec.id)
            listener = _listen(path, uid, spec.gid)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        return cls(
            spec.id, spec.run, uid, path, master, tty, listener, time.monotonic() + wait, selector
        ), slave

    @property
    def handed_over(self) -> bool:
        return self.master is None

    def hand_over(self) -> bool:
        """A connection is waiting: give the master to it if its peer is the job's user (any
        other is closed at once). True once handed over; the host keeps no copy."""
        assert self.listener is not None and self.master is not None  # asked only until then
        try:
            connection, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as exc:  # out of descriptors: the client tries again
            log.warning("job %d: cannot accept its terminal's client: %s", self.job, exc)
            return False
        uid = _PEERCRED.unpack(
            connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )[1]
        if uid != self.uid:
            log.warning(
                "job %d: uid %d asked for its terminal, which is uid %d's; refused",
                self.job,
                uid,
                self.uid,
            )
            connection.close()
            return False
        try:
            socket.send_fds(
                connection, [encode(TerminalHandedOver(self.job, self.run))], [self.master]
            )
        except OSError as exc:
            log.warning("job %d: cannot hand its terminal over: %s", self.job, exc)
            connection.close()
            return False
        os.close(self.master)
        self.master = None
        self._stop_listening()
        connection.setblocking(False)
        self.client = connection
        self.selector.register(connection, selectors.EVENT_READ, self)
        log.info("job %d: its terminal was handed to its gq", self.job)
        return True

    def client_gone(self) -> bool:
        """Whether the client that took the terminal has gone (its connection closed): it
        never writes, so anything it did write is its own mistake and means nothing."""
        if self.client is None:
            return False
        try:
            return self.client.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def stop_watching(self) -> None:
        """Forget the client's connection (gone, or one that wrote what it must not)."""
        if self.client is not None:
            self.selector.unregister(self.client)
            self.client.close()
            self.client = None

    def close(self) -> None:
        """Close everything the host holds of it: a master still held hangs the job's
        session up, as a terminal that closes does."""
        self._stop_listening()
        self.stop_watching()
        if self.master is not None:
            os.close(self.master)
            self.master = None

    def _stop_listening(self) -> None:
        if self.listener is None:
            return
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _listen(path: str, uid: int, gid: int | None) -> socket.socket:
    """The job's terminal socket, its user's alone to connect to."""
    listener = bind_for_user(path, socket.SOCK_STREAM, uid, gid)
    try:
        listener.listen(4)
    except BaseException:
        listener.close()
        raise
    return listener


def bind_for_user(path: str, kind: int, uid: int | None, gid: int | None) -> socket.socket:
    """A job's socket, made private (0600) before anyone can connect, then given to the
    job's user (its directory is root's: no one else can make or swap names there), and
    non-blocking: the host never waits on what a job sends."""
    sock = bind_private(path, kind)
    try:
        if os.geteuid() == 0 and uid is not None and uid != 0:
            os.chown(path, uid, -1 if gid is None else gid, follow_symlinks=False)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def bind_private(path: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A unix socket bound at ``path`` (whatever was there removed), made 0600 as it is
    bound, so that no one can connect (or send) before its owner is set."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, kind)
    old_umask = os.umask(0o177)
    try:
        listener.bind(path)
    except BaseException:
        listener.close()
        raise
    finally:
        os.umask(old_umask)
    return listener


def _tty_group(fallback: int | None) -> int:
    try:
        return grp.getgrnam("tty").gr_gid
    except KeyError:
        return -1 if fallback is None else fallback
