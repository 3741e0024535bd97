"""Worker bootstrap: ``python -m gq.exec.worker SCRIPT [ARGS]...``.

Connects to its execution host over the socket inherited as fd ``GQ_WORKER_FD``, installs the boundary hooks, then runs the script as
``__main__``. At an acquire it sends READY and blocks until GO; at a release it sends
DONE with its step count and memory figures and runs on.
"""

from __future__ import annotations

import os
import runpy
import socket
import sys
import time

from gq.exec import hooks, memory, runtime
from gq.exec.protocol import Channel, encode

READY = encode({"op": "ready"})
SAMPLE_PERIOD = 0.05  # memory figures at most this often: cheap releases on short iterations

class WorkerSession:
    """The job side of the protocol; see :mod:`gq.exec.runtime`."""

    def __init__(self, channel: Channel):
        self.channel = channel
        self.held = False
        self.empty_cache_after = False
        self.steps = 0
        self.sample = memory.MemorySample(0, 0)
        self.sampled_at = 0.0
        self.detached = False
        # A forked child (a DataLoader worker, say) must not speak on its parent's socket.
        os.register_at_fork(after_in_child=self._detach)

    def _detach(self) -> None:
        self.detached = True
        runtime.active = None

    def acquire(self) -> None:
        if self.held or self.detached:
            return
        self.channel.sock.sendall(READY)
        grant = self.channel.receive_one()
        # Lane-mates share the device's memory: give back cached blocks when parked.
        self.empty_cache_after = bool(grant.get("empty_cache", False))
        self.held = True

    def release(self, step: bool) -> None:
        if self.detached:
            return
        if step:
            self.steps += 1
        if not self.held:
            if step:
                self.channel.send({"op": "progress", "steps": self.steps})
            return
        self.held = False
        now = time.monotonic()
        if now - self.sampled_at >= SAMPLE_PERIOD:
            self.sample, self.sampled_at = memory.sample(), now
        if self.empty_cache_after:
            memory.release_cached()
        self.channel.send({"op": "done", "steps": self.steps,
                           "mem_persistent": self.sample.persistent,
                           "mem_peak": self.sample.peak})

    def set_total_steps(self, total: int) -> None:
        if not self.detached:
            self.channel.send({"op": "total", "steps": total})

    def finish(self) -> None:
        """The script is over: free the lane now, not after the interpreter's teardown."""
        if self.detached:
            return
        if self.held:
            self.release(step=False)
        self.channel.send({"op": "finished"})


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m gq.exec.worker SCRIPT [ARGS]...\n")
        sys.exit(2)
    fd = int(os.environ.pop("GQ_WORKER_FD"))
    script_dir = os.environ.pop("GQ_SCRIPT_DIR", None)
    channel = Channel(socket.socket(fileno=fd))
    session = WorkerSession(channel)
    runtime.active = session
    hooks.install_when_imported(session)

    script = argv[0]
    sys.argv = list(argv)
    # Sibling imports resolve against the original script's folder, not the spool.
    sys.path[0] = script_dir or os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        session.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
