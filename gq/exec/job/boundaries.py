"""Where a training or inference loop's iterations begin and end (pure: no torch, no I/O).

The worker's hooks report what the script does (an outermost module call begins or ends, a
backward runs, an optimizer steps) and this decides where a person would put the
boundaries, so that one iteration is one training step or one evaluation batch:

- **Optimizers.** The first optimizer that ever steps counts the iterations, one per step
  of it. Its loop's cycle (every optimizer that steps until it steps again: D then G in a
  GAN) is learned from the first repetition, and from then on the lane is released only
  after the last optimizer of the cycle, so a two-optimizer step is one iteration. While
  the cycle is unknown (the first step of each), every step releases.
- **No optimizer** (weights updated by hand, ``p.data.add_(p.grad, ...)``): after a backward,
  the next outermost call of the iteration's model (the first module with parameters called
  since the last boundary) ends the iteration: a boundary right there, before the call.
  The script's end ends its last one.
- **Evaluation** (grad disabled): each outermost call of a module with parameters is one
  batch; parameterless modules called at top level (a loss, an activation) count nothing.
  Every outermost call under no_grad still releases at its end, so other jobs use the
  device while the script does host-side work.

The reported count is the explicit steps if the script marks any (``gq.steps``,
``gq.step``), else its optimizer steps, else its hand-written training steps, else its
evaluation batches (see :class:`gq.exec.job.worker.WorkerSession`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gq.exec.job.session import INFER, MANUAL, TRAIN


@dataclass(frozen=True)
class Boundary:
    """What the worker does at an event: count a step of this kind, and release the lane."""

    count: str | None = None
    release: bool = False


# Every boundary there is, made once: one is decided at every optimizer step.
_BOUNDARIES = {
    (count, release): Boundary(count, release)
    for count in (None, TRAIN, MANUAL, INFER)
    for release in (False, True)
}
NOTHING = _BOUNDARIES[None, False]


class LoopShape:
    """The state of one script's loop, fed by the worker's hooks (under their lock).

    Modules and optimizers are named by a key the caller chooses (their ``id``); only
    equality is used."""

    def __init__(self) -> None:
        self.first_optimizer: object | None = None  # its steps count the iterations
        self.cycle_closer: object | None = None  # the optimizer whose step ends one, learned
        self.last_stepped: object | None = None
        self.model: object | None = None  # the iteration's first module with parameters
        self.backward_since_boundary = False

    def forward_begins(self, module: object, has_parameters: bool) -> Boundary:
        """An outermost module call begins (before the lane is acquired for it)."""
        boundary = NOTHING
        if self.first_optimizer is None and self.backward_since_boundary and module == self.model:
            boundary = _BOUNDARIES[MANUAL, True]
            self.backward_since_boundary = False
        if has_parameters and self.model is None:
            self.model = module
        return boundary

    @staticmethod
    def forward_ends(has_parameters: bool, grad_enabled: bool) -> Boundary:
        """An outermost module call ends."""
        if grad_enabled:
            return NOTHING
        return _BOUNDARIES[INFER if has_parameters else None, True]

    def backward(self) -> None:
        self.backward_since_boundary = True

    @property
    def needs_backward(self) -> bool:
        """Whether backwards still matter: only until an optimizer counts the iterations."""
        return self.first_optimizer is None

    def optimizer_steps(self, optimizer: object) -> Boundary:
        """An optimizer's step has run."""
        self.backward_since_boundary = False
        if self.first_optimizer is None:
            self.first_optimizer = optimizer
        counts = optimizer == self.first_optimizer
        if counts and self.cycle_closer is None and self.last_stepped is not None:
            self.cycle_closer = self.last_stepped  # the cycle has come round once
        self.last_stepped = optimizer
        releases = self.cycle_closer is None or optimizer == self.cycle_closer
        if releases:
            self.model = None
        return _BOUNDARIES[TRAIN if counts else None, releases]

    def script_ends(self) -> Boundary:
        """The script is over: a hand-written step in progress is done."""
        if self.first_optimizer is None and self.backward_since_boundary:
            self.backward_since_boundary = False
            return _BOUNDARIES[MANUAL, True]
        return NOTHING
