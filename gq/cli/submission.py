"""gq submit and gq run, without typer: read the script and its directives as the caller,
check what needs no daemon, and queue the job. gq/cli/submit.py declares the options for
typer and gq/cli/quick.py reads plain lines itself; both call :func:`queue`.

The request is sent as plain fields (gq.messages.Submit's, which gq/cli/submit_request.py
builds), which the daemon checks as it checks any: a plain submission imports neither the
typed messages nor the parsers of the options it does not give (Slurm's, arrays',
dependencies'), each of which would cost it about as much as the rest of the command.
"""

from __future__ import annotations

import math
import os
import sys

from gq import client, defaults, validation
from gq.cli import command_lines, directives, submit_request
from gq.errors import UserError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    # One directive's tokens, the script, the directive's line and prefix -> the options it
    # gives (those it names, nothing else).
    DirectiveReader = Callable[[list[str], str, int, str], dict[str, Any]]

# Options that set one thing between them: the first source that gives one decides it.
_SAME_SETTING = (
    {"gpus", "gpus_per_node", "gres"},
    {"gpu_mem", "mem"},
    {"host_mem", "mem_per_cpu", "mem_per_gpu"},
)


def queue(
    run: bool,
    params: dict[str, Any],
    given: set[str],
    read_directive: DirectiveReader,
    kernel: str | None = None,
) -> int:
    """Queue the job the command's parameters say (``given``: those on its command line;
    ``run``: gq run's command line rather than a script) and print its id; the exit
    status: 0, or the job's own exit code with --wait or --pty (then on this terminal).
    ``kernel``: a Jupyter connection file, for which gq kernel run queues its kernel as an
    interactive job and is its launcher."""
    pty = bool(params.get("pty")) or kernel is not None
    if kernel is not None:
        from gq.cli import kernel_launch

        queued = kernel_launch.kernel_job(kernel)
    else:
        if pty:
            from gq.cli import interactive

            if not run:
                raise UserError("--pty is gq run's: gq run --pty [OPTIONS] -- COMMAND [ARGS]...")
            interactive.need_terminal()
        queued = _what_to_queue(
            run, params["script"], list(params["args"] or []), params["wrap"], pty
        )
    request, options = _build(params, given, read_directive, queued, pty)
    if options["test_only"]:
        request["test_only"] = True
        answer = client.Fields(client.ask_plain("submit", request, "test-only"))
        answer.delays = [client.Fields(delay) for delay in answer.delays]
        _print_test_only(answer)
        return 0
    job_id = client.ask_plain("submit", request, "submitted")["job_id"]
    if kernel is not None:
        return kernel_launch.launch(job_id, kernel)
    if pty:
        return interactive.run(job_id)
    if options["mail_type"] and _no_mail_command():
        print(
            "gq: warning: --mail-type: this node has no mail command; no mail will be "
            "sent for it (--notify runs a command of yours instead)",
            file=sys.stderr,
        )
    if options["old_mem"]:  # once it was accepted: a refusal says one line, its reason
        from gq.slurm.options import DEPRECATED_MEM

        print(f"gq: warning: {DEPRECATED_MEM}", file=sys.stderr)
    if options["wait"]:
        # Imported before the job is said submitted: a Ctrl-C that comes as msgspec's
        # types are made crashes the interpreter (SIGSEGV), one that comes while it
        # waits ends it quietly with 130.
        from gq import messages
        from gq.cli.wait import until_ended
    print(str(job_id) if options["parsable"] else f"Submitted job {job_id}", flush=True)
    if not options["wait"]:
        return 0
    return until_ended(messages.Wait([str(job_id)]), math.inf)


def check_kernel(params: dict[str, Any], given: set[str], read_directive: DirectiveReader) -> None:
    """gq kernel install: its submit options checked as a kernel's submission would check
    them, without the daemon (which checks them again at each start)."""
    from gq.cli import kernel_launch

    _build(params, given, read_directive, kernel_launch.kernel_job(None), True)


def _build(
    params: dict[str, Any],
    given: set[str],
    read_directive: DirectiveReader,
    queued: command_lines.Queued,
    pty: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The request for what is queued (and the options it was built from), its directives
    read and everything checked that needs no daemon."""
    content = queued.content if queued.content is not None else _read_script(queued.path)
    options = _with_directives(params, given, read_directive, queued.path, content)
    if bool(options.get("pty")) != bool(params.get("pty")):
        raise UserError(f"{queued.path}: a directive cannot ask for a terminal; give gq run --pty")
    options.update(script=queued.path, args=queued.args)
    if queued.interpreter is not None and not options["python"]:
        options["python"] = queued.interpreter
    if options["job_name"] is None and queued.content is not None:
        options["job_name"] = queued.name
    if options["test_only"] and options["wait"]:
        raise UserError("--test-only queues nothing for --wait to wait for; give one of them")
    options["command"] = _within(queued.command_line())
    request = submit_request.build(options, content)
    validation.idle_timeout(pty, options.get("idle_timeout"))
    if pty:
        if options["wait"]:
            raise UserError("--pty waits for its job already; leave --wait out")
        request["options"]["interactive"] = True
        if "output" not in given and options["output"] == defaults.OUTPUT:
            request["options"]["output"] = None  # the terminal's, as srun --pty's
    return request, options


def _no_mail_command() -> bool:
    import shutil

    return shutil.which("mail") is None


def _print_test_only(answer: Any) -> None:
    """sbatch --test-only's answer (gq.messages.TestOnly's fields), in gq's words: when and
    where, and whom it delays."""
    from gq.cli import render

    tasks = f"its {answer.tasks} tasks" if answer.tasks > 1 else "the job"
    if answer.start is None:
        print(
            f"gq: {tasks} would start at an unknown time (the jobs before it, or the "
            "job itself, give no --steps, --time or earlier runs to go on)"
        )
    else:
        mark = "~" if answer.basis == "estimated" else ""
        end = (
            f"{mark}{render.short_time(answer.end)}"
            if answer.end is not None
            else "an unknown time"
        )
        print(
            f"gq: {tasks} would start at {mark}{render.short_time(answer.start)} on "
            f"{answer.device} and end at {end}" + (" (estimated)" if mark else "")
        )
    if answer.delays:
        print(
            "gq: it would delay "
            + ", ".join(
                f"job {delay.job_id} by {render.duration(delay.seconds)}" for delay in answer.delays
            )
        )
    else:
        print("gq: it would delay no queued job")
    print("gq: nothing was queued (--test-only)")


def _what_to_queue(
    run: bool, script: str | None, args: list[str], wrap: str | None, pty: bool = False
) -> command_lines.Queued:
    """gq run's command line (``pty``: on a terminal), --wrap's, or the script named."""
    if run:
        if wrap is not None:
            raise UserError(
                "gq run takes its command after its options (gq run [OPTIONS] -- "
                "COMMAND [ARGS]...); --wrap is gq submit's"
            )
        return command_lines.from_argv([script, *args] if script is not None else [], pty)
    if wrap is not None:
        if script is not None:
            raise UserError("give either a SCRIPT or --wrap CMD, not both")
        return command_lines.from_wrap(wrap)
    if script is None:
        raise UserError("give the script to run (or --wrap CMD; gq run -- CMD runs a command)")
    return command_lines.Queued(script, None, args, None, os.path.basename(script))


def _within(command: str) -> str:
    """A command line kept to what a job's record holds (its arguments may take the whole
    payload limit, and quoting lengthens them): cut, and said to be."""
    if len(command) <= defaults.MAX_COMMAND:
        return command
    return command[: defaults.MAX_COMMAND - 1] + "…"


def _read_script(path: str) -> bytes:
    """The script's bytes, read with the caller's own rights (the daemon never opens it)."""
    if not os.path.exists(path):
        raise UserError(f"script {path} does not exist")
    if os.path.isdir(path):
        raise UserError(f"script {path} is a directory; give the script file to run")
    try:
        with open(path, "rb") as handle:
            content = handle.read(defaults.MAX_SCRIPT + 1)
    except OSError as exc:
        raise UserError(f"cannot read script {path}: {exc.strerror}") from None
    if b"\0" in content[:8192]:
        raise UserError(f"script {path} is a binary file; submit a script that runs it")
    if len(content) > defaults.MAX_SCRIPT:
        raise UserError(
            f"script {path} is over {defaults.MAX_SCRIPT >> 20} MiB; submit a "
            "smaller script that reads its data from files"
        )
    return content


def _with_directives(
    params: dict[str, Any],
    given: set[str],
    read_directive: DirectiveReader,
    script: str,
    content: bytes,
) -> dict[str, Any]:
    """Command-line values, then #GQ directives, then #SBATCH ones, for what each left unset.
    Every directive is read before anything is said about any of them."""
    options = dict(params)
    text = content.decode("utf-8", errors="replace")
    found = directives.read(text, script)
    read: list[tuple[str, dict[str, Any]]] = []
    notices: dict[str, int] = {}  # each said once, at its first line
    for directive in sorted(found, key=lambda d: d.prefix != "#GQ"):  # #GQ's first, as ever
        tokens = directive.tokens
        if directive.prefix == "#SBATCH":
            from gq.slurm import options as slurm_options
            from gq.slurm.environment import node_name

            try:
                tokens, said = slurm_options.translate(tokens, node_name())
            except UserError as exc:
                raise UserError(f"{script}:{directive.line}: {exc}") from None
            for notice in said:
                notices.setdefault(notice, directive.line)
            if not tokens:
                continue
        read.append(
            (directive.prefix, read_directive(tokens, script, directive.line, directive.prefix))
        )
    for notice, line in notices.items():
        print(f"gq: warning: {script}:{line}: #SBATCH {notice}", file=sys.stderr)
    old_mem = "mem" in given
    decided = _with_same_setting(given)
    for prefix in ("#GQ", "#SBATCH"):
        chosen: dict[str, Any] = {}
        for where, values in read:
            if where == prefix:
                chosen.update(values)
        old_mem |= "mem" in chosen and not decided & {"mem", "gpu_mem"}
        for name, value in chosen.items():
            if name not in decided:
                options[name] = value
        decided |= _with_same_setting(set(chosen))
    options["old_mem"] = old_mem
    if any(d.prefix == "#SBATCH" for d in found) and not decided & _SAME_SETTING[0]:
        options["gpus"] = "0"  # a cluster's script that asks for no GPU gets none there
        print(
            f"gq: note: {script}: its #SBATCH lines ask for no GPU, so it runs with "
            "-G 0, as on a cluster; give -G 1 (or #SBATCH --gres=gpu:1) for a device",
            file=sys.stderr,
        )
    return options


def _with_same_setting(names: set[str]) -> set[str]:
    """``names`` and the options that set the same thing as one of them."""
    return names.union(*(group for group in _SAME_SETTING if group & names))
