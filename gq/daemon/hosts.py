"""The daemon's handle on one execution host (one per device).

Hosts are started detached, in their own session, so that they and their jobs outlive the
daemon; each listens on ``hosts/<device>.sock``. A starting daemon connects to the live
host of each device, or starts one, and says hello: the host answers with its state.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from gq import defaults
from gq.daemon.devices import Device
from gq.exec.protocol import HOST_VERSION, Channel, host_paths
from gq.home import Home

HANDSHAKE_TIMEOUT = 10.0


class HostUnavailable(Exception):
    """No host could be reached or started for a device."""


@dataclass
class HostHandle:
    device: Device
    channel: Channel
    pid: int
    version: str
    process: subprocess.Popen | None  # None for a host adopted from an earlier daemon
    draining: bool = False

    @property
    def current(self) -> bool:
        """Of this daemon's own version: a host of another version is drained."""
        return self.version == HOST_VERSION

    @classmethod
    def attach(cls, device: Device, home: Home, lanes: int,
               kill_grace: float) -> tuple["HostHandle", dict[str, Any]]:
        """Connect to the device's live host, or start one; return it with its state."""
        process = None
        sock = _connect(home, device)
        if sock is None:
            process = _spawn(device, home, lanes, kill_grace)
            sock = _wait_for_socket(home, device, process)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        channel = Channel(sock)
        try:
            if not channel.send({"op": "hello"}):
                raise HostUnavailable(f"the execution host of {device.name} hung up")
            state = channel.receive_one()
            while state.get("op") != "state":  # an older host may talk first: the state
                state = channel.receive_one()  # that answers the hello supersedes it all
        except (EOFError, OSError) as exc:
            raise HostUnavailable(f"no state from the execution host of {device.name}: "
                                  f"{exc}") from None
        sock.setblocking(False)
        return cls(device, channel, int(state["pid"]), str(state.get("version")), process,
                   draining=bool(state.get("draining"))), state

    def send(self, message: dict[str, Any]) -> bool:
        return self.channel.send(message)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def kill(self) -> None:
        """End a host that stopped answering (its workers die with it)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.process is not None:
            self.process.wait()

    def stop(self, timeout: float) -> None:
        """Have the host end its jobs and exit; the exit reports arrive on the channel."""
        self.channel.send({"op": "shutdown"})
        deadline = time.monotonic() + timeout
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            self.kill()
        self.channel.close()


def _connect(home: Home, device: Device) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(host_paths(str(home.hosts), device.name)[1])
        return sock
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise HostUnavailable(f"cannot reach the execution host of {device.name}: "
                              f"{exc.strerror}") from None


def _spawn(device: Device, home: Home, lanes: int, kill_grace: float) -> subprocess.Popen:
    argv = [sys.executable, "-m", "gq.exec.host", "--device", device.name,
            "--lanes", str(lanes), "--state-dir", str(home.hosts),
            "--kill-grace", str(kill_grace)]
    if device.kind == "cuda":
        argv.append("--cuda")
    log_path = os.path.join(home.hosts, f"{device.name}.log")
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)


def _wait_for_socket(home: Home, device: Device, process: subprocess.Popen) -> socket.socket:
    deadline = time.monotonic() + defaults.DAEMON_START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(home, device)
        if sock is not None:
            return sock
        code = process.poll()
        if code is not None and code != defaults.ALREADY_RUNNING_EXIT:
            raise HostUnavailable(f"the execution host of {device.name} exited at start "
                                  f"(code {code}); see {home.hosts}/{device.name}.log")
        time.sleep(0.01)
    raise HostUnavailable(f"the execution host of {device.name} did not start in "
                          f"{defaults.DAEMON_START_TIMEOUT:g} s")
