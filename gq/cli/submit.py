"""gq submit: validate, snapshot the script, insert the PENDING row, poke the daemon."""

from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gq.cli import directives, sbatch
from gq.cli.common import database, the_home
from gq.errors import UserError
from gq.queue import arrays
from gq.units import parse_duration, parse_size

DEFAULT_OUTPUT = "gq-%j.out"

HELP = """Queue SCRIPT to run with ARGS on the node's devices (like sbatch).

Prints "Submitted job ID". Options may also be written in the script's first comment
block as '#GQ --mem 6G' lines, or as '#SBATCH' lines for the options gq shares with
sbatch; the command line wins, then #GQ, then #SBATCH. The script is copied into the queue
now, so later edits do not change this job. .py scripts run with this Python (or --python)
and are swapped at iteration boundaries; other scripts run via their shebang or bash.

Example: gq submit -G 1 --mem 6G -t 2:00:00 --steps 5000 train.py --lr 3e-4
"""


def submit(
    ctx: typer.Context,
    script: str = typer.Argument(..., metavar="SCRIPT", help="The script to run (snapshotted at submit)."),
    args: Optional[list[str]] = typer.Argument(None, metavar="ARGS", help="Arguments passed to the script."),
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
    array: Optional[str] = typer.Option(None, "-a", "--array", help="Job array: 0-99%8, 1,3,5, 0-20:5 (%N: at most N at once)."),
    dependency: Optional[str] = typer.Option(None, "-d", "--dependency", help="afterok|afterany|afternotok|after:ID[:ID] joined by , (all) or ? (any)."),
    after: Optional[str] = typer.Option(None, "--after", help="Short for --dependency afterok:ID."),
    hold: bool = typer.Option(False, "-H", "--hold", help="Queue held; 'gq release' lets it run."),
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
    """Command-line values, then #GQ directives, then #SBATCH ones, for what each left unset."""
    options = dict(ctx.params)
    text = _read_script(script).decode("utf-8", errors="replace")
    found = directives.read(text, str(script))
    decided = {name for name in options if ctx.get_parameter_source(name).name == "COMMANDLINE"}
    warned: set[str] = set()
    for prefix in ("#GQ", "#SBATCH"):
        chosen: dict[str, Any] = {}
        for directive in (d for d in found if d.prefix == prefix):
            tokens = directive.tokens
            if prefix == "#SBATCH":
                tokens, ignored = sbatch.translate(tokens)
                for option in ignored:
                    if option not in warned:
                        warned.add(option)
                        typer.echo(f"gq: warning: {script}:{directive.line}: #SBATCH {option} "
                                   "is not used by gq (one node, its own devices); ignored",
                                   err=True)
                if not tokens:
                    continue
            chosen.update(_parse_directive(ctx, tokens, script, directive.line, prefix))
        for name, value in chosen.items():
            if name not in decided:
                options[name] = value
        decided |= set(chosen)
    return options


def _parse_directive(ctx: typer.Context, tokens: list[str], script: Path, line: int,
                     prefix: str) -> dict[str, Any]:
    where = f"{script}:{line}"
    try:
        parsed = ctx.command.make_context("gq submit", tokens + [str(script)], parent=ctx.parent)
    except typer.TyperException as exc:
        message = getattr(exc, "format_message", lambda: str(exc))()
        raise UserError(f"{where}: malformed {prefix} directive: {message}") from None
    if parsed.params.get("args"):
        raise UserError(f"{where}: malformed {prefix} directive: unexpected "
                        f"{' '.join(parsed.params['args'])!r}")
    return {name: value for name, value in parsed.params.items()
            if name != "script" and parsed.get_parameter_source(name).name == "COMMANDLINE"}


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
    if options["dependency"] and options["after"]:
        raise UserError("give either --dependency or --after, not both")
    dependency = options["dependency"] or (f"afterok:{options['after']}" if options["after"]
                                           else None)
    if dependency is not None:
        _check_dependency(dependency)
    tasks = arrays.parse(options["array"]) if options["array"] else None
    output = options["output"]
    return NewJob(
        name=options["job_name"] or script.name, user=getpass.getuser(), script=str(script),
        args=list(options["args"] or []), interpreter=interpreter, workdir=str(workdir),
        output_pattern=output, error_pattern=options["error"] or output, env=dict(os.environ),
        gpus=gpus, mem=mem, time_limit=limit, steps_total=steps,
        priority=options["priority"], exclusive=options["exclusive"],
        requeue=options["requeue"], dependency=dependency, held=options["hold"],
        array_tasks=tasks.tasks if tasks else None,
        array_max_running=tasks.max_running if tasks else None,
    )


def _check_dependency(text: str) -> None:
    from gq.queue import dependencies, queries

    parsed = dependencies.parse(text)
    with database().read() as session:
        runs = queries.runs_of(session, parsed.job_ids)
    missing = sorted(job_id for job_id, found in runs.items() if not found)
    if missing:
        raise UserError(f"dependency on job {', '.join(map(str, missing))}, which does not exist "
                        "(see 'gq status --all')")


def _enqueue(new, script: Path) -> int:
    from gq.queue import spool, transitions

    home = the_home()

    def resolve(pattern: str, job) -> str:
        array_id = job.array_job_id if job.array_job_id is not None else job.id
        task = job.array_task_id if job.array_task_id is not None else 0
        path = pattern.replace("%%", "\0")
        for code, value in (("%j", job.id), ("%x", new.name), ("%u", new.user),
                            ("%A", array_id), ("%a", task)):
            path = path.replace(code, str(value))
        return str(Path(new.workdir, path.replace("\0", "%")))

    first = None
    try:
        with database().write() as session:
            jobs = transitions.submit(session, new, resolve)
            first = jobs[0].id
            snapshot = spool.snapshot(home, first, script)
            transitions.set_spool_path(session, [job.id for job in jobs], str(snapshot))
    except BaseException:
        if first is not None:
            spool.discard(home, first)
        raise
    return first


def _announce(job_id: int, parsable: bool) -> None:
    from gq.daemon.control import poke

    typer.echo(str(job_id) if parsable else f"Submitted job {job_id}")
    if not poke(the_home()):
        typer.echo(f"gq: note: the daemon is not running; job {job_id} waits until "
                   "'gq daemon start'", err=True)
