"""Counting the steps of a process gq's worker does not run (see
:mod:`gq.exec.rank_progress`): in the job's lowest rank, each step of the first optimizer
that steps is counted, and the count is written to the run's progress file at each step.
Other ranks, and processes of other jobs, count nothing."""

from __future__ import annotations

import atexit
import importlib
import os


def lowest_rank(environ: dict[str, str]) -> bool:
    """Whether this process is its job's lowest rank: torchrun's RANK where set, else
    srun's SLURM_PROCID (which a gq job's own processes inherit as 0), else the only one."""
    rank = environ.get("RANK", environ.get("SLURM_PROCID", "0"))
    return rank.strip() == "0"


class StepCounter:
    """The count, written into a file the host made (opened once: never created here)."""

    def __init__(self, fd: int):
        self.fd: int | None = fd
        self.first: int | None = None  # id of the optimizer whose steps count
        self.steps = 0

    def on_step(self, optimizer, _args, _kwargs) -> None:
        if self.first is None:
            self.first = id(optimizer)
        if id(optimizer) != self.first:  # a GAN's second optimizer: the same iteration
            return
        self.steps += 1
        self.write()  # a pwrite of 21 bytes, about a microsecond: every step, never stale

    def write(self) -> None:
        """The count so far; a process that has counted nothing (a spawned DataLoader
        worker of the rank, say) leaves the file as it is."""
        if self.fd is None or not self.steps:
            return
        try:
            os.pwrite(self.fd, b"%20d\n" % self.steps, 0)
        except OSError:
            pass

    def forked(self) -> None:
        """A forked child (a DataLoader worker) is not the rank: it writes nothing."""
        self.fd = None


def install() -> None:
    """Count this process's steps, where it is a lowest rank of a gq job run without gq's
    worker (the worker counts its own) and torch gets imported."""
    path = os.environ.get("GQ_PROGRESS_FILE")
    if not path or "GQ_WORKER_FD" in os.environ or not lowest_rank(dict(os.environ)):
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    counter = StepCounter(fd)

    def hook(_torch) -> None:
        try:
            optimizer = importlib.import_module("torch.optim.optimizer")
            optimizer.register_optimizer_step_post_hook(counter.on_step)
        except Exception:  # noqa: BLE001 - a torch without global step hooks: no count
            return
        atexit.register(counter.write)
        os.register_at_fork(after_in_child=counter.forked)

    from gq.exec.import_watch import after_import

    after_import("torch", hook)
