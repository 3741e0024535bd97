"""The house's layout holds: no import circles, no module past about 450 lines, and the
architecture page names every module of the execution host's and the daemon's rooms."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "gq"
LONGEST = 450
ROOMS = ("gq/exec", "gq/daemon")  # the page lists these module by module


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "rank_site" in path.parts:  # loaded by a job's Python as sitecustomize, not gq's
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The gq modules a module imports anywhere in it (type-checking imports included: a
    circle there is still two rooms that need each other)."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                whole = f"{node.module}.{alias.name}"
                named.add(whole if whole in modules else node.module)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
    return {name for name in named if name in modules}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for other in edges:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph[other]))))
                    break
                if other in on_stack:
                    low[node] = min(low[node], index[other])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_module_is_longer_than_the_house_allows():
    long = {
        str(path.relative_to(ROOT)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST
    }
    assert long == {}


def test_the_architecture_page_names_every_module_of_each_room():
    """Under each ``### `gq/...`/`` heading, the page's bullets name that package's
    modules, all of them and no others: a module added, moved or removed shows here."""
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    listed: dict[str, set[str]] = {}
    heading = None
    for line in page.splitlines():
        if match := re.fullmatch(r"### `(gq/[\w/]+)/`", line):
            heading = match.group(1)
            listed[heading] = set()
        elif line.startswith("## "):
            heading = None
        elif heading is not None and line.startswith("- "):
            listed[heading].update(re.findall(r"`(\w+\.py)`", line.split(":")[0]))
    actual: dict[str, set[str]] = {}
    for room in ROOMS:
        for path in (ROOT / room).rglob("*.py"):
            if "rank_site" in path.parts or path.name in {"__init__.py", "__main__.py"}:
                continue
            package = str(path.parent.relative_to(ROOT))
            actual.setdefault(package, set()).add(path.name)
    assert listed == actual


def test_every_package_is_one_the_wheel_ships():
    """A package left out of pyproject.toml's list installs nowhere but an editable
    checkout: its imports fail on every machine gq is installed on from a wheel."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as handle:
        listed = set(tomllib.load(handle)["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set()
