"""Outermost calls counted across a job's threads, and the lane held while one is inside.

:mod:`gq.exec.job.hooks` patches torch and reports what the script does: a thread's outermost
module call (or compiled function's call) begins or ends, a backward, an optimizer's step,
a CUDA graph's replay, a GradScaler's update, dynamo compiling. :class:`Boundaries` counts
them under one lock, asks :class:`gq.exec.job.boundaries.LoopShape` where iterations end, and
acquires and releases the lane through the job's session accordingly: the hot path of every
iteration in the job's own process.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from gq.exec.job.boundaries import NOTHING, Boundary, LoopShape
from gq.exec.job.session import JobSession


def _nothing() -> None:
    pass


class Section:
    """The hooks' lock, taken as a section a console's Ctrl-C waits out: a KeyboardInterrupt
    between counting a call inside and asking for the lane (or releasing it and counting it
    out) would leave an iteration no release ever ends. One held back is raised as the
    section ends, with everything counted (gq.exec.job.worker's hold_interrupts)."""

    __slots__ = ("lock", "hold", "let", "raise_held_back")

    def __init__(self, lock: threading.Lock, session: JobSession):
        self.lock = lock
        # A session without them (a test's stand-in) holds nothing back.
        self.hold = getattr(session, "hold_interrupts", _nothing)
        self.let = getattr(session, "let_interrupts", _nothing)
        self.raise_held_back = getattr(session, "raise_held_back", _nothing)

    def __enter__(self) -> None:
        self.hold()
        self.lock.acquire()

    def __exit__(self, kind, _value, _traceback) -> None:
        self.lock.release()
        self.let()
        if kind is None:
            self.raise_held_back()


class Boundaries:
    """Entering and leaving outermost module calls, counted under one lock, so that the
    lane is released only when no thread is inside a module call, and no thread enters one
    without the lane."""

    def __init__(self, session: JobSession, torch):
        self.session = session
        self.torch = torch
        compiler = getattr(torch, "compiler", None)  # torch.compiler.is_compiling from 2.3 on
        self.compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        # .depth: 1 while this thread is inside a module call (counted inside);
        # .with_parameters: whether its outermost call's module has parameters
        self.local = threading.local()
        self.lock = threading.Lock()
        self.section = Section(self.lock, session)
        self.inside = 0  # threads now inside an outermost module call
        self.release_owed = False  # an iteration ended while a thread was inside a call
        # The lane is held for a CUDA graph's replay that nothing has ended yet (one with
        # grad enabled: its optimizer step may follow, eager): the next replay ends it.
        self.replay_open = False
        self.stepped = False  # an optimizer has stepped since the lane was last released
        self.shape = LoopShape()
        self.with_parameters: set[int] = set()  # ids of modules found to have parameters
        self.stop_noting_backward: Callable[[], None] | None = None
        self.compile_released = False  # the lane let go while dynamo compiles
        self.opener: int | None = None  # the thread whose call took the lane now held
        self.granted_call: Callable | None = None  # a compiled function's call, noted

    def _apply(self, boundary: Boundary) -> None:
        """Under the lock: count and release as the loop's shape says; a release while a
        thread is inside a module call (an optimizer that steps inside one: a whole training
        step in a module's forward, say) comes as the last one leaves, unless an outermost
        call begins meanwhile."""
        if boundary.count is not None:
            self.session.count_step(boundary.count)
        if boundary.release:
            self.release_owed = True
        if self.release_owed and self.inside == 0:
            self.release_owed = self.replay_open = self.stepped = False
            self.opener = None
            self.session.release()

    def _acquire(self) -> None:
        """Under the lock: the lane for this thread's call, noting the thread that took it
        (the iteration's own, which alone may let it go to compile); once another thread
        joins the iteration, no thread may."""
        me = threading.get_ident()
        if not getattr(self.session, "held", False):
            self.opener = me
        elif self.opener != me:
            self.opener = None
        self.session.acquire()

    def _end_iteration(self) -> None:
        """Under the lock: the iteration is over, whatever the loop's shape says."""
        self.release_owed = True
        self._apply(NOTHING)

    def enter(self, module, with_parameters: bool | None = None) -> None:
        """This thread's outermost module call (or compiled function's call) begins:
        counted inside (``local.depth`` 1 from then on) and given the lane. What ended an
        iteration before it is applied first."""
        local = self.local
        if with_parameters is None:
            with_parameters = self._has_parameters(module)
        local.with_parameters = with_parameters
        with self.section:
            boundary = self.shape.forward_begins(id(module), with_parameters)
            if boundary is not NOTHING:
                self._apply(boundary)
            self.release_owed = False  # the lane is wanted again: the next boundary gives it
            self.replay_open = False  # a replay before it is part of its iteration
            self.inside += 1
            local.depth = 1
            self._acquire()  # at once while the lane is held

    def leave(self) -> None:
        """This thread's outermost module call has ended (or raised)."""
        with self.section:
            self.local.depth = 0
            self.inside -= 1
            self._apply(
                self.shape.forward_ends(self.local.with_parameters, self.torch.is_grad_enabled())
            )

    def after_backward(self) -> None:
        with self.section:
            self.shape.backward()

    def after_optimizer_step(self, optimizer, _args, _kwargs):
        with self.section:
            self.stepped = True  # (a scaler's update in the middle of a cycle ends nothing)
            self._apply(self.shape.optimizer_steps(id(optimizer)))
            if self.stop_noting_backward is not None and not self.shape.needs_backward:
                self.stop_noting_backward()
                self.stop_noting_backward = None

    def replay_begins(self) -> bool:
        """A CUDA graph is replayed (``CUDAGraph.replay`` calls no module): within an
        iteration (a thread inside a module call, or the lane held between a forward and
        its optimizer step) nothing more; outside any, the replay is an iteration of its
        own, granted before it is queued and released after (True)."""
        with self.section:
            if self.inside:
                return False
            if getattr(self.session, "held", False):
                if not self.replay_open:
                    return False  # part of an iteration begun otherwise
                self._end_iteration()  # the last replay's: nothing ended it
            self.inside += 1
            try:
                self._acquire()
            except BaseException:
                self.inside -= 1
                raise
            return True

    def replay_ends(self) -> None:
        """A replay under no_grad ends its iteration (an inference graph); with grad enabled
        the lane stays held for what may follow (an eager optimizer step, which releases
        it), and the next replay ends it if nothing else has."""
        with self.section:
            self.inside -= 1
            if self.torch.is_grad_enabled():
                self.replay_open = True
            else:
                self._end_iteration()

    def scaler_updated(self) -> None:
        """A GradScaler's update ends each of its iterations, stepped or skipped: where it
        skipped the optimizer's step (infinite gradients, as fp16 training meets at its
        start), no step hook ends the iteration, and the lane would be held into the
        next one. Where the step ran, the lane is free already and this does nothing."""
        with self.section:
            if self.inside == 0 and not self.stepped and getattr(self.session, "held", False):
                self._end_iteration()

    def compile_begins(self) -> None:
        """Dynamo starts compiling (a new frame, or a backward compiled at its first run):
        seconds to minutes of CPU work, during which the device would sit idle under this
        job's grant. The lane is let go meanwhile where this thread's call took it and no
        other thread is inside a call: another thread's iteration (between its forward and
        its optimizer step, say) may have kernels to queue under the grant."""
        with self.section:
            others_inside = self.inside - (1 if getattr(self.local, "depth", 0) else 0)
            if (
                others_inside
                or self.opener != threading.get_ident()
                or not getattr(self.session, "held", False)
            ):
                return
            self.session.release()
            self.compile_released = True

    def compile_ends(self) -> None:
        """The compiled code runs next, within the iteration it was compiled in."""
        with self.section:
            if self.compile_released:
                self.compile_released = False
                self.session.acquire()

    def script_ends(self) -> None:
        with self.section:
            self._apply(self.shape.script_ends())

    def end_now(self) -> None:
        """A console's statement is over: so is its iteration (once no thread is inside a
        module call)."""
        with self.section:
            self._end_iteration()

    def _has_parameters(self, module) -> bool:
        """Whether a module (or one inside it) has parameters, asked of nn.Module itself: a
        module may override ``parameters()`` (to return a list, say). Unanswerable counts
        as yes: the hooks must never fail the script's own call. A yes is kept until the
        module is collected (asking costs a model's every iteration several microseconds); a
        no is asked again, since a model may build its layers in its first call."""
        key = id(module)
        if key in self.with_parameters:
            return True
        try:
            if next(self.torch.nn.Module.parameters(module), None) is None:
                return False
        except Exception:  # noqa: BLE001 - whatever a user's module does
            return True
        try:  # forgotten as the module is collected, before its id can be another's
            weakref.finalize(module, self.with_parameters.discard, key)
        except TypeError:
            return True  # not weakly referenceable: asked at each call
        self.with_parameters.add(key)
        return True
