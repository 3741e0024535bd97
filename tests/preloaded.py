"""Daemons forked from a process that has imported them already, for the suite's hundreds of
personal daemons: ``python -m gq.daemon`` spends about half a second of CPU importing
SQLAlchemy and the handlers before it listens, every test.

The server (``python tests/preloaded.py SOCKET``, run isolated as gq runs its daemon)
imports ``gq.daemon`` once; for each request (the daemon's options, environment and working
directory, and its log's descriptor passed along) it forks a child that becomes the daemon
exactly as ``python -m gq.daemon OPTIONS`` would from there on: a session of its own, stdin
from /dev/null, stdout and stderr to the log, the same ``main()`` (one tunable set apart,
see :func:`serve`). It answers with the child's pid, and with its exit status once it has
exited (``client.DaemonProcess.poll``).
Each such daemon starts its execution hosts the same way: a host is the server's child, forked
with ``gq.exec``'s host imported, and what ``python -m`` of it would have run from there on
(see :class:`HostSpawn`); that saved about 0.1 s of CPU and of wall time at every start.
The real spawn paths stay covered where the CLI runs as a subprocess (concurrent first
commands, the system daemon's tests, the demo).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys

MAX_REQUEST = 1 << 20
DAEMON = "gq.daemon.__main__"


class PreloadedDaemon:
    """The handle on one forked daemon (what ``client.spawn_daemon`` returns) or, with a
    host's ``module``, one forked host (what the daemon's ``subprocess.Popen`` returns)."""

    def __init__(
        self,
        server: str,
        options: list[str],
        env: dict[str, str],
        cwd: str,
        log: int,
        module: str = DAEMON,
    ):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(server)
        request = {"options": options, "env": env, "cwd": cwd, "module": module}
        request = json.dumps(request).encode() + b"\n"
        socket.send_fds(self.sock, [request], [log])
        self.buffer = b""
        self.pid = int(self._line(block=True)["pid"])
        self.code: int | None = None

    def _line(self, block: bool) -> dict | None:
        while b"\n" not in self.buffer:
            self.sock.setblocking(block)
            try:
                chunk = self.sock.recv(4096)
            except BlockingIOError:
                return None
            if not chunk:
                raise RuntimeError("the preloaded daemon server went away")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self, block: bool = False) -> int | None:
        if self.code is None:
            answer = self._line(block)
            if answer is not None:
                self.code = int(answer["exit"])
                self.sock.close()
        return self.code

    def wait(self) -> int:
        code = self.poll(block=True)
        assert code is not None
        return code


class HostSpawn:
    """Stands in for the ``subprocess`` module in ``gq.daemon.supervision.host_handles``,
    whose one use of it starts a device's host, ``Popen(gq_python(MODULE, *options),
    stdin=DEVNULL, stdout=log, stderr=log, cwd=..., start_new_session=True)``: the host is
    forked from the server instead, in the daemon's environment (what Popen passes on), with
    the same options."""

    DEVNULL = subprocess.DEVNULL  # what host_handles.py passes as stdin: the fork's is /dev/null

    def __init__(self, server: str):
        self.server = server

    def Popen(self, argv: list[str], *, stdout, cwd: str, **_: object) -> PreloadedDaemon:  # noqa: N802
        found = re.search(r"run_module\('([\w.]+)'", argv[3])
        assert argv[1:3] == ["-I", "-c"] and found, argv
        env = dict(os.environ)
        return PreloadedDaemon(self.server, argv[4:], env, str(cwd), stdout.fileno(), found[1])


def _become_daemon(request: dict, log: int, keep_out: list[int], server: str) -> None:
    """In the forked child: what ``subprocess.Popen(gq_python(MODULE, ...),
    start_new_session=True)`` and the interpreter's start would have set up, then the
    module's main(); a daemon starts its hosts through the server too."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in keep_out:
            os.close(fd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["-c", *request["options"]]
        if request["module"] == DAEMON:
            from gq.daemon.supervision import host_handles as hosts

            hosts.subprocess = HostSpawn(server)  # type: ignore[assignment]
        importlib.import_module(request["module"]).main()
        code = 0
    except SystemExit as exc:  # sys.exit(N), or sys.exit("message") printed with code 1
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        import traceback

        traceback.print_exc()
    finally:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: str) -> None:
    import gq.daemon.__main__  # noqa: F401 - what every daemon imports, imported once
    import gq.daemon.node  # noqa: F401
    from gq import defaults

    # Each pass's pending rows are read again only where a transaction changed them; here
    # all of them are read every second too, so that a change the watch missed shows as
    # drift in the log (which the suite fails on) within a test's life.
    defaults.PENDING_REREAD_PERIOD = 1.0

    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()
    wake_read.setblocking(False)
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listener")
    selector.register(wake_read, selectors.EVENT_READ, "signal")
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection told its exit
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=1.0):
            if key.data == "signal":
                try:
                    wake_read.recv(4096)
                except BlockingIOError:
                    pass
                continue
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            if request is None or len(fds) != 1:
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            importlib.import_module(request["module"])  # once: every later fork has it
            keep_out = [
                selector.fileno(),
                listener.fileno(),
                wake_read.fileno(),
                wake_write.fileno(),
                conn.fileno(),
                *(c.fileno() for c in waiting.values()),
            ]
            pid = os.fork()
            if pid == 0:
                _become_daemon(request, fds[0], keep_out, path)
            os.close(fds[0])
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        _reap(waiting)


def _receive(conn: socket.socket) -> tuple[dict | None, list[int]]:
    """One request: a JSON line, the log's descriptor passed with its first bytes."""
    data, fds, _, _ = socket.recv_fds(conn, 65536, 1)
    while data and not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        more = conn.recv(65536)
        if not more:
            break
        data += more
    try:
        return json.loads(data), fds
    except ValueError:
        return None, fds


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(
                    json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                )
            except OSError:
                pass
            conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
