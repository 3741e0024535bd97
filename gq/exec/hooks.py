"""Finding iteration boundaries in unmodified PyTorch scripts.

Installed once the script imports torch (a meta-path finder watches for it, so scripts
that never import torch pay nothing):
- after every ``optimizer.step()``: release (one step done);
- at a module call while released: acquire (later calls see the lane held and return);
- when grad is disabled, the end of an outermost module call: release (inference).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

from gq.exec.runtime import JobSession


class _Boundaries:
    def __init__(self, session: JobSession, torch):
        self.session = session
        self.torch = torch
        self.depth = 0
        self.saw_optimizer = False

    def before_forward(self, _module, _inputs):
        if self.depth == 0:
            self.session.acquire()
        self.depth += 1

    def after_forward(self, _module, _inputs, _output):
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and not self.torch.is_grad_enabled():
            self.session.release(step=not self.saw_optimizer)

    def after_optimizer_step(self, _optimizer, _args, _kwargs):
        self.saw_optimizer = True
        self.depth = 0
        self.session.release(step=True)


def install(session: JobSession, torch) -> None:
    module_hooks = importlib.import_module("torch.nn.modules.module")
    optimizer_hooks = importlib.import_module("torch.optim.optimizer")
    boundaries = _Boundaries(session, torch)
    module_hooks.register_module_forward_pre_hook(boundaries.before_forward)
    module_hooks.register_module_forward_hook(boundaries.after_forward)
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
