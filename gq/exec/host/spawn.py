"""Starting a job's process: as its submitter, in its own process group (and cgroup, where
the host has them), dying with its execution host. Signalling and reading its processes once
they run is :mod:`gq.exec.host.process_groups`'s.

A host never waits on a job's process once it is the user's: the fork returns as soon as
the child leads its own session and sits in its cgroup (still as root, which no user can
stop), and the rest of its set-up (the identity switch, the working directory, the output
files, the exec) happens while the host's loop goes on. A set-up that fails writes why to a
close-on-exec pipe the host reads from its loop; a set-up the user stops is their own job's
process, stopped, killed by a cancel or the job's time limit like any other."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import signal
import stat
import sys
import termios
import time

from gq import defaults, wakeup
from gq.defaults import SCRIPT_FD, SCRIPT_PATH, TERMINAL_FD
from gq.errors import LaunchError
from gq.exec.cgroups.job_cgroups import JobCgroup
from gq.exec.host.messages import LaunchSpec

_PR_SET_PDEATHSIG = 1
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000
_libc = ctypes.CDLL(None, use_errno=True)
# The job's output: never through a link, never a controlling terminal, never a wait for a
# FIFO's reader.
_OUTPUT_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_APPEND
    | os.O_NOFOLLOW
    | os.O_NOCTTY
    | os.O_NONBLOCK
    | os.O_CLOEXEC
)
SETUP_FAILED_EXIT = 127  # the child's exit status when its set-up failed before the exec


def identity(spec: LaunchSpec) -> tuple[int, int, list[int]] | None:
    """The uid, gid and groups the job's process must take, or None to keep the host's own
    (a personal host runs its owner's jobs). A root host never runs a job as root unless
    root submitted it, and never one whose identity is missing."""
    if os.geteuid() != 0:
        if spec.uid not in (None, os.geteuid()):
            raise LaunchError(
                f"job {spec.id} belongs to uid {spec.uid}; this execution host "
                f"runs as uid {os.geteuid()} and cannot run it"
            )
        return None
    if spec.uid is None or spec.gid is None:
        raise LaunchError(f"job {spec.id} has no uid or gid; refusing to run it as root")
    if spec.uid == 0:
        return None  # root's own job
    return spec.uid, spec.gid, list(spec.groups) or [spec.gid]


class JobProcess:
    """A job's process as its host sees it: the pid that leads its process group, and until
    its exec (or its failure before it) the pipe that says how its set-up went."""

    def __init__(self, pid: int, setup_pipe: int):
        self.pid = pid
        self.setup_pipe: int | None = setup_pipe  # closed by the child's exec
        self.setup_failure: str | None = None  # why it never reached its exec
        self.returncode: int | None = None

    def read_setup(self) -> None:
        """Once the pipe is readable (or the child has exited): an empty pipe means the exec
        happened; anything in it is why the set-up failed. Closes the pipe."""
        if self.setup_pipe is None:
            return
        try:
            said = os.read(self.setup_pipe, defaults.MAX_TEXT)
        finally:
            os.close(self.setup_pipe)
            self.setup_pipe = None
        if said:  # the host's own words, but read as any wire text is: printable, no NUL
            self.setup_failure = said.decode(errors="replace").replace("\0", "?")

    def poll(self) -> int | None:
        """The exit status once it has exited (negative: the signal that killed it), as
        :meth:`subprocess.Popen.poll` gives it; None while it runs."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # collected elsewhere: its status is lost
                pid, status = self.pid, 255 << 8
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """Poll until it has exited or ``timeout`` has passed (tests and tools; the host
        never waits)."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.returncode


def start_as_submitter(
    spec: LaunchSpec, env: dict[str, str], fds: dict[int, int], cgroup: JobCgroup | None = None
) -> JobProcess:
    """Fork the job's process and return once it leads its own session and sits in its
    cgroup: until then it is root's, and nothing a user does can delay the host. Still as
    root, the child then keeps only the descriptors the job gets (``fds``: its number in the
    job's process -> the host's descriptor), resets every signal and, where it may, shows
    the snapshot under the script's name (:func:`_show_snapshot_at`); it takes the
    submitter's groups, gid and uid, and only as them enters the working directory and opens
    the output files (so their rights decide where output may go, and a FUSE mount, which
    admits only a process whose ids are all theirs, works), then execs.
    LaunchError only for what fails before the fork."""
    switch_to = identity(spec)
    argv = list(spec.argv)
    if not argv:
        raise LaunchError(f"job {spec.id} has no command to run")
    if (spec.stdout is None or spec.stderr is None) and TERMINAL_FD not in fds:
        raise LaunchError(f"job {spec.id} names no output file and has no terminal")
    may_show = spec.script_name is not None and root_mount_shared()
    placed_read, placed_write = os.pipe()
    setup_read, low_setup_write = os.pipe()
    # Above every number a job's descriptor may be given: placing those never closes it.
    setup_write = fcntl.fcntl(low_setup_write, fcntl.F_DUPFD_CLOEXEC, _ABOVE_PLACED)
    os.close(low_setup_write)
    host = os.getpid()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (placed_read, placed_write, setup_read, setup_write):
            os.close(fd)
        raise LaunchError(f"cannot start job {spec.id}: {exc.strerror}") from None
    if pid == 0:
        _become_job(
            spec, argv, env, fds, cgroup, switch_to, host, placed_write, setup_write, may_show
        )  # never returns
    os.close(placed_write)
    os.close(setup_write)
    try:
        os.read(placed_read, 1)  # nothing comes: the child closes it (or dies) when placed
    finally:
        os.close(placed_read)
    return JobProcess(pid, setup_read)


class _SetupFailed(Exception):
    """Why a job's process cannot reach its exec, in words for its job's reason."""


def _become_job(
    spec: LaunchSpec,
    argv: list[str],
    env: dict[str, str],
    fds: dict[int, int],
    cgroup: JobCgroup | None,
    switch_to: tuple[int, int, list[int]] | None,
    host: int,
    placed_write: int,
    setup_write: int,
    may_show: bool,
) -> None:
    """In the forked child: become the job's process and exec it. Never returns: a failure
    is written to the set-up pipe and the child exits with ``SETUP_FAILED_EXIT``."""
    try:
        try:
            _set_up(
                spec, argv, env, fds, cgroup, switch_to, host, placed_write, setup_write, may_show
            )
        except _SetupFailed as exc:
            os.write(setup_write, str(exc).encode(errors="replace")[: defaults.MAX_TEXT])
        except BaseException as exc:  # noqa: BLE001 - nothing may return into the host's code
            os.write(
                setup_write,
                f"cannot start job {spec.id}: {exc}".encode(errors="replace")[: defaults.MAX_TEXT],
            )
    finally:
        os._exit(SETUP_FAILED_EXIT)


def _set_up(
    spec: LaunchSpec,
    argv: list[str],
    env: dict[str, str],
    fds: dict[int, int],
    cgroup: JobCgroup | None,
    switch_to: tuple[int, int, list[int]] | None,
    host: int,
    placed_write: int,
    setup_write: int,
    may_show: bool,
) -> None:
    # As root, which no user can signal: leave the host's signal handling (its wakeup
    # socket is shared across the fork), lead a session of its own, enter the cgroup.
    wakeup.detach_in_child()
    os.setsid()
    try:
        if cgroup is not None:
            cgroup.enter()
    except OSError as exc:
        raise _SetupFailed(
            f"cannot put job {spec.id}'s process in its cgroup: {exc.strerror}"
        ) from None
    finally:
        os.close(placed_write)  # the host goes on from here
    # Still root's: nothing of the host's may be open once the user can reach the process
    # (its sockets, its pidfile's lock), and no signal disposition or mask of the host's
    # may reach the job.
    _place(fds)
    _close_all_but((0, 1, 2, setup_write, *fds))
    _default_signals()
    if spec.script_name is not None:
        shown = (
            may_show
            and spec.snapshot is not None
            and SCRIPT_FD in fds
            and _show_snapshot_at(spec.snapshot, spec.script_name, switch_to)
        )
        env = {**env, "GQ_SCRIPT_SOURCE": spec.script_name if shown else SCRIPT_PATH}
        if shown and argv[0] == SCRIPT_PATH:
            argv = [spec.script_name, *argv[1:]]
    if switch_to is not None:
        uid, gid, groups = switch_to
        try:
            os.setgroups(groups)
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        except OSError as exc:
            raise _SetupFailed(f"cannot take job {spec.id}'s identity: {exc.strerror}") from None
    die_with_parent()  # after the uid change, which clears it
    if os.getppid() != host:  # the host died before that: the job must not outlive it
        os._exit(SETUP_FAILED_EXIT)
    os.umask(spec.umask)
    try:
        os.chdir(spec.cwd)
    except OSError as exc:
        raise _SetupFailed(f"cannot enter working directory {spec.cwd}: {exc.strerror}") from None
    if TERMINAL_FD in fds:
        _take_terminal(spec)
    out = _open_output(spec.stdout)
    err = out if spec.stderr == spec.stdout else _open_output(spec.stderr)
    stdin = TERMINAL_FD if TERMINAL_FD in fds else os.open(os.devnull, os.O_RDONLY)
    for source, target in ((stdin, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
    for fd in {stdin, out, err} - {0, 1, 2}:
        os.close(fd)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        raise _SetupFailed(f"cannot start {argv[0]}: {exc.strerror}") from None


@functools.cache
def root_mount_shared() -> bool:
    """Whether this process's root mount propagates mounts (systemd makes it so): only then
    does a job's namespace, a slave of it, see what is mounted and unmounted after it
    starts. Elsewhere a job's namespace would keep filesystems the admin unmounts busy and
    miss new ones (autofs, NFS), so none is made."""
    try:
        with open("/proc/self/mountinfo") as mounts:
            for line in mounts:
                fields = line.split(" - ")[0].split()
                if len(fields) > 4 and fields[4] == "/":
                    return any(field.startswith("shared:") for field in fields[6:])
    except OSError:
        pass
    return False


def _show_snapshot_at(
    snapshot: str, path: str, switch_to: tuple[int, int, list[int]] | None
) -> bool:
    """Still root, in a mount namespace of the job's own: bind the snapshot over ``path``,
    the script it was submitted as, so that the script runs under its own name (``$0`` and
    ``BASH_SOURCE`` name it, the files beside it are found) while what runs is the snapshot.
    Nothing outside the job sees it (the namespace is a slave of the host's, whose root is
    shared: mounts come in, none go out). Only over a regular file the user owns, found
    with their rights: the bind shows them nothing they could not write there themselves.
    False where it cannot be done (not root, no namespaces, the file gone or not theirs, a
    FUSE mount that wants all their ids): the script then runs as SCRIPT_PATH."""
    if os.geteuid() != 0 or _libc.unshare(_CLONE_NEWNS) != 0:
        return False
    if _libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        return False  # never bind where it could reach the host's namespace
    # Both ends are found anew inside the namespace: a mount takes none from another.
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        target = _open_path_as(path, switch_to)
    except OSError:
        return False
    try:
        source = os.open(snapshot, flags)
    except OSError:
        os.close(target)
        return False
    try:
        info = os.fstat(target)
        if not stat.S_ISREG(info.st_mode) or (
            switch_to is not None and info.st_uid != switch_to[0]
        ):
            return False
        return (
            _libc.mount(
                f"/proc/self/fd/{source}".encode(),
                f"/proc/self/fd/{target}".encode(),
                None,
                _MS_BIND,
                None,
            )
            == 0
        )
    finally:
        os.close(source)
        os.close(target)


def _open_path_as(path: str, switch_to: tuple[int, int, list[int]] | None) -> int:
    """An O_PATH descriptor of ``path`` (never through a link at its end), found with the
    user's effective ids; root's real and saved ids stay, so the user cannot signal the
    process meanwhile, and root's come back after."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    if switch_to is None:
        return os.open(path, flags)
    uid, gid, groups = switch_to
    os.setgroups(groups)
    os.setresgid(-1, gid, -1)
    os.setresuid(-1, uid, -1)
    try:
        return os.open(path, flags)
    finally:
        os.setresuid(-1, 0, -1)
        os.setresgid(-1, 0, -1)


def _place(fds: dict[int, int]) -> None:
    """Give the job's descriptors their numbers, inheritable (any of them may sit where
    another must go, so all move above those first)."""
    low = max((2, *fds)) + 1
    moved = {
        target: fcntl.fcntl(source, fcntl.F_DUPFD_CLOEXEC, low) for target, source in fds.items()
    }
    for target, source in moved.items():
        os.dup2(source, target, inheritable=True)


def _close_all_but(keep: tuple[int, ...]) -> None:
    """Close every other descriptor, whatever the process's limit says now (the user may
    lower it once the process is theirs, but this runs before)."""
    low = 0
    for fd in (*sorted(set(keep)), _ALL_DESCRIPTORS):
        if fd > low:  # an empty range may close everything from its start on
            os.closerange(low, fd)
        low = fd + 1


_ALL_DESCRIPTORS = 1 << 30  # past any descriptor (closerange uses close_range(2))
_ABOVE_PLACED = 10  # job descriptors are SCRIPT_FD, WORKER_FD, PAGE_FD and TERMINAL_FD


def _default_signals() -> None:
    for signum in signal.valid_signals():
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(signum, signal.SIG_DFL)
            except (OSError, ValueError):  # real-time signals Python does not manage
                pass
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _take_terminal(spec: LaunchSpec) -> None:
    """In the child, as the submitter (a session leader with no terminal yet): make the
    job's pseudo-terminal its controlling terminal, its process group the foreground one."""
    try:
        fcntl.ioctl(TERMINAL_FD, termios.TIOCSCTTY, 0)
    except OSError as exc:
        raise _SetupFailed(f"cannot give job {spec.id} its terminal: {exc.strerror}") from None


def _open_output(path: str | None) -> int:
    """In the child, as the submitter: append to the output file (None: the job's terminal).
    A FIFO with no reader, a link or a directory is refused at once; a terminal named as a
    file never becomes the job's."""
    if path is None:
        return TERMINAL_FD
    try:
        fd = os.open(path, _OUTPUT_FLAGS, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            reason = f"output file {path} is a symbolic link; gq does not follow it"
        elif exc.errno == errno.ENXIO:
            reason = f"output file {path} is a FIFO that nobody reads"
        else:
            reason = f"cannot open output file {path}: {exc.strerror}"
        raise _SetupFailed(reason) from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        raise _SetupFailed(f"output file {path} is a directory")
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # the job writes as usual
    return fd


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL the calling process when its parent dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def gq_python(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` for a root process of gq's (the
    daemon, a host): isolated (``-I``: no working directory or script directory on its path,
    no PYTHON* variables, no user site), with this very gq first on its path."""
    here = os.path.abspath(__file__)  # gq/exec/host/spawn.py
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    boot = (
        f"import sys; sys.path.insert(0, {package_parent!r}); import runpy; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-I", "-c", boot, *args]
