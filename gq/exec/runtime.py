"""The job-side session, set by the worker bootstrap; None outside gq."""

from __future__ import annotations

from typing import Protocol


class JobSession(Protocol):
    def acquire(self) -> None: ...
    def release(self, step: bool) -> None: ...
    def set_total_steps(self, total: int) -> None: ...


active: JobSession | None = None
