"""Progress of jobs gq's worker does not run: a shell script's Python, or the ranks that
``torchrun`` (``srun -n 2``, accelerate, deepspeed) starts.

Such a job's processes get no lane and no boundaries, but their steps can still be
counted: every Python process of the job loads a ``sitecustomize`` from gq (see
``gq/exec/rank_site/``), and the process of the lowest rank (``RANK``, else
``SLURM_PROCID``, 0) counts its optimizer's steps (:mod:`gq.exec.rank_steps`) into a
file the host made for the run. The host reads that file each second.

The file is the job's to write, and so hostile: the host made it (the job's own, mode
0600, in a directory of the host's that no one else may change names in), opens it without
following links and without blocking, reads a few bytes, and believes a count only as it
believes a worker's (never less than before, never past the job's total).
"""

from __future__ import annotations

import logging
import os
import stat
import time

from gq.exec.residents import Resident
from gq.validation import INT64_MAX

log = logging.getLogger("gq.host")

READ_EVERY = 1.0  # seconds between two reads of every file
MOST_BYTES = 32  # a count is at most 19 digits, padded


class RankProgress:
    """The progress files of one host's runs, in ``directory`` (None: counts none)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self._next_read = 0.0

    def create(self, job_id: int, run: int, uid: int | None, gid: int | None) -> str | None:
        """A new empty file for the run, the job's own; None where the host keeps none."""
        if self.directory is None:
            return None
        path = os.path.join(self.directory, f"{job_id}.{run}")
        try:
            os.unlink(path)  # a run of that number this host left behind (killed, say)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.warning("job %d: no progress file (%s); its steps go uncounted", job_id, exc)
            return None
        try:
            if os.geteuid() == 0 and uid is not None and uid != 0:
                os.fchown(fd, uid, -1 if gid is None else gid)
        finally:
            os.close(fd)
        return path

    def read_all(self, residents: dict[int, Resident]) -> None:
        """Each run's count, about once a second, taken as a worker's would be."""
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + READ_EVERY
        for resident in residents.values():
            if resident.progress_file is not None and resident.exit_status is None:
                count = read_count(resident.progress_file, resident.uid)
                if count is not None:
                    resident.record_steps(count)

    def take_last(self, resident: Resident) -> None:
        """The run's process has exited: its last count (written as its ranks exit), then
        the file goes."""
        if resident.progress_file is None:
            return
        count = read_count(resident.progress_file, resident.uid)
        if count is not None:
            resident.record_steps(count)
        self.remove(resident.progress_file)
        resident.progress_file = None

    @staticmethod
    def remove(path: str | None) -> None:
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def read_count(path: str, uid: int | None) -> int | None:
    """The count in the file, or None where it holds none a host can trust: not a regular
    file of the job's user (swapped for a link, a FIFO, a device), or anything but digits."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (uid is not None and info.st_uid != uid):
            return None
        data = os.pread(fd, MOST_BYTES, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = data.strip(b" \n\0")
    if not text.isdigit() or len(text) > 19:  # bytes.isdigit: ASCII digits only
        return None
    count = int(text)
    return count if count <= INT64_MAX else None
