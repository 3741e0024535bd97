"""The daemon's handle on one execution host (one per device).

Hosts are started detached, in their own session, so that they and their jobs outlive the
daemon; each listens on ``hosts/<device>.sock``. A starting daemon connects to the live
host of each device, or starts one, and says Hello: the host answers with its State.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

from gq import defaults
from gq.codec import MessageError
from gq.daemon.devices import Device
from gq.exec.host import messages as wire
from gq.exec.host.spawn import gq_python
from gq.exec.protocol import TO_DAEMON, Channel, host_paths
from gq.home import Home

HANDSHAKE_TIMEOUT = 10.0


class HostUnavailable(Exception):
    """No host could be reached or started for a device."""


@dataclass(frozen=True)
class HostSettings:
    """How the daemon starts a device's host."""

    lanes: int
    kill_grace: float
    cgroup: str
    attach_wait: float = defaults.ATTACH_WAIT  # an interactive job's terminal waits for its gq
    packing: bool = False  # --lanes auto: the host runs lanes at once as it measures
    checkpoint: str = "auto"  # how suspended jobs' device memory moves (gq.exec.host.checkpoint)
    mps: frozenset[str] = frozenset()  # devices MPS serves: side by side one user's jobs


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
        return self.version == wire.HOST_VERSION

    @classmethod
    def attach(
        cls, device: Device, home: Home, settings: HostSettings, start: bool = True
    ) -> tuple[HostHandle, wire.State | wire.ForeignState]:
        """Connect to the device's live host, or start one (unless not ``start``); return it
        with its state."""
        process = None
        sock = _connect(home, device)
        if sock is None and not start:
            raise HostUnavailable(f"no execution host of {device.name} is running")
        if sock is None:
            process = _spawn(device, home, settings)
            sock = _wait_for_socket(home, device, process)
        sock.settimeout(HANDSHAKE_TIMEOUT)
        channel = Channel(sock, TO_DAEMON)
        try:
            if not channel.send(wire.Hello()):
                raise HostUnavailable(f"the execution host of {device.name} hung up")
            state = channel.receive_one()
            # An older host may talk first: the state that answers the hello supersedes it.
            while not isinstance(state, (wire.State, wire.ForeignState)):
                state = channel.receive_one()
        except (EOFError, OSError, MessageError) as exc:
            channel.close()
            raise HostUnavailable(
                f"no state from the execution host of {device.name}: {exc}"
            ) from None
        sock.setblocking(False)
        return cls(
            device, channel, state.pid, state.version, process, draining=state.draining
        ), state

    def send(self, message: object) -> bool:
        return self.channel.send(message)

    def alive(self, grace: float = 0.0) -> bool:
        """Whether the host process runs, allowing ``grace`` seconds for one that is
        exiting (its socket closes before it is gone)."""
        deadline = time.monotonic() + grace
        while True:
            if not self._running():
                return False
            if time.monotonic() >= deadline:
                return True
            time.sleep(0.01)

    def _running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # an adopted host is not this daemon's child: a zombie of it is gone too
            with open(f"/proc/{self.pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
        except OSError:
            return False

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
        self.channel.send(wire.Shutdown())
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
        raise HostUnavailable(
            f"cannot reach the execution host of {device.name}: {exc.strerror}"
        ) from None


def _spawn(device: Device, home: Home, settings: HostSettings) -> subprocess.Popen:
    argv = gq_python(
        "gq.exec.host.startup",
        "--device",
        device.name,
        "--lanes",
        str(settings.lanes),
        "--state-dir",
        str(home.hosts),
        "--kill-grace",
        str(settings.kill_grace),
        "--cgroup",
        settings.cgroup,
        "--scope",
        home.tag,
        "--terminals",
        str(home.terminals),
        "--progress",
        str(home.progress),
        "--attach-wait",
        str(settings.attach_wait),
        "--checkpoint",
        settings.checkpoint,
    )
    if settings.packing:
        argv.append("--pack")
    if device.name in settings.mps:
        argv.append("--mps")
    if device.kind == "cuda":
        argv += ["--cuda", "--memory", str(device.memory_total)]
    log_path = os.path.join(home.hosts, f"{device.name}.log")
    fd = os.open(
        log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    with os.fdopen(fd, "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd=home.hosts,
            start_new_session=True,
        )


def _wait_for_socket(home: Home, device: Device, process: subprocess.Popen) -> socket.socket:
    deadline = time.monotonic() + defaults.DAEMON_START_TIMEOUT
    while time.monotonic() < deadline:
        sock = _connect(home, device)
        if sock is not None:
            return sock
        code = process.poll()
        if code is not None and code != defaults.ALREADY_RUNNING_EXIT:
            raise HostUnavailable(
                f"the execution host of {device.name} exited at start "
                f"(code {code}); see {home.hosts}/{device.name}.log"
            )
        time.sleep(0.01)
    raise HostUnavailable(
        f"the execution host of {device.name} did not start in {defaults.DAEMON_START_TIMEOUT:g} s"
    )
