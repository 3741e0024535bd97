"""gq submit: validate, snapshot the script, insert the PENDING row, poke the daemon."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gq.cli import directives
from gq.cli.common import database, the_home
from gq.errors import UserError
from gq.units import parse_duration, parse_size

DEFAULT_OUTPUT = "gq-%j.out"

HELP = """Queue SCRIPT to run with ARGS on the node's devices (like sbatch).

Prints "Submitted job ID". Options may also be written in the script's first comment
block as '#GQ --mem 6G' lines; the command line wins. The script is copied into the queue
now, so later edits do not change this job. .py scripts run with this Python (or --python)
and are swapped at iteration boundaries; other scripts run via their shebang or bash.

Example: gq submit -G 1 --mem 6G -t 2:00:00 --steps 5000 train.py --lr 3e-4
"""


def submit(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT", help="The script to run (snapshotted at submit)."),
    args: Optional[list[str]] = typer.Argument(None, metavar="[ARGS]...", help="Arguments passed to the script."),
    job_name: Optional[str] = typer.Option(None, "-J", "--job-name", help="Job name [script name]."),
    gpus: int = typer.Option(1, "-G", "--gpus", help="0 = CPU only, 1 = one shared device, N = N whole devices."),
    mem: Optional[str] = typer.Option(None, "--mem", help="Device memory the job needs: 512M, 6G, ..."),
    time_limit: Optional[str] = typer.Option(None, "-t", "--time", help="Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."),
    priority: int = typer.Option(0, "--priority", help="Higher runs first under the priority policy."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Total iterations (lets srtf estimate remaining time)."),
    output: str = typer.Option(DEFAULT_OUTPUT, "-o", "--output", help="stdout file; %j = job id, %x = job name."),
    error: Optional[str] = typer.Option(None, "-e", "--error", help="stderr file [same as --output]."),
    chdir: Optional[str] = typer.Option(None, "-D", "--chdir", help="Working directory [the current one]."),
    exclusive: bool = typer.Option(False, "--exclusive", help="Take the whole device; share it with no job."),
    requeue: bool = typer.Option(False, "--requeue", help="Requeue instead of failing if the node fails."),
    python: Optional[str] = typer.Option(None, "--python", help="Interpreter for .py scripts [this one]."),
    parsable: bool = typer.Option(False, "--parsable", help="Print only the job id."),
) -> None:
    options = _with_directives(ctx, Path(script))
    new = _validate(options)
    job_id = _enqueue(new, Path(options["script"]).absolute())
    _announce(job_id, options["parsable"])


def _read_script(path: Path) -> bytes:
    if not path.exists():
        raise UserError(f"script {path} does not exist")
    if path.is_dir():
        raise UserError(f"script {path} is a directory; give the script file to run")
    try:
        content = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read script {path}: {exc.strerror}") from None
    if b"\0" in content[:8192]:
        raise UserError(f"script {path} is a binary file; submit a script that runs it")
    return content


def _with_directives(ctx: typer.Context, script: Path) -> dict[str, Any]:
    """Command-line values, with #GQ directives filling what the command line left unset."""
    options = dict(ctx.params)
    text = _read_script(script).decode("utf-8", errors="replace")
    for directive in directives.read(text, str(script)):
        where = f"{script}:{directive.line}"
        try:
            parsed = ctx.command.make_context("gq submit", directive.tokens + [str(script)],
                                              parent=ctx.parent)
        except typer.TyperException as exc:
            message = getattr(exc, "format_message", lambda: str(exc))()
            raise UserError(f"{where}: malformed #GQ directive: {message}") from None
        if parsed.params.get("args"):
            raise UserError(f"{where}: malformed #GQ directive: unexpected "
                            f"{' '.join(parsed.params['args'])!r}")
        for name, value in parsed.params.items():
            from_directive = parsed.get_parameter_source(name).name == "COMMANDLINE"
            on_command_line = ctx.get_parameter_source(name).name == "COMMANDLINE"
            if from_directive and not on_command_line and name != "script":
                options[name] = value
    return options


def _node_devices():
    """The devices the daemon published, or discovered now when it has not run yet."""
    from gq.daemon.devices import Device, discover
    from gq.queue import settings

    with database().read() as session:
        published = settings.get(session, settings.DAEMON)
    if published:
        return [Device(**d) for d in published["devices"]]
    return discover()[0]


def _validate(options: dict[str, Any]):
    from gq.daemon.devices import gpu_capacity
    from gq.queue.transitions import NewJob

    script = Path(options["script"]).absolute()
    gpus = options["gpus"]
    if gpus < 0:
        raise UserError(f"invalid --gpus {gpus}: must be 0 or more")
    steps = options["steps"]
    if steps is not None and steps <= 0:
        raise UserError(f"invalid --steps {steps}: must be a positive number of iterations")
    mem = parse_size(options["mem"]) if options["mem"] is not None else None
    limit = parse_duration(options["time_limit"]) if options["time_limit"] is not None else None
    devices = _node_devices()
    capacity = gpu_capacity(devices)
    if gpus > capacity:
        raise UserError(f"--gpus {gpus} is more than this node has ({capacity}); see 'gq info'")
    on_gpus = gpus > 0 and any(d.kind == "cuda" for d in devices)
    largest = max(d.memory_total for d in devices if (d.kind == "cuda") == on_gpus)
    if mem is not None and mem > largest:
        from gq.units import format_size

        raise UserError(f"--mem {options['mem']} is more than any device of this node has "
                        f"({format_size(largest)}); see 'gq info'")
    workdir = Path(options["chdir"]).absolute() if options["chdir"] else Path.cwd()
    if not workdir.is_dir():
        raise UserError(f"--chdir {workdir} is not a directory")
    interpreter = None
    if script.suffix == ".py":
        interpreter = options["python"] or sys.executable
        if not os.access(interpreter, os.X_OK) or Path(interpreter).is_dir():
            raise UserError(f"--python {interpreter} is not an executable interpreter")
    elif options["python"]:
        raise UserError("--python applies only to .py scripts")
    output = options["output"]
    return NewJob(
        name=options["job_name"] or script.name, user=getpass.getuser(), script=str(script),
        args=list(options["args"] or []), interpreter=interpreter, workdir=str(workdir),
        output_pattern=output, error_pattern=options["error"] or output, env=dict(os.environ),
        gpus=gpus, mem=mem, time_limit=limit, steps_total=steps,
        priority=options["priority"], exclusive=options["exclusive"],
        requeue=options["requeue"],
    )


def _enqueue(new, script: Path) -> int:
    from gq.queue import spool, transitions

    home = the_home()

    def resolve(pattern: str, job_id: int, name: str) -> str:
        path = pattern.replace("%%", "\0").replace("%j", str(job_id)).replace("%x", name)
        path = path.replace("%u", new.user).replace("\0", "%")
        return str(Path(new.workdir, path))

    job_id = None
    try:
        with database().write() as session:
            job = transitions.submit(session, new, resolve)
            job_id = job.id
            snapshot = spool.snapshot(home, job_id, script)
            transitions.set_spool_path(session, job_id, str(snapshot))
    except BaseException:
        if job_id is not None:
            spool.discard(home, job_id)
        raise
    return job_id


def _announce(job_id: int, parsable: bool) -> None:
    from gq.daemon.control import poke

    typer.echo(str(job_id) if parsable else f"Submitted job {job_id}")
    if not poke(the_home()):
        typer.echo(f"gq: note: the daemon is not running; job {job_id} waits until "
                   "'gq daemon start'", err=True)
