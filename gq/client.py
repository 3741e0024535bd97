"""The client's side of the daemon socket: find the daemon, start a personal one on demand,
send one request, return the answer. Imports nothing heavy: every command goes through it.
"""

from __future__ import annotations

import math
import os
import socket
import time
from typing import Any, Protocol

from gq import defaults, messages
from gq.daemon.control import running_pid
from gq.errors import UserError, WaitTimedOut
from gq.home import Home, locate


class Unreachable(UserError):
    """No daemon answered (exit 1: the request was fine, the node is not)."""

    exit_code = 1


def ask(request: Any, home: Home | None = None, wait: float | None = None) -> Any:
    """Send ``request`` and return the daemon's answer; an Error answer raises UserError.
    ``wait``: the answer may take that long (math.inf: as long as it takes; gq wait), after
    which WaitTimedOut is raised."""
    answer, _ = ask_with_fds(request, home, wait)
    return answer


def ask_with_fds(request: Any, home: Home | None = None,
                 wait: float | None = None) -> tuple[Any, list[int]]:
    line = _checked(request)
    home = home or locate()
    with _connect(home) as sock:
        sock.settimeout(defaults.CLIENT_TIMEOUT if wait is None else
                        None if math.isinf(wait) else wait)
        try:
            sock.sendall(line)
        except OSError as exc:
            # A daemon that refuses the connection (a limit) answers before it closes.
            try:
                line, fds = _read_line(sock, home)
            except Unreachable:
                raise Unreachable(f"the daemon closed the connection ({exc.strerror}); "
                                  f"see {home.daemon_log}") from None
        else:
            line, fds = _read_line(sock, home, wait)
    try:
        answer = messages.decode(line, messages.ANSWERS)
    except messages.VersionMismatch as exc:
        raise UserError(f"the daemon speaks protocol version {exc.theirs} and this gq speaks "
                        f"{messages.VERSION}: restart the daemon with this gq ('gq daemon "
                        "restart') or use the gq it was installed with") from None
    except messages.MessageError as exc:
        raise UserError(f"malformed answer from the daemon: {exc}") from None
    if isinstance(answer, messages.Error):
        for fd in fds:
            os.close(fd)
        raise UserError(answer.message, answer.exit_code)
    return answer, fds


def _checked(request: Any) -> bytes:
    """The request's line, decoded here as the daemon will decode it: what it would refuse
    as malformed is refused before a daemon is asked (or started)."""
    try:
        line = messages.encode(request)
        messages.decode(line, messages.REQUESTS)
    except (messages.MessageError, ValueError) as exc:
        raise UserError(f"invalid request: {exc}") from None
    return line


def _read_line(sock: socket.socket, home: Home,
               wait: float | None = None) -> tuple[bytes, list[int]]:
    buffer, fds = bytearray(), []
    while b"\n" not in buffer:
        try:
            data, received, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        except TimeoutError:
            if wait is not None:
                raise WaitTimedOut(f"the jobs had not all ended after {wait:g} s") from None
            raise Unreachable(f"the daemon did not answer within {defaults.CLIENT_TIMEOUT:g} s; "
                              f"see {home.daemon_log}") from None
        except OSError as exc:
            data, received = b"", []
            if not buffer:
                raise Unreachable(f"the daemon closed the connection ({exc.strerror}); "
                                  f"see {home.daemon_log}") from None
        fds += received
        if not data:
            raise Unreachable("the daemon closed the connection without answering; "
                              f"see {home.daemon_log}")
        buffer += data
    return bytes(buffer[: buffer.index(b"\n")]), fds


def _try_connect(home: Home) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(home.socket))
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except PermissionError:
        sock.close()
        raise UserError(f"no permission to reach the daemon at {home.socket}") from None
    except OSError as exc:
        sock.close()
        if not home.system:  # the path itself is unusable: a file, say
            raise UserError(f"cannot use GQ_HOME {home.root}: {exc.strerror}") from None
        raise UserError(f"cannot reach the daemon at {home.socket}: {exc.strerror}") from None


def answers(home: Home) -> bool:
    """Whether a daemon listens at the home's socket now (no waiting, no starting)."""
    sock = _try_connect(home)
    if sock is None:
        return False
    sock.close()
    return True


def _connect(home: Home) -> socket.socket:
    sock = _try_connect(home)
    if sock is not None:
        return sock
    if home.system:
        return _wait_for_system_daemon(home)
    return start_daemon(home, [])


def _wait_for_system_daemon(home: Home) -> socket.socket:
    """A system socket that refuses is a daemon restarting (or down): wait a little."""
    deadline = time.monotonic() + defaults.DAEMON_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.05)
        sock = _try_connect(home)
        if sock is not None:
            return sock
    raise Unreachable(f"the node's gq daemon is not running (no answer at {home.socket} for "
                      f"{defaults.DAEMON_WAIT:g} s); an operator starts it with "
                      "'gq daemon start --system' or 'systemctl start gq'")


def prepare_personal_home(home: Home) -> None:
    try:
        home.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot use GQ_HOME {home.root}: {exc.strerror or exc}") from None
    if not home.root.is_dir() or not os.access(home.root, os.W_OK | os.X_OK):
        raise UserError(f"cannot use GQ_HOME {home.root}: not a writable directory")


class DaemonProcess(Protocol):
    """A daemon process just started: ``poll`` is its exit status once it has exited."""

    def poll(self) -> int | None: ...


def spawn_daemon(options: list[str], env: dict[str, str], cwd: str, log: int) -> DaemonProcess:
    """``python -m gq.daemon OPTIONS``, detached (a session of its own, no terminal), its
    output appended to the descriptor ``log``."""
    import subprocess

    from gq.exec.spawn import gq_python

    return subprocess.Popen(gq_python("gq.daemon", *options), env=env, cwd=cwd,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)


def start_daemon(home: Home, options: list[str]) -> socket.socket:
    """Start a detached daemon for ``home`` and wait for its socket; personal daemons are
    started so on demand by the first command that needs one (as task-spooler does).

    Concurrent first commands may each start one: the pidfile lock lets one win, the
    others exit at once, and every client connects to the winner. A daemon that is still
    stopping holds the lock too: the start is tried again until it has gone.
    """
    if home.system:
        env = dict(os.environ, GQ_SYSTEM_HOME=str(home.root))
        options = ["--system", *options]
        home.check_safe()  # before root opens its log there
        home.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        home.check_safe()  # made by another user in the meantime (under /tmp, say)?
    else:
        prepare_personal_home(home)
        env = dict(os.environ, GQ_HOME=str(home.root))

    def spawn() -> DaemonProcess:
        try:
            fd = os.open(home.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise UserError(f"cannot use {home.root}: {exc.strerror}") from None
        with os.fdopen(fd, "ab") as log:
            os.fchmod(fd, 0o600)
            return spawn_daemon(options, env, str(home.root), log.fileno())

    process = spawn()
    deadline = time.monotonic() + defaults.DAEMON_START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _try_connect(home)
        if sock is not None:
            return sock
        code = process.poll()
        if code == defaults.ALREADY_RUNNING_EXIT:
            # The lock's holder is starting (its socket comes) or stopping (then start again).
            if running_pid(home) is None:
                process = spawn()
            time.sleep(0.05)
            continue
        if code is not None:
            raise Unreachable(f"the gq daemon exited at start (code {code}): "
                              f"{_last_line(home.daemon_log)}; see {home.daemon_log}")
        time.sleep(0.01)
    raise Unreachable(f"the gq daemon did not answer within {defaults.DAEMON_START_TIMEOUT:g} s; "
                      f"see {home.daemon_log}")


def _last_line(path) -> str:
    """The last thing a log says (why a daemon died at start, usually)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
            lines = log.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "nothing logged"
