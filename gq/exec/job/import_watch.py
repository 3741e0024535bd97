"""Running code right after a module is first imported: gq's hooks go into torch only once
a job imports it, so a job that never does pays nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable


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

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, then: Callable) -> None:
    """``then(module)`` once ``name`` is imported (at once, where it is already)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
