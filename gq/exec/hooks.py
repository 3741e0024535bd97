"""Finding iteration boundaries in unmodified PyTorch scripts.

Installed once the script imports torch (a meta-path finder watches for it, so scripts
that never import torch pay nothing):
- at a module call while released: acquire (later calls see the lane held and return);
- after every ``optimizer.step()``: release, one training step done;
- when grad is disabled, the end of an outermost module call: release, one inference step.

Several threads may call modules at once (inference servers, thread pools): each thread
keeps its own nesting depth, the device is held while any thread is inside a module call,
and it is released when the last one leaves. A module call that raises still counts as
left (the forward hook is registered with ``always_call``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading

from gq.exec.runtime import INFER, TRAIN, JobSession


class _Boundaries:
    """Entering and leaving outermost module calls, counted under one lock, so that the
    lane is released only when no thread is inside a module call, and no thread enters one
    without the lane."""

    def __init__(self, session: JobSession, torch):
        self.session = session
        self.torch = torch
        self.local = threading.local()  # .depth: this thread's nesting of module calls
        self.lock = threading.Lock()
        self.inside = 0  # threads now inside an outermost module call

    def before_forward(self, _module, _inputs):
        depth = getattr(self.local, "depth", 0)
        self.local.depth = depth + 1
        if depth == 0:
            with self.lock:
                self.inside += 1
                self.session.acquire()  # at once while the lane is held

    def after_forward(self, _module, _inputs, _output):
        depth = getattr(self.local, "depth", 0)
        if depth == 0:
            return  # a call that began before the hooks were installed
        self.local.depth = depth - 1
        if depth == 1:
            with self.lock:
                self.inside -= 1
                if not self.torch.is_grad_enabled():
                    self.session.count_step(INFER)
                    if self.inside == 0:
                        self.session.release()

    def after_optimizer_step(self, _optimizer, _args, _kwargs):
        self.local.depth = 0
        with self.lock:
            self.session.count_step(TRAIN)
            if self.inside == 0:
                self.session.release()


def install(session: JobSession, torch) -> None:
    module_hooks = importlib.import_module("torch.nn.modules.module")
    optimizer_hooks = importlib.import_module("torch.optim.optimizer")
    boundaries = _Boundaries(session, torch)
    module_hooks.register_module_forward_pre_hook(boundaries.before_forward)
    module_hooks.register_module_forward_hook(boundaries.after_forward, always_call=True)
    optimizer_hooks.register_optimizer_step_post_hook(boundaries.after_optimizer_step)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Installs the hooks right after ``import torch`` finishes."""

    def __init__(self, session: JobSession):
        self.session = session

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module
        session = self.session

        def exec_module(module):
            loader_exec(module)
            install(session, module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_when_imported(session: JobSession) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        install(session, torch)
    else:
        sys.meta_path.insert(0, _TorchWatcher(session))
