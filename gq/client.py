"""The client's side of the daemon socket: find the daemon, start a personal one on demand
(saying so in a line on stderr), send one request, return the answer.

Every command goes through here, so it imports only what a request needs: ``_socket`` (the
``socket`` module imports ``enum``) and gq's own JSON framing. :func:`ask` sends a typed
message and returns a typed answer (importing gq.messages); :func:`ask_plain` sends the
fields of one kind of request as plain values and returns the answer's fields, for the
commands typed most (``gq status``, ``gq submit``), whose request the daemon checks as it
checks any.
"""

from __future__ import annotations

import _socket
import math
import os
import sys
import time

from gq import defaults, jsonline
from gq.errors import UserError, WaitTimedOut
from gq.home import Home, locate

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from typing import Any, Protocol

    class DaemonProcess(Protocol):
        """A daemon process just started: ``poll`` is its exit status once it has exited."""

        pid: int

        def poll(self) -> int | None: ...


class Unreachable(UserError):
    """No daemon answered (exit 1: the request was fine, the node is not)."""

    exit_code = 1


def ask(request: Any, home: Home | None = None, wait: float | None = None) -> Any:
    """Send ``request`` and return the daemon's answer; an Error answer raises UserError.
    ``wait``: the answer may take that long (math.inf: as long as it takes; gq wait), after
    which WaitTimedOut is raised. Descriptors passed with an answer are not taken (the
    kernel closes them): only :func:`ask_with_fds` expects any."""
    line, _ = exchange(_checked(request), home, wait)
    return _typed(line)


def ask_with_fds(
    request: Any, home: Home | None = None, wait: float | None = None
) -> tuple[Any, list[int]]:
    """:func:`ask`, and the descriptors that came with the answer (gq logs: its file)."""
    line, fds = exchange(_checked(request), home, wait, fds=True)
    try:
        return _typed(line), fds
    except UserError:
        for fd in fds:
            os.close(fd)
        raise


def ask_plain(
    kind: str, fields: dict[str, Any], answer_kind: str, home: Home | None = None
) -> dict[str, Any]:
    """Send a request of ``kind`` with these fields (plain JSON values; those left out take
    their defaults) and return the fields of its ``answer_kind`` answer, checked no further
    than its version and kind; an Error answer raises UserError. Without gq's typed
    messages, and so without msgspec: for the commands typed most, and for what runs in a
    job, whose interpreter may have none of gq's dependencies (the scontrol shim). Any other
    answer (a malformed line) is read by :func:`ask`'s decoder, which says what is wrong.
    The fields are not checked here first (:func:`ask` checks its message): what the caller
    has not checked itself is refused by the daemon, one started to say so where it is a
    personal one."""
    line, _ = exchange(
        jsonline.line({"v": defaults.PROTOCOL_VERSION, "kind": kind, **fields}), home
    )
    try:
        answer = jsonline.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        answer = None
    if isinstance(answer, dict) and "v" in answer:
        if answer["v"] != defaults.PROTOCOL_VERSION:
            raise _version_error(answer["v"])
        if answer.get("kind") == answer_kind:
            return answer
        message, code = answer.get("message"), answer.get("exit_code", 2)
        if answer.get("kind") == "error" and isinstance(message, str):
            raise UserError(message, code if type(code) is int and 0 < code < 256 else 2)
    try:
        unexpected = _typed(line)  # raises for a malformed line
    except ImportError:  # (a job's interpreter without msgspec: the scontrol shim)
        raise UserError(f"malformed answer from the daemon to a {kind!r} request") from None
    raise UserError(f"the daemon answered a {kind!r} request with {unexpected.kind!r}")


class Fields:
    """An answer's fields (or a record's within it) as attributes, by the names its
    gq.messages class gives them: an answer read without building the typed message."""

    def __init__(self, fields: dict[str, Any]):
        self.__dict__.update(fields)

    if TYPE_CHECKING:  # its attributes are the answer's fields: any name, of any type

        def __getattr__(self, name: str) -> Any: ...

        def __setattr__(self, name: str, value: Any) -> None: ...


def _typed(line: bytes) -> Any:
    """The answer a line holds, every field checked; an Error answer raises UserError."""
    from gq import messages

    try:
        answer = messages.decode(line, messages.ANSWERS)
    except messages.VersionMismatch as exc:
        raise _version_error(exc.theirs) from None
    except messages.MessageError as exc:
        raise UserError(f"malformed answer from the daemon: {exc}") from None
    if isinstance(answer, messages.Error):
        raise UserError(answer.message, answer.exit_code)
    return answer


def _version_error(theirs: object) -> UserError:
    return UserError(
        f"the daemon speaks protocol version {str(theirs)[:40]} and this gq speaks "
        f"{defaults.PROTOCOL_VERSION}: restart the daemon with this gq ('gq daemon "
        "restart') or use the gq it was installed with"
    )


def exchange(
    line: bytes, home: Home | None = None, wait: float | None = None, fds: bool = False
) -> tuple[bytes, list[int]]:
    """Send one request line to the daemon (started first where it is a personal one that
    is not running) and return its answer line, and the descriptors passed with it when
    ``fds``."""
    home = home or locate()
    sock = _connect(home)
    try:
        sock.settimeout(
            defaults.CLIENT_TIMEOUT if wait is None else None if math.isinf(wait) else wait
        )
        try:
            sock.sendall(line)
        except OSError as exc:
            # A daemon that refuses the connection (a limit) answers before it closes.
            try:
                return _read_line(sock, home, fds=fds)
            except Unreachable:
                raise Unreachable(
                    f"the daemon closed the connection ({exc.strerror}); see {home.daemon_log}"
                ) from None
        return _read_line(sock, home, wait, fds)
    finally:
        sock.close()


def _checked(request: Any) -> bytes:
    """The request's line, decoded here as the daemon will decode it: what it would refuse
    as malformed is refused before a daemon is asked (or started)."""
    from gq import messages

    try:
        line = messages.encode(request)
        messages.decode(line, messages.REQUESTS)
    except (messages.MessageError, ValueError) as exc:
        raise UserError(f"invalid request: {exc}") from None
    return line


def _read_line(
    sock: _socket.socket, home: Home, wait: float | None = None, fds: bool = False
) -> tuple[bytes, list[int]]:
    buffer, received = bytearray(), []
    if fds:
        from socket import recv_fds
    data = b""
    while b"\n" not in data:  # the newline ends the answer: looked for in each chunk alone
        try:
            if fds:
                # (recv_fds only calls sock.recvmsg, which a _socket.socket has: its stub
                # asks for a socket.socket all the same)
                data, passed, _, _ = recv_fds(sock, 1 << 16, 4)  # type: ignore[arg-type]
                received += passed
            else:
                data = sock.recv(1 << 16)
        except TimeoutError:
            if wait is not None:
                raise WaitTimedOut(f"the jobs had not all ended after {wait:g} s") from None
            raise Unreachable(
                f"the daemon did not answer within {defaults.CLIENT_TIMEOUT:g} s; "
                f"see {home.daemon_log}"
            ) from None
        except OSError as exc:
            data = b""
            if not buffer:
                raise Unreachable(
                    f"the daemon closed the connection ({exc.strerror}); see {home.daemon_log}"
                ) from None
        if not data:
            raise Unreachable(
                f"the daemon closed the connection without answering; see {home.daemon_log}"
            )
        buffer += data
    return bytes(buffer[: buffer.index(b"\n")]), received


def _try_connect(home: Home) -> _socket.socket | None:
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(home.socket_path)
        return sock
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except PermissionError:
        sock.close()
        raise UserError(f"no permission to reach the daemon at {home.socket}") from None
    except OSError as exc:
        sock.close()
        if exc.errno is None:  # "AF_UNIX path too long": say so, and what to do
            home.check_socket_room()
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


def _connect(home: Home) -> _socket.socket:
    sock = _try_connect(home)
    if sock is not None:
        return sock
    if home.system:
        return _wait_for_system_daemon(home)
    sock, started = _start_daemon(home, [])
    if started is not None:  # one line, on stderr: stdout may be a script's (--parsable)
        print(
            f"gq: started a personal daemon (pid {started}, state in {home.root}); "
            "it runs in the background until 'gq daemon stop'",
            file=sys.stderr,
        )
    return sock


def _wait_for_system_daemon(home: Home) -> _socket.socket:
    """A system socket that refuses is a daemon restarting (or down): wait a little."""
    deadline = time.monotonic() + defaults.DAEMON_WAIT
    while time.monotonic() < deadline:
        time.sleep(0.05)
        sock = _try_connect(home)
        if sock is not None:
            return sock
    raise Unreachable(
        f"the node's gq daemon is not running (no answer at {home.socket} for "
        f"{defaults.DAEMON_WAIT:g} s); an operator starts it with "
        "'gq daemon start --system' or 'systemctl start gq'"
    )


def prepare_personal_home(home: Home) -> None:
    try:
        home.root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot use GQ_HOME {home.root}: {exc.strerror or exc}") from None
    if not home.root.is_dir() or not os.access(home.root, os.W_OK | os.X_OK):
        raise UserError(f"cannot use GQ_HOME {home.root}: not a writable directory")


def spawn_daemon(options: list[str], env: dict[str, str], cwd: str, log: int) -> DaemonProcess:
    """``python -m gq.daemon OPTIONS``, detached (a session of its own, no terminal), its
    output appended to the descriptor ``log``."""
    import subprocess

    from gq.exec.host.spawn import gq_python

    return subprocess.Popen(
        gq_python("gq.daemon", *options),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )


def start_daemon(home: Home, options: list[str]) -> _socket.socket:
    """Start a detached daemon for ``home`` and wait for its socket; personal daemons are
    started so on demand by the first command that needs one (as task-spooler does).

    Concurrent first commands may each start one: the pidfile lock lets one win, the
    others exit at once, and every client connects to the winner. A daemon that is still
    stopping holds the lock too: the start is tried again until it has gone.
    """
    return _start_daemon(home, options)[0]


def _start_daemon(home: Home, options: list[str]) -> tuple[_socket.socket, int | None]:
    """:func:`start_daemon`, and the pid of the daemon this call started where that is the
    one that answers (None where another command's won the pidfile lock)."""
    if home.system:
        env = dict(os.environ, GQ_SYSTEM_HOME=str(home.root))
        options = ["--system", *options]
        home.check_safe()  # before root opens its log there
        home.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        home.check_safe()  # made by another user in the meantime (under /tmp, say)?
    else:
        home.check_socket_room()  # else its daemon would start and never reach its hosts
        prepare_personal_home(home)
        env = dict(os.environ, GQ_HOME=str(home.root))

    def spawn() -> DaemonProcess:
        try:
            fd = os.open(
                home.daemon_log,
                os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
            )
        except OSError as exc:
            raise UserError(f"cannot use {home.root}: {exc.strerror}") from None
        with os.fdopen(fd, "ab") as log:
            os.fchmod(fd, 0o600)
            return spawn_daemon(options, env, str(home.root), log.fileno())

    from gq.daemon.pidfiles import running_pid

    process = spawn()
    deadline = time.monotonic() + defaults.DAEMON_START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _try_connect(home)
        if sock is not None:
            return sock, process.pid if running_pid(home) == process.pid else None
        code = process.poll()
        if code == defaults.ALREADY_RUNNING_EXIT:
            # The lock's holder is starting (its socket comes) or stopping (then start again).
            if running_pid(home) is None:
                process = spawn()
            time.sleep(0.05)
            continue
        if code is not None:
            raise Unreachable(
                f"the gq daemon exited at start (code {code}): "
                f"{_last_line(home.daemon_log)}; see {home.daemon_log}"
            )
        time.sleep(0.01)
    raise Unreachable(
        f"the gq daemon did not answer within {defaults.DAEMON_START_TIMEOUT:g} s; "
        f"see {home.daemon_log}"
    )


def _last_line(path) -> str:
    """The last thing a log says (why a daemon died at start, usually)."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 4096))
            lines = log.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "nothing logged"
