"""The job-side session, set by the worker bootstrap; None outside gq."""

from __future__ import annotations

from typing import Protocol

# What a step was: the reported count is the explicit steps if the script marks any (gq.steps,
# gq.step), else its optimizer steps, else its hand-written training steps (a backward, then
# the model's next call), else its evaluation batches, so evaluation forwards in a training
# loop do not count as training steps (see gq.exec.job.boundaries).
EXPLICIT, TRAIN, MANUAL, INFER = "explicit", "train", "manual", "infer"
COUNTED_FIRST = (EXPLICIT, TRAIN, MANUAL, INFER)


class JobSession(Protocol):
    def acquire(self) -> None:
        """Block until the host grants the lane; at once if it is held already."""

    def release(self) -> None:
        """End the current iteration: the lane goes to other jobs until the next acquire."""

    def count_step(self, kind: str) -> None: ...

    def set_total_steps(self, total: int) -> None: ...


active: JobSession | None = None
