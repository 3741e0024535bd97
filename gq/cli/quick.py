"""gq status, gq show, gq submit and gq run without typer: importing typer takes longer
than the rest of such a command.

A command line this module reads completely (known options, values where they belong, no
help, no completion) runs from here; any other, typos included, goes to typer, which reads
it again and gives its usual help and errors. A submitted script's directives are read
here too, and one this module does not read is read by click (importing typer then), not
handed back: the script has been read once already, and a piped one cannot be read again.
The options are the typer commands' (tests/test_cli_quick.py holds the two to each other),
so both read a line alike.
"""

from __future__ import annotations

import os

from gq import defaults

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see below)
if TYPE_CHECKING:
    from typing import Any

    Options = dict[str, tuple[str, str]]  # option -> (the typer parameter it sets, its Kind)

# This module, and what its commands import, stay clear of typing, dataclasses, enum, re
# and json: each takes a good part of Python's own start-up to import, and a command sent
# as one request should cost little more than that start-up (bench/cli_latency.py). gq show
# alone imports gq.messages, to read the typed job the daemon answers with.


class Kind:
    """How an option takes its value."""

    FLAG = "flag"  # --json
    VALUE = "value"  # -o FORMAT (the last one given counts)
    LIST = "list"  # -u USER, once for each
    INT = "int"  # --priority -5
    COUNT = "count"  # --limit N: an integer, 0 or more


STATUS: Options = {
    "-a": ("all_jobs", Kind.FLAG),
    "--all": ("all_jobs", Kind.FLAG),
    "--json": ("json_out", Kind.FLAG),
    "-u": ("user", Kind.LIST),
    "--user": ("user", Kind.LIST),
    "-t": ("state", Kind.LIST),
    "--state": ("state", Kind.LIST),
    "-o": ("format_spec", Kind.VALUE),
    "--format": ("format_spec", Kind.VALUE),
    "-S": ("sort_spec", Kind.VALUE),
    "--sort": ("sort_spec", Kind.VALUE),
    "--limit": ("limit", Kind.COUNT),
    "--start": ("start", Kind.FLAG),
    "-l": ("long", Kind.FLAG),
    "--long": ("long", Kind.FLAG),
    "-r": ("array_tasks", Kind.FLAG),
    "--array-tasks": ("array_tasks", Kind.FLAG),
}

SHOW: Options = {"--json": ("json_out", Kind.FLAG)}

_SUBMIT_VALUES = {
    "wrap": ["--wrap"],
    "job_name": ["-J", "--job-name"],
    "gpus": ["-G", "--gpus"],
    "gpus_per_node": ["--gpus-per-node"],
    "gres": ["--gres"],
    "gpu_mem": ["--gpu-mem"],
    "mem": ["--mem"],
    "host_mem": ["--host-mem"],
    "mem_per_cpu": ["--mem-per-cpu"],
    "mem_per_gpu": ["--mem-per-gpu"],
    "nodelist": ["-w", "--nodelist"],
    "time_limit": ["-t", "--time"],
    "warn_signal": ["--signal"],
    "begin": ["--begin"],
    "deadline": ["--deadline"],
    "output": ["-o", "--output"],
    "error": ["-e", "--error"],
    "chdir": ["-D", "--chdir"],
    "oom": ["--oom"],
    "retry_delay": ["--retry-delay"],
    "python": ["--python"],
    "array": ["-a", "--array"],
    "dependency": ["-d", "--dependency"],
    "after": ["--after"],
    "notify": ["--notify"],
    "mail_type": ["--mail-type"],
    "mail_user": ["--mail-user"],
    "idle_timeout": ["--idle-timeout"],
}
_SUBMIT_INTS = {
    "cpus_per_task": ["-c", "--cpus-per-task"],
    "ntasks": ["-n", "--ntasks"],
    "priority": ["--priority"],
    "steps": ["--steps"],
    "retries": ["--retries"],
}
_SUBMIT_FLAGS = {
    "exclusive": ["--exclusive"],
    "requeue": ["--requeue"],
    "hold": ["-H", "--hold"],
    "parsable": ["--parsable"],
    "wait": ["-W", "--wait"],
    "test_only": ["--test-only"],
    "pty": ["--pty"],
}
SUBMIT: Options = {
    option: (name, kind)
    for table, kind in (
        (_SUBMIT_VALUES, Kind.VALUE),
        (_SUBMIT_INTS, Kind.INT),
        (_SUBMIT_FLAGS, Kind.FLAG),
    )
    for name, options in table.items()
    for option in options
}

OPTIONS: dict[str, Options] = {"status": STATUS, "show": SHOW, "submit": SUBMIT, "run": SUBMIT}
# Defaults other than False (flags) and None, as the typer commands declare them.
DEFAULTS: dict[str, dict[str, Any]] = {
    "status": {},
    "show": {},
    "submit": {"priority": 0, "output": defaults.OUTPUT, "oom": defaults.ON_OOM},
}
DEFAULTS["run"] = DEFAULTS["submit"]
# Commands whose first argument is a script, the rest its arguments.
TAKES_SCRIPT = {"submit", "run"}
# Commands of one argument (the parameter it sets), options before or after it, as click
# reads them: gq show --json 17, gq show 17 --json.
TAKES_ONE = {"show": "job_id"}


class Parsed:
    """A line read: every parameter, by its typer name, and the names the line gave."""

    __slots__ = ("params", "given")

    def __init__(self, params: dict[str, Any], given: set[str]):
        self.params = params
        self.given = given


def parse(args: list[str], command: str) -> Parsed | None:
    """What a command line gives ``command``'s parameters; None for a line this module
    leaves to typer."""
    options = OPTIONS[command]
    params: dict[str, Any] = {
        name: False if kind == Kind.FLAG else None for name, kind in options.values()
    }
    params.update(DEFAULTS[command])
    given: set[str] = set()
    rest, arguments = list(args), []
    while rest:
        if not rest[0].startswith("-") or rest[0] == "-":
            if command not in TAKES_ONE:
                break
            arguments.append(rest.pop(0))
            continue
        token = rest.pop(0)
        if token == "--":
            break
        option, value = _split(token, options)
        if option is None:
            return None
        name, kind = options[option]
        given.add(name)
        if kind == Kind.FLAG:
            if value is not None:
                return None
            params[name] = True
            continue
        if value is None:
            if not rest:
                return None
            value = rest.pop(0)  # whatever it is, as click takes it: -S -p,i
        if kind in (Kind.INT, Kind.COUNT):
            try:
                number = int(value)  # as click reads it
            except ValueError:
                return None
            if kind == Kind.COUNT and number < 0:
                return None
            params[name] = number
        elif kind == Kind.LIST:
            params[name] = [*(params[name] or []), value]
        else:
            params[name] = value
    if command in TAKES_SCRIPT:
        params["script"] = rest.pop(0) if rest else None
        params["args"] = rest or None
    elif command in TAKES_ONE:
        arguments += rest
        if len(arguments) != 1:
            return None  # typer says what is missing, or what is one too many
        params[TAKES_ONE[command]] = arguments[0]
    elif rest:
        return None
    return Parsed(params, given)


def _split(token: str, options: Options) -> tuple[str | None, str | None]:
    """A token as (option, value attached to it): --format=%i, -uroot, or the option alone."""
    if token in options:
        return token, None
    if token.startswith("--") and "=" in token:
        option, value = token.split("=", 1)
        return (option, value) if option in options else (None, None)
    option = token[:2]
    if not token.startswith("--") and option in options and options[option][1] != Kind.FLAG:
        return option, token[2:]
    return None, None


def run(args: list[str]) -> int | None:
    """Run the command line here if this module reads it: its exit status; else None."""
    if not args or args[0] not in OPTIONS or "_GQ_COMPLETE" in os.environ:
        return None
    command = args[0]
    parsed = parse(args[1:], command)
    if parsed is None:
        return None
    if command == "status":
        from gq.cli import listing

        listing.status(**parsed.params)
        return 0
    if command == "show":
        from gq.cli import job_page

        job_page.show(**parsed.params)
        return 0
    from gq.cli import submission

    return submission.queue(command == "run", parsed.params, parsed.given, _directive)


def _directive(tokens: list[str], script: str, line: int, prefix: str) -> dict[str, Any]:
    """The options a #GQ or #SBATCH directive names, read as its command line would be;
    by click where this module does not read it (click then says what is wrong)."""
    parsed = parse([*tokens, str(script)], "submit")
    if parsed is None or parsed.params["args"] or parsed.params["script"] != str(script):
        from gq.cli import app, submit

        group = app.command("submit")
        # Under the app's own context, as on typer's path: a command remembers the help
        # option of the first context it is read in (-h, or only --help without it).
        parent = group.context_class(group, info_name="gq", **group.context_settings)
        return submit.read_directive(group.commands["submit"], tokens, script, line, prefix, parent)
    return {name: parsed.params[name] for name in parsed.given}
