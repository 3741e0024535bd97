"""gq kernel: Jupyter kernelspecs whose kernel runs as a gq job (install, list, remove),
and ``gq kernel run``, the launcher such a kernelspec starts (:mod:`gq.cli.kernel_launch`).

A spec is written where ``jupyter kernelspec install --user`` writes one (Jupyter's user
data directory, ``JUPYTER_DATA_DIR`` where set). Its argv runs ``gq kernel run --spec NAME``
and its metadata keeps the submit options, which the launcher reads back at each start;
they are checked as ``gq run`` checks its own when the spec is installed.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import tempfile
from typing import Any, Optional

import typer

from gq.cli.common import usage_message
from gq.errors import UserError

app = typer.Typer(
    help="Jupyter kernels that run as gq jobs (pip install 'gq[jupyter]').", no_args_is_help=True
)

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # as Jupyter's kernel names, bounded
# Options that would run a kernel more than once, or not at all.
_NOT_FOR_A_KERNEL = ("array", "requeue", "retries", "wait", "test_only", "pty", "parsable")


def _specs():
    """Jupyter's KernelSpecManager, or a one-line error naming the extra."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        raise UserError("gq kernel needs Jupyter's client: pip install 'gq[jupyter]'") from None
    return KernelSpecManager()


def _submit_options(options: list[str]) -> tuple[Any, dict[str, Any], set[str]]:
    """gq run's command and its parameters for ``options`` (those given, too), checked as
    gq run checks them; refused where they would not start one kernel."""
    from gq.cli import app

    command = app.command("run").commands["run"]
    try:
        parsed = command.make_context("gq run", [*options, "--"])
    except typer.TyperException as exc:
        raise UserError(f"submit options: {usage_message(exc)}") from None
    if parsed.params.get("script") is not None:
        raise UserError(
            f"submit options: unexpected {parsed.params['script']!r}; the kernel "
            "is the job's command"
        )
    given = {
        name for name in parsed.params if parsed.get_parameter_source(name).name == "COMMANDLINE"
    }
    for name in _NOT_FOR_A_KERNEL:
        if name in given and parsed.params[name] not in (None, False):
            raise UserError(
                f"--{name.replace('_', '-')}: a kernel runs once, as an "
                "interactive job; leave it out"
            )
    return command, dict(parsed.params), given


def _check(options: list[str]) -> None:
    """The submit options a spec keeps, checked as each start's submission checks them."""
    from gq.cli import submission
    from gq.cli.submit import read_directive

    command, params, given = _submit_options(options)
    submission.check_kernel(params, given, functools.partial(read_directive, command))


def _gq_spec(name: str) -> dict[str, Any] | None:
    """gq's settings in the named spec's metadata; None where it is no gq kernel."""
    specs = _specs()
    from jupyter_client.kernelspec import NoSuchKernel

    try:
        spec = specs.get_kernel_spec(name)
    except NoSuchKernel:
        raise UserError(f"no kernel named {name!r} (gq kernel list shows gq's)") from None
    return (spec.metadata or {}).get("gq")


@app.command("install", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def install(
    ctx: typer.Context,
    name: str = typer.Option("gq", "--name", help="The kernel's name (lower case, digits, . _ -)."),
    display_name: Optional[str] = typer.Option(
        None, "--display-name", help="What notebooks show; default: Python (gq) and its options."
    ),
    replace: bool = typer.Option(False, "--replace", help="Overwrite a kernel of that name."),
) -> None:
    """Install a Jupyter kernel that runs as a gq job; any other options are gq run's
    (-G, --gpu-mem, -t, --priority, ...), used for every start of the kernel.

    Example: gq kernel install --name gpu -G 1 --gpu-mem 8G -t 8:00:00
    """
    options = list(ctx.args)
    if not _NAME.fullmatch(name):
        raise UserError(
            f"--name {name!r}: a kernel's name is 1-64 lower-case letters, "
            "digits, '.', '_' or '-', starting with a letter or digit"
        )
    _check(options)
    specs = _specs()
    if name in specs.find_kernel_specs() and not replace:
        raise UserError(
            f"a kernel named {name!r} exists already; give --replace to "
            "overwrite it, or another --name"
        )
    spec = {
        "argv": [
            sys.executable,
            "-m",
            "gq",
            "kernel",
            "run",
            "--spec",
            name,
            "--",
            "{connection_file}",
        ],
        "display_name": display_name or " ".join(["Python (gq)", *options]),
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"gq": {"submit": options}},
    }
    with tempfile.TemporaryDirectory() as source:
        with open(os.path.join(source, "kernel.json"), "w", encoding="utf-8") as handle:
            json.dump(spec, handle, indent=1)
        path = specs.install_kernel_spec(source, kernel_name=name, user=True)
    print(f"Installed kernel {name} in {path}")


@app.command("list")
def list_kernels() -> None:
    """The kernels gq installed: name, submit options, where."""
    for name, found in sorted(_specs().get_all_specs().items()):
        settings = (found["spec"].get("metadata") or {}).get("gq")
        if settings is not None:
            print(f"{name}\t{' '.join(settings.get('submit', [])) or '-'}\t{found['resource_dir']}")


@app.command("remove")
def remove(name: str = typer.Argument(..., help="A kernel gq installed.")) -> None:
    """Remove a kernel gq installed (others are jupyter kernelspec remove's)."""
    if _gq_spec(name) is None:
        raise UserError(f"kernel {name!r} is not gq's; remove it with jupyter kernelspec remove")
    print(f"Removed kernel {name} from {_specs().remove_kernel_spec(name)}")


@app.command("run")
def run(
    spec: str = typer.Option(..., "--spec", help="The kernel's name."),
    connection_file: str = typer.Argument(..., help="Jupyter's connection file."),
) -> None:
    """What a gq kernelspec runs: queue the kernel as a job, stand in for it until it ends
    (Jupyter starts it; you need not)."""
    from gq.cli import submission
    from gq.cli.submit import read_directive

    settings = _gq_spec(spec)
    if settings is None:
        raise UserError(f"kernel {spec!r} is not gq's")
    command, params, given = _submit_options(list(settings.get("submit", [])))
    code = submission.queue(
        True, params, given, functools.partial(read_directive, command), kernel=connection_file
    )
    if code:
        raise typer.Exit(code)
