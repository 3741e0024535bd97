"""Starting and signalling a job's processes: as its submitter, in its own process group
(and cgroup, where the host has them), dying with its execution host."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import select
import signal
import stat
import subprocess
import sys

from gq import defaults, wakeup
from gq.errors import LaunchError
from gq.exec.cgroups import JobCgroup
from gq.exec.protocol import LaunchSpec

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
# The job's output: never through a link, never a controlling terminal, never a wait for a
# FIFO's reader (the host would stall with it: Popen waits for the child's exec).
_OUTPUT_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY
                 | os.O_NONBLOCK | os.O_CLOEXEC)


def identity(spec: LaunchSpec) -> tuple[int, int, list[int]] | None:
    """The uid, gid and groups the job's process must take, or None to keep the host's own
    (a personal host runs its owner's jobs). A root host never runs a job as root unless
    root submitted it, and never one whose identity is missing."""
    if os.geteuid() != 0:
        if spec.uid not in (None, os.geteuid()):
            raise LaunchError(f"job {spec.id} belongs to uid {spec.uid}; this execution host "
                              f"runs as uid {os.geteuid()} and cannot run it")
        return None
    if spec.uid is None or spec.gid is None:
        raise LaunchError(f"job {spec.id} has no uid or gid; refusing to run it as root")
    if spec.uid == 0:
        return None  # root's own job
    return spec.uid, spec.gid, list(spec.groups) or [spec.gid]


def start_as_submitter(spec: LaunchSpec, env: dict[str, str], pass_fds: tuple[int, ...],
                       cgroup: JobCgroup | None = None) -> subprocess.Popen:
    """Fork the job's process. In the child, still as root: leave the host's signal
    handling, enter the job's cgroup (so that nothing it starts can leave it), then take the
    submitter's groups, gid and uid, and only then, as them, enter the working directory and
    open the output files, so that their rights decide where output may go (a FUSE mount
    admits only a process whose ids are all theirs).

    The host waits for the exec (Popen does), and the user may stop the child once it is
    theirs: a child that has not exec'd after ``defaults.LAUNCH_TIMEOUT`` is killed with
    everything it started, and its launch fails. That bounds, but does not remove, what a
    stopped launch costs the host's other jobs (see the README)."""
    switch_to = identity(spec)
    error_read, error_write = os.pipe()
    pid_read, pid_write = os.pipe()
    stdout, stderr, cwd = spec.stdout, spec.stderr, spec.cwd

    def in_child() -> None:
        wakeup.detach_in_child()
        os.write(pid_write, str(os.getpid()).encode())
        try:
            if cgroup is not None:
                cgroup.enter()
            if switch_to is not None:
                uid, gid, groups = switch_to
                os.setgroups(groups)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
        except OSError as exc:
            os.write(error_write, f"cannot set up job {spec.id}'s process: {exc.strerror}"
                     .encode())
            raise
        die_with_parent()  # after the uid change, which clears it
        try:
            os.chdir(cwd)
        except OSError as exc:
            os.write(error_write, f"cannot enter working directory {cwd}: {exc.strerror}"
                     .encode())
            raise
        out = _open_output(stdout, error_write)
        err = out if stderr == stdout else _open_output(stderr, error_write)
        os.dup2(out, 1)
        os.dup2(err, 2)

    previous = signal.signal(signal.SIGALRM, _stalled)
    _watchdog.armed = True
    signal.setitimer(signal.ITIMER_REAL, defaults.LAUNCH_TIMEOUT)
    try:
        try:
            return subprocess.Popen(
                spec.argv, env=env, stdin=subprocess.DEVNULL, pass_fds=pass_fds,
                start_new_session=True, umask=spec.umask, preexec_fn=in_child)
        finally:
            # Past this line the alarm raises nothing: the handling below and the clean-up
            # run undisturbed, whenever it comes.
            _watchdog.armed = False
    except _Stalled:
        os.close(pid_write)
        pid_write = -1
        _kill_stalled(pid_read, cgroup)
        raise LaunchError(f"job {spec.id}'s process was stopped or stuck before it could "
                          f"start, and killed after {defaults.LAUNCH_TIMEOUT:g} s") from None
    except subprocess.SubprocessError:
        os.set_blocking(error_read, False)
        try:
            reason = os.read(error_read, 4096).decode(errors="replace")
        except BlockingIOError:
            reason = ""
        raise LaunchError(reason or "the job's process could not be set up") from None
    except OSError as exc:
        raise LaunchError(f"cannot start {spec.argv[0]}: {exc.strerror}") from exc
    except ValueError as exc:  # what the wire lets through, the kernel may still refuse
        raise LaunchError(f"cannot start job {spec.id}: {exc}") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for fd in (error_read, error_write, pid_read, pid_write):
            if fd >= 0:
                os.close(fd)


class _Stalled(Exception):
    """A job's process did not exec within the launch timeout."""


class _Watchdog:
    armed = False  # the alarm interrupts a launch only while the host waits in Popen


_watchdog = _Watchdog()


def _stalled(signum: int, frame: object) -> None:
    if _watchdog.armed:
        raise _Stalled


def _kill_stalled(pid_read: int, cgroup: JobCgroup | None) -> None:
    """Kill and collect the child that never exec'd, with anything it started. It writes its
    pid first thing, as root (no user can stop it before that): with the host's write end
    closed, the pid or the end of the pipe comes at once, the wait is only a bound."""
    if select.select([pid_read], [], [], 1.0)[0]:
        try:
            pid = int(os.read(pid_read, 32) or 0)
        except ValueError:
            pid = 0
    else:
        pid = 0
    if pid > 0:  # never kill(0) or kill(-1): the host's own group, or everything
        # It leads its own session and group (made before it wrote its pid): one kill ends
        # it and whatever it started.
        kill_group(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    if cgroup is not None:
        cgroup.kill(defaults.CGROUP_KILL_TIMEOUT)


def _open_output(path: str, error_write: int) -> int:
    """In the child, as the submitter: append to the output file. A FIFO with no reader, a
    link or a directory is refused at once; a terminal never becomes the job's."""
    try:
        fd = os.open(path, _OUTPUT_FLAGS, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            reason = f"output file {path} is a symbolic link; gq does not follow it"
        elif exc.errno == errno.ENXIO:
            reason = f"output file {path} is a FIFO that nobody reads"
        else:
            reason = f"cannot open output file {path}: {exc.strerror}"
        os.write(error_write, reason.encode())
        raise
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.write(error_write, f"output file {path} is a directory".encode())
        raise IsADirectoryError(path)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # the job writes as usual
    return fd


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL the calling process when its parent dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def gq_python(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` for a root process of gq's (the
    daemon, a host): isolated (``-I``: no working directory or script directory on its path,
    no PYTHON* variables, no user site), with this very gq first on its path."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    package_parent = os.path.dirname(root)
    boot = (f"import sys; sys.path.insert(0, {package_parent!r}); import runpy; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-I", "-c", boot, *args]
