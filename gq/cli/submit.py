"""gq submit: read the script and its directives as the caller, send them to the daemon."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from gq import defaults, messages, validation
from gq.cli import directives, sbatch
from gq.codec import INT64_MAX
from gq.cli.common import ask, usage_message
from gq.errors import UserError
from gq.queue import arrays, dependencies
from gq.units import parse_deadline, parse_duration, parse_size

DEFAULT_OUTPUT = "gq-%j.out"

SUBMIT_HELP = """Queue SCRIPT to run with ARGS on the node's devices (like sbatch).

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
    deadline: Optional[str] = typer.Option(None, "--deadline", help="End by then or be removed (state DEADLINE): YYYY-MM-DD[THH:MM[:SS]], HH:MM, now+2hours, ..."),
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
    content = _read_script(Path(script))
    options = _with_directives(ctx, Path(script), content)
    answer = ask(_request(options, content))
    typer.echo(str(answer.job_id) if options["parsable"] else f"Submitted job {answer.job_id}")


def _read_script(path: Path) -> bytes:
    """The script's bytes, read with the caller's own rights (the daemon never opens it)."""
    if not path.exists():
        raise UserError(f"script {path} does not exist")
    if path.is_dir():
        raise UserError(f"script {path} is a directory; give the script file to run")
    try:
        with path.open("rb") as handle:
            content = handle.read(defaults.MAX_SCRIPT + 1)
    except OSError as exc:
        raise UserError(f"cannot read script {path}: {exc.strerror}") from None
    if b"\0" in content[:8192]:
        raise UserError(f"script {path} is a binary file; submit a script that runs it")
    if len(content) > defaults.MAX_SCRIPT:
        raise UserError(f"script {path} is over {defaults.MAX_SCRIPT >> 20} MiB; submit a "
                        "smaller script that reads its data from files")
    return content


def _with_directives(ctx: typer.Context, script: Path, content: bytes) -> dict[str, Any]:
    """Command-line values, then #GQ directives, then #SBATCH ones, for what each left unset."""
    options = dict(ctx.params)
    text = content.decode("utf-8", errors="replace")
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
        raise UserError(f"{where}: malformed {prefix} directive: {usage_message(exc)}") from None
    if parsed.params.get("args"):
        raise UserError(f"{where}: malformed {prefix} directive: unexpected "
                        f"{' '.join(parsed.params['args'])!r}")
    return {name: value for name, value in parsed.params.items()
            if name != "script" and parsed.get_parameter_source(name).name == "COMMANDLINE"}


def _request(options: dict[str, Any], content: bytes) -> messages.Submit:
    """Check what needs no daemon (units, paths, the interpreter, as the caller), then build
    the request; the daemon checks the rest against the node."""
    script = Path(options["script"]).absolute()
    validation.text(str(script), f"script path {str(script)[:60]!r}", defaults.MAX_PATH)
    gpus = options["gpus"]
    if gpus < 0:
        raise UserError(f"invalid --gpus {gpus}: must be 0 or more")
    validation.integer(gpus, "--gpus", 0, defaults.MAX_GPUS)
    steps = options["steps"]
    if steps is not None and steps <= 0:
        raise UserError(f"invalid --steps {steps}: must be a positive number of iterations")
    if steps is not None:
        validation.integer(steps, "--steps", 1, INT64_MAX)
    validation.integer(options["priority"], "--priority", -defaults.MAX_PRIORITY,
                       defaults.MAX_PRIORITY)
    if options["job_name"] is not None:
        validation.job_name(options["job_name"])
    for flag in ("output", "error"):
        if options[flag] is not None:
            validation.text(options[flag], f"--{flag} {options[flag][:60]!r}", defaults.MAX_PATH)
    mem = parse_size(options["mem"]) if options["mem"] is not None else None
    limit = parse_duration(options["time_limit"]) if options["time_limit"] is not None else None
    deadline = (parse_deadline(options["deadline"], time.time())
                if options["deadline"] is not None else None)
    workdir = Path(options["chdir"]).absolute() if options["chdir"] else Path.cwd()
    validation.text(str(workdir), f"working directory {str(workdir)[:60]!r}", defaults.MAX_PATH)
    if not workdir.is_dir():
        raise UserError(f"--chdir {workdir} is not a directory")
    interpreter = None
    if script.suffix == ".py":
        interpreter = os.path.abspath(options["python"] or sys.executable)
        validation.text(interpreter, f"--python {interpreter[:60]!r}", defaults.MAX_PATH)
        if not os.access(interpreter, os.X_OK) or Path(interpreter).is_dir():
            raise UserError(f"--python {interpreter} is not an executable interpreter")
    elif options["python"]:
        raise UserError("--python applies only to .py scripts")
    if options["dependency"] and options["after"]:
        raise UserError("give either --dependency or --after, not both")
    dependency = options["dependency"] or (f"afterok:{options['after']}" if options["after"]
                                           else None)
    if dependency is not None:
        dependencies.parse(dependency)
    if options["array"]:
        arrays.parse(options["array"])
    args = list(options["args"] or [])
    env = dict(os.environ)
    validation.payload(env, args)
    umask = os.umask(0o022)
    os.umask(umask)
    return messages.Submit(
        script_path=str(script), script=content, args=args,
        workdir=str(workdir), env=env, umask=umask,
        options=messages.SubmitOptions(
            name=options["job_name"], gpus=gpus, mem=mem, time_limit=limit, deadline=deadline,
            priority=options["priority"], steps=steps, output=options["output"],
            error=options["error"], exclusive=options["exclusive"],
            requeue=options["requeue"], interpreter=interpreter, array=options["array"],
            dependency=dependency, held=options["hold"]))
