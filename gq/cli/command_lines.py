"""A command line instead of a script (``gq run -- CMD ARGS``, ``gq submit --wrap "CMD"``):
what to queue for it. A Python command (``python train.py ...``, ``python -m pkg ...``)
becomes a Python job, with iteration boundaries, run by the interpreter the command names
as found on the submitter's PATH now; any other command runs from a small sh script. Under
``gq run --pty``, a Python with no script is a REPL run by gq's worker (gq.exec.job.console), and
so is IPython (``ipython ARGS``, ``python -m IPython ARGS``) by the interpreter it is
installed for."""

from __future__ import annotations

import os

from gq.errors import UserError

# Patterns, compiled (and re imported) by the commands that use them: a plain gq submit
# imports this module for Queued alone.
_PYTHON = r"python(\d+(\.\d+)?)?"
_MODULE = r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
# Modules that start the training in processes of their own: gq's worker would see none of
# their iterations, so they run as plain commands (a device of their own on a GPU).
_LAUNCHERS = frozenset(
    {
        "torch.distributed.run",
        "torch.distributed.launch",
        "accelerate.commands.launch",
        "deepspeed.launcher.runner",
    }
)
_SHELL_SYNTAX = r"[;&|<>()$`\\\"'*?\[\]{}~#\n]"  # what only a shell reads
_REPL = b"# gq run --pty: python\nfrom gq.exec.job.console import interact\n\ninteract()\n"
_IPYTHON = b"# gq run --pty: ipython\nfrom gq.exec.job.console import interact_ipython\n\ninteract_ipython()\n"


class Queued:
    """What a command line, or a script named, is queued as: a script path (a label where
    nothing is on disk) and its content (None: read the script at ``path``), arguments,
    interpreter (Python jobs), the name it goes by, and the command line the user gave, as a
    shell would read it (gq show's Command; None: the script and its arguments). Plain, as
    what a plain ``gq submit`` imports is (gq/cli/quick.py)."""

    __slots__ = ("path", "content", "args", "interpreter", "name", "command")

    def __init__(
        self,
        path: str,
        content: bytes | None,
        args: list[str],
        interpreter: str | None,
        name: str,
        command: str | None = None,
    ):
        self.path = path
        self.content = content
        self.args = args
        self.interpreter = interpreter
        self.name = name
        self.command = command

    def command_line(self) -> str:
        """The command line as the user gave it: ``gq run -- CMD ARGS``'s words and ``gq
        submit SCRIPT ARGS``' quoted as a shell would (shlex.join), --wrap's as written."""
        return self.command if self.command is not None else shell_join([self.path, *self.args])


# What shlex.quote leaves unquoted (its \w, ASCII), for a plain gq submit, which imports
# neither shlex nor re.
_UNQUOTED = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


def shell_join(words: list[str]) -> str:
    """shlex.join: each word as a shell reads it back, in single quotes where it needs any."""
    return " ".join(
        word
        if word and all(c in _UNQUOTED for c in word)
        else "'" + word.replace("'", "'\"'\"'") + "'"
        for word in words
    )


def from_argv(argv: list[str], interactive: bool = False) -> Queued:
    """``gq run -- CMD ARGS``; with ``interactive`` (--pty), a Python with no script is a
    REPL run by gq's worker, each statement's device work on the lane."""
    if not argv:
        raise UserError("give the command to run: gq run [OPTIONS] -- COMMAND [ARGS]...")
    queued = _queued_for(argv, interactive)
    queued.command = shell_join(argv)
    return queued


def _queued_for(argv: list[str], interactive: bool) -> Queued:
    import re
    import shlex

    program = os.path.basename(argv[0])
    if interactive and re.fullmatch(_PYTHON, program) and argv[1:] in ([], ["-i"]):
        return Queued(
            os.path.join(os.getcwd(), f"{program} (interactive).py"),
            _REPL,
            [],
            _python(argv[0]),
            program,
        )
    if interactive and re.fullmatch(_PYTHON, program) and argv[1:3] == ["-m", "IPython"]:
        return _ipython(_python(argv[0]), argv[3:])
    if interactive and re.fullmatch(r"ipython\d*", program):
        python = _interpreter_of(argv[0])
        if python is not None:
            return _ipython(python, argv[1:])
    if re.fullmatch(_PYTHON, program) and len(argv) > 1:
        python = _python(argv[0])
        if (
            argv[1] == "-m"
            and len(argv) > 2
            and re.fullmatch(_MODULE, argv[2])
            and argv[2] not in _LAUNCHERS
        ):
            return _module(python, argv[2], argv[3:])
        if argv[1].endswith(".py") and not argv[1].startswith("-"):
            return Queued(argv[1], None, argv[2:], python, os.path.basename(argv[1]))
    text = f"#!/bin/sh\n# gq run\nexec {shlex.join(argv)}\n"
    return Queued(
        os.path.join(os.getcwd(), "(command)"), text.encode(), [], None, program or "command"
    )


def from_wrap(command: str) -> Queued:
    """``gq submit --wrap "CMD"``, as sbatch's: an sh script of that one line, named wrap;
    a plain Python command line (no shell syntax in it) as :func:`from_argv` queues it."""
    import re

    if not command.strip():
        raise UserError('--wrap needs a command, such as --wrap "python train.py"')
    if not re.search(_SHELL_SYNTAX, command):
        words = command.split()
        if re.fullmatch(_PYTHON, os.path.basename(words[0])):
            queued = from_argv(words)
            if queued.interpreter is not None:
                queued.command = command
                return queued
    text = f"#!/bin/sh\n# gq submit --wrap\n{command}\n"
    return Queued(os.path.join(os.getcwd(), "(wrap)"), text.encode(), [], None, "wrap", command)


def _python(program: str) -> str:
    """The interpreter a command names, as the submitter's PATH finds it now."""
    import shutil

    found = shutil.which(program)
    if found is None:
        raise UserError(f"{program}: not found on your PATH; give the interpreter's path")
    return os.path.abspath(found)


def _ipython(python: str, args: list[str]) -> Queued:
    return Queued(
        os.path.join(os.getcwd(), "ipython (interactive).py"), _IPYTHON, args, python, "ipython"
    )


def _interpreter_of(program: str) -> str | None:
    """The Python a console script (``ipython``) runs on, as its ``#!`` line names it (a
    path, or ``/usr/bin/env python3`` as PATH finds it); None where it names none (the
    command then runs as it is)."""
    import re
    import shutil

    found = shutil.which(program)
    if found is None:
        raise UserError(f"{program}: not found on your PATH; give the interpreter's path")
    try:
        with open(found, "rb") as script:
            first = script.readline(4096)
    except OSError:
        return None
    match = re.fullmatch(rb"#!\s*(/\S+)(?:[ \t]+(\S+))?\s*", first)
    if match is None:
        return None
    named = match[1].decode("utf-8", "surrogateescape")
    argument = None if match[2] is None else match[2].decode("utf-8", "surrogateescape")
    if os.path.basename(named) == "env" and argument and re.fullmatch(_PYTHON, argument):
        return _python(argument)
    if re.fullmatch(_PYTHON, os.path.basename(named)) and argument is None:
        return named
    return None


def _module(python: str, module: str, args: list[str]) -> Queued:
    """``python -m MODULE``: a small script that runs the module as __main__, from the
    working directory (first on sys.path, as ``-m`` puts it)."""
    text = (
        f"# gq run: python -m {module}\nimport runpy\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )
    return Queued(
        os.path.join(os.getcwd(), f"{module} (python -m).py"), text.encode(), args, python, module
    )
