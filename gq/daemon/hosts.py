"""The daemon's handle on one execution host process (one per device)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from gq.daemon.devices import Device
from gq.exec.protocol import Channel


@dataclass
class HostHandle:
    device: Device
    process: subprocess.Popen
    channel: Channel
    started_at: float

    @classmethod
    def spawn(cls, device: Device, lanes: int, kill_grace: float) -> "HostHandle":
        daemon_end, host_end = socket.socketpair()
        argv = [sys.executable, "-m", "gq.exec.host", "--device", device.name,
                "--lanes", str(lanes), "--fd", str(host_end.fileno()),
                "--kill-grace", str(kill_grace)]
        if device.kind == "cuda":
            argv.append("--cuda")
        process = subprocess.Popen(argv, pass_fds=(host_end.fileno(),), stdin=subprocess.DEVNULL)
        host_end.close()
        daemon_end.setblocking(False)
        return cls(device, process, Channel(daemon_end), time.monotonic())

    def send(self, message: dict) -> bool:
        return self.channel.send(message)

    def stop(self, timeout: float) -> None:
        self.channel.send({"op": "shutdown"})
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.channel.close()
