"""Progress of jobs gq's worker does not run: a shell script's Python, or the ranks that
``torchrun`` (``srun -n 2``, accelerate, deepspeed) starts.

Such a job's processes get no lane and no boundaries, but their steps can still be
counted: every Python process of the job loads gq's ``sitecustomize`` first
(``gq/exec/job/rank_site/``), and the job's lowest rank (``RANK``, else ``SLURM_PROCID``, 0)
sends the count of its first optimizer's steps, as a datagram, to a socket the host bound
for the run. The host reads what came each second.

What arrives is the job's to send, and so hostile: the socket is the job's user's alone to
send to (0600, in a directory of the host's that no one else may change names in), takes
no disk (a job that sends faster than the host reads is refused by its own full buffer),
and the host believes a count only as it believes a worker's: plain digits within int64,
never less than before, never past the job's total.
"""

from __future__ import annotations

import logging
import os
import socket
import time

from gq.exec.host.terminal import bind_for_user
from gq.exec.lane.residents import Resident
from gq.validation import INT64_MAX

log = logging.getLogger("gq.host")

READ_EVERY = 1.0  # seconds between two reads of every run's socket
MOST_BYTES = 32  # a count is at most 19 digits
# Datagrams taken from one socket a read, past what a full one holds (net.unix.max_dgram_qlen,
# 512 by default): the largest plausible count among them counts.
MOST_READS = 1024


class RankProgress:
    """The progress sockets of one device's runs, in ``directory`` (None: counts none)."""

    def __init__(self, directory: str | None, device: str):
        self.directory = directory
        self.device = device
        self._next_read = 0.0
        self.sweep()

    def sweep(self) -> None:
        """What a host of this device left before it (killed, say): no run of it lives."""
        if self.directory is None:
            return
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith(f"{self.device}."):
                _unlink(os.path.join(self.directory, name))

    def bind(self, job_id: int, run: int, uid: int | None, gid: int | None):
        """The run's socket, its user's alone to send to; None where the host keeps none or
        cannot make one (its steps then go uncounted, nothing else changes)."""
        if self.directory is None:
            return None
        path = os.path.join(self.directory, f"{self.device}.{job_id}.{run}")
        try:
            return bind_for_user(path, socket.SOCK_DGRAM, uid, gid)
        except OSError as exc:
            log.warning("job %d: no progress socket (%s); its steps go uncounted", job_id, exc)
            _unlink(path)
            return None

    def read_all(self, residents: dict[int, Resident]) -> None:
        """Each run's latest count, about once a second, taken as a worker's would be."""
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + READ_EVERY
        for resident in residents.values():
            if resident.step_socket is not None:
                take(resident)

    def close(self, resident: Resident) -> None:
        """The run's process has exited: what it sent last, then the socket goes."""
        if resident.step_socket is not None:
            take(resident)
            self.discard(resident.step_socket)
            resident.step_socket = None

    @staticmethod
    def discard(sock: socket.socket | None) -> None:
        if sock is not None:
            path = sock.getsockname()
            sock.close()
            if isinstance(path, str) and path:
                _unlink(path)


def take(resident: Resident) -> None:
    """The datagrams waiting on the run's socket: the largest plausible count counts."""
    assert resident.step_socket is not None
    best = None
    for _ in range(MOST_READS):
        try:
            data = resident.step_socket.recv(MOST_BYTES + 1)
        except OSError:  # nothing more waiting (BlockingIOError), or none can come
            break
        count = parse_count(data)
        if count is not None and (best is None or count > best):
            best = count
    if best is not None:
        resident.record_steps(best)


def parse_count(data: bytes) -> int | None:
    """A count, or None where the datagram holds anything but one: plain ASCII digits,
    at most int64."""
    if len(data) > MOST_BYTES:
        return None
    text = data.strip(b" \n")
    if not text.isdigit() or len(text) > 19:  # bytes.isdigit: ASCII digits only
        return None
    count = int(text)
    return count if count <= INT64_MAX else None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
