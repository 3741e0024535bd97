"""Starting and signalling a job's processes: as its submitter, in its own process group,
dying with its execution host."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
from typing import Any

from gq.errors import LaunchError

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def start_as_submitter(spec: dict[str, Any], env: dict[str, str],
                        pass_fds: tuple[int, ...]) -> subprocess.Popen:
    """Popen drops to the submitter's uid, gid and groups (when the host runs as root) and
    sets their umask; then, already as them, the child enters the working directory and
    opens the output files, so their rights decide where output may go, and a link planted
    at the output path is not followed."""
    uid, gid = spec.get("uid"), spec.get("gid")
    as_submitter = {}
    if os.geteuid() == 0 and uid is not None and gid is not None and uid != 0:
        as_submitter = {"user": int(uid), "group": int(gid),
                        "extra_groups": [int(g) for g in spec.get("groups") or [gid]]}
    error_read, error_write = os.pipe()
    stdout, stderr, cwd = spec["stdout"], spec["stderr"], spec["cwd"]

    def in_child() -> None:
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

    try:
        return subprocess.Popen(
            spec["argv"], env=env, stdin=subprocess.DEVNULL, pass_fds=pass_fds,
            start_new_session=True, umask=int(spec.get("umask", 0o022)),
            preexec_fn=in_child, **as_submitter)
    except subprocess.SubprocessError:
        os.set_blocking(error_read, False)
        try:
            reason = os.read(error_read, 4096).decode(errors="replace")
        except BlockingIOError:
            reason = ""
        raise LaunchError(reason or "the job's process could not be set up") from None
    except OSError as exc:
        raise LaunchError(f"cannot start {spec['argv'][0]}: {exc.strerror}") from exc
    finally:
        os.close(error_read)
        os.close(error_write)


def _open_output(path: str, error_write: int) -> int:
    """In the child, as the submitter: append to the output file, never through a link."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            reason = f"output file {path} is a symbolic link; gq does not follow it"
        else:
            reason = f"cannot open output file {path}: {exc.strerror}"
        os.write(error_write, reason.encode())
        raise


def kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL the calling process when its parent dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
