"""The hooks that find iteration boundaries in unmodified PyTorch scripts.

Installed once the script imports torch (a meta-path finder watches for it, so scripts
that never import torch pay nothing): ``torch.nn.Module.__call__`` wrapped to note each
thread's outermost module call, a post-hook on every optimizer step, a wrapper around
``torch.autograd.backward`` until an optimizer steps, one around
``torch.cuda.CUDAGraph.replay`` (a replay outside any iteration is one of its own), and one
after ``GradScaler.update`` (a step it skipped ends its iteration all the same). They tell
:class:`gq.exec.boundaries.LoopShape` what happened at top level; it decides where
iterations end (its docstring states the rule).
An outermost module call while released acquires the lane (later calls see it held and
return at once). A nested call costs a thread-local read and a call: torch's global module
hooks, which gq used before, took every module call off torch's fast path, at about 2 µs a
call (a model of a few hundred modules paid most of a millisecond an iteration).

Several threads may call modules at once (inference servers, thread pools): the device is
held while any thread is inside a module call and released when the last one leaves. A
module call that raises still counts as left. Calls traced by ``torch.compile`` are left
alone (the compiled module's own call is the outermost one).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import weakref
from collections.abc import Callable

from gq.exec import worker_memory
from gq.exec.boundaries import NOTHING, Boundary, LoopShape
from gq.exec.job_session import JobSession


def _nothing() -> None:
    pass


class _Section:
    """The hooks' lock, taken as a section a console's Ctrl-C waits out: a KeyboardInterrupt
    between counting a call inside and asking for the lane (or releasing it and counting it
    out) would leave an iteration no release ever ends. One held back is raised as the
    section ends, with everything counted (gq.exec.worker's hold_interrupts)."""

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


class _Boundaries:
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
        self.section = _Section(self.lock, session)
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


def install(session: JobSession, torch) -> None:
    optimizer_hooks = importlib.import_module("torch.optim.optimizer")
    autograd = importlib.import_module("torch.autograd")
    boundaries = _Boundaries(session, torch)
    module_class = torch.nn.Module
    call = module_class.__call__
    noted = module_class.__call__ = _noting_calls(call, boundaries)
    compile_function = getattr(torch, "compile", None)
    granted = None
    if compile_function is not None:
        torch.compile = _granting_compiled(compile_function, boundaries)
        granted = _outermost(
            lambda function, *args, **kwargs: function(*args, **kwargs),
            boundaries,
            with_parameters=True,
        )
        boundaries.granted_call = granted
    _after_import(
        "torch._dynamo", lambda dynamo: _leave_to_dynamo(dynamo, boundaries, noted, granted)
    )
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    update = getattr(scaler_class, "update", None)
    if update is not None:
        scaler_class.update = _then(update, boundaries.scaler_updated)
    graph_class = getattr(torch.cuda, "CUDAGraph", None)
    replay = getattr(graph_class, "replay", None)
    replays = None
    if replay is not None:
        replays = graph_class.replay = _noting_replays(replay, boundaries)

    def in_forked_child() -> None:
        """A forked child (a DataLoader worker) neither holds the lane nor speaks for the
        job: its module calls are torch's alone, and a lock another thread held as it was
        forked is not waited for."""
        boundaries.lock = threading.Lock()
        boundaries.section = _Section(boundaries.lock, boundaries.session)
        if module_class.__call__ is noted:
            module_class.__call__ = call
        if replays is not None and graph_class.replay is replays:
            graph_class.replay = replay

    os.register_at_fork(after_in_child=in_forked_child)
    optimizer_hooks.register_optimizer_step_post_hook(boundaries.after_optimizer_step)
    backward = autograd.backward
    noting = autograd.backward = _noting_backward(backward, boundaries)  # Tensor.backward too

    def stop_noting_backward() -> None:
        """The script's own backward back once an optimizer counts the iterations (backwards
        then decide nothing), unless another wrapper has come on top of gq's."""
        if autograd.backward is noting:
            autograd.backward = backward

    boundaries.stop_noting_backward = stop_noting_backward
    at_finish = getattr(session, "at_finish", None)
    if at_finish is not None:
        at_finish.append(boundaries.script_ends)
    if hasattr(session, "ending"):
        session.ending = boundaries.end_now
    cap = getattr(session, "memory_cap", None)
    if cap is not None:  # before the script's first allocation, which follows its import
        worker_memory.cap_devices(torch, cap)


def _then(method, after: Callable[[], None]):
    """``method``, then ``after`` once it has returned."""

    @functools.wraps(method)
    def noted(*args, **kwargs):
        result = method(*args, **kwargs)
        after()
        return result

    return noted


def _noting_replays(replay, boundaries: _Boundaries):
    """``CUDAGraph.replay``, granted the lane where no iteration holds it."""

    @functools.wraps(replay)
    def noted(graph, *args, **kwargs):
        if not boundaries.replay_begins():
            return replay(graph, *args, **kwargs)
        try:
            return replay(graph, *args, **kwargs)
        finally:
            boundaries.replay_ends()

    return noted


def _noting_calls(call, boundaries: _Boundaries):
    """``Module.__call__``, noting each thread's outermost call (one that raises too)."""
    return functools.wraps(call)(_outermost(call, boundaries))


def _outermost(call, boundaries: _Boundaries, with_parameters: bool | None = None):
    """``call(target, ...)`` noted as the thread's outermost call of ``target`` where it is
    one (a module, or a compiled function): given the lane for its length."""
    local, compiling = boundaries.local, boundaries.compiling

    def noted(target, /, *args, **kwargs):  # (a forward may take a keyword named module)
        if compiling() or getattr(local, "depth", 0):  # traced, or nested: torch's alone
            return call(target, *args, **kwargs)
        try:
            boundaries.enter(target, with_parameters)
            return call(target, *args, **kwargs)
        finally:
            if getattr(local, "depth", 0):  # (not where it failed before counting itself)
                boundaries.leave()

    return noted


def _granting_compiled(compile_function, boundaries: _Boundaries):
    """``torch.compile``, whose compiled functions are granted the lane at each call.

    A compiled module's call is a module call (noted as any). A compiled *function* (a whole
    training step, say: forward, backward and the optimizer's step inside) calls no module
    that gq sees: the compiled code runs them inlined, and only the optimizer's hook runs,
    too late to acquire. Each call of it is therefore an outermost call of its own, counted
    as a model's (with parameters: its end under no_grad is an evaluation batch)."""

    @functools.wraps(compile_function)
    def compile(*args, **options):
        model = args[0] if args else options.get("model")
        compiled = compile_function(*args, **options)
        if model is None:  # @torch.compile(mode=...): a decorator, applied next
            return lambda function: _granting(compiled(function), function, boundaries)
        return _granting(compiled, model, boundaries)

    return compile


def _granting(compiled, original, boundaries: _Boundaries):
    if isinstance(original, boundaries.torch.nn.Module) or not callable(compiled):
        return compiled
    call = boundaries.granted_call

    @functools.wraps(compiled)
    def granted(*args, **kwargs):
        return call(compiled, *args, **kwargs)

    return granted


def _leave_to_dynamo(dynamo, boundaries: _Boundaries, noted, granted) -> None:
    """``torch.compile(module)`` compiles the frame of the module's ``__call__``, gq's wrapper:
    one code object for every module, whose cache (8 entries) all compiled modules would
    share, running uncompiled past it. Skipped as a frame of its own (and still traced
    through), it leaves dynamo the module's forward to compile, as without gq. The call
    is torch's internal: where it has gone, compiled modules share that cache."""
    for wrapper in (noted, granted):
        try:
            if wrapper is not None:
                dynamo.eval_frame.skip_code(wrapper.__code__)
        except Exception:  # noqa: BLE001 - an internal of torch's, which may change
            pass
    try:  # the lane let go while dynamo compiles (public from torch 2.6 on)
        handler = importlib.import_module("torch._dynamo.callback").callback_handler
    except Exception:  # noqa: BLE001 - older torch: compiled while holding the lane
        return

    def begins(_args) -> None:
        boundaries.compile_begins()

    def ends(_args) -> None:
        boundaries.compile_ends()

    def register() -> None:
        if begins not in handler.start_callbacks:
            handler.register_start_callback(begins)
            handler.register_end_callback(ends)

    register()
    reset = getattr(dynamo, "reset", None)
    if reset is not None:  # which clears every callback (torch.compiler.reset calls it)
        dynamo.reset = _then(reset, register)


def _noting_backward(backward, boundaries: _Boundaries):
    @functools.wraps(backward)
    def noted(*args, **kwargs):
        result = backward(*args, **kwargs)
        boundaries.after_backward()
        return result

    return noted


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after the module ``name`` is first imported. It stays on
    ``sys.meta_path`` (a string compared at each import): a finder that took itself off when
    asked would be off after a mere probe (``importlib.util.find_spec("torch")``, as
    libraries ask whether torch is there) or an import that failed, and taking it off can
    make another thread's import skip a finder."""

    def __init__(self, name: str, then: Callable):
        self.name = name
        self.then = then
        self.done = False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.done:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)  # one that raises leaves it watching for the next try
            if module.__name__ == self.name and not self.done:  # (a loader may be shared)
                self.done = True
                self.then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _after_import(name: str, then: Callable) -> None:
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


def install_when_imported(session: JobSession) -> None:
    """The hooks, once the script imports torch (a script that never does pays nothing)."""
    _after_import("torch", lambda torch: install(session, torch))
