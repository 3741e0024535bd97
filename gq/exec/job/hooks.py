"""The hooks that find iteration boundaries in unmodified PyTorch scripts.

Installed once the script imports torch (a meta-path finder watches for it, so scripts
that never import torch pay nothing): ``torch.nn.Module.__call__`` wrapped to note each
thread's outermost module call, a post-hook on every optimizer step, a wrapper around
``torch.autograd.backward`` until an optimizer steps, one around
``torch.cuda.CUDAGraph.replay`` (a replay outside any iteration is one of its own), and one
after ``GradScaler.update`` (a step it skipped ends its iteration all the same). They tell
:class:`gq.exec.job.outermost_calls.Boundaries` what happened at top level; it counts each under
one lock, and :class:`gq.exec.job.boundaries.LoopShape` decides where iterations end (its
docstring states the rule).
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
import threading
from collections.abc import Callable
from typing import Any

from gq.exec.job import worker_memory
from gq.exec.job.import_watch import after_import
from gq.exec.job.outermost_calls import Boundaries, Section
from gq.exec.job.session import JobSession


def install(session: JobSession, torch) -> None:
    optimizer_hooks = importlib.import_module("torch.optim.optimizer")
    # (patched in place below: a module's attributes are whatever this torch defines)
    autograd: Any = importlib.import_module("torch.autograd")
    boundaries = Boundaries(session, torch)
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
    after_import(
        "torch._dynamo", lambda dynamo: _leave_to_dynamo(dynamo, boundaries, noted, granted)
    )
    scaler_class = getattr(getattr(torch, "amp", None), "GradScaler", None)
    update = getattr(scaler_class, "update", None)
    if scaler_class is not None and update is not None:
        scaler_class.update = _then(update, boundaries.scaler_updated)
    graph_class = getattr(torch.cuda, "CUDAGraph", None)
    replay = getattr(graph_class, "replay", None)
    replays = None
    if graph_class is not None and replay is not None:
        replays = graph_class.replay = _noting_replays(replay, boundaries)

    def in_forked_child() -> None:
        """A forked child (a DataLoader worker) neither holds the lane nor speaks for the
        job: its module calls are torch's alone, and a lock another thread held as it was
        forked is not waited for."""
        boundaries.lock = threading.Lock()
        boundaries.section = Section(boundaries.lock, boundaries.session)
        if module_class.__call__ is noted:
            module_class.__call__ = call
        if graph_class is not None and replays is not None and graph_class.replay is replays:
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


def _noting_replays(replay, boundaries: Boundaries):
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


def _noting_calls(call, boundaries: Boundaries):
    """``Module.__call__``, noting each thread's outermost call (one that raises too)."""
    return functools.wraps(call)(_outermost(call, boundaries))


def _outermost(call, boundaries: Boundaries, with_parameters: bool | None = None):
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


def _granting_compiled(compile_function, boundaries: Boundaries):
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


def _granting(compiled, original, boundaries: Boundaries):
    if isinstance(original, boundaries.torch.nn.Module) or not callable(compiled):
        return compiled
    call = boundaries.granted_call

    @functools.wraps(compiled)
    def granted(*args, **kwargs):
        return call(compiled, *args, **kwargs)

    return granted


def _leave_to_dynamo(dynamo, boundaries: Boundaries, noted, granted) -> None:
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


def _noting_backward(backward, boundaries: Boundaries):
    @functools.wraps(backward)
    def noted(*args, **kwargs):
        result = backward(*args, **kwargs)
        boundaries.after_backward()
        return result

    return noted


def install_when_imported(session: JobSession) -> None:
    """The hooks, once the script imports torch (a script that never does pays nothing)."""
    after_import("torch", lambda torch: install(session, torch))
