"""The ``gq`` command: a Slurm-like queue for one GPU node.

``gq status``, ``gq show``, ``gq submit`` and ``gq run`` run without typer where
:mod:`gq.cli.quick` reads their line; any other line goes to the typer app
(:mod:`gq.cli.app`), which builds only the command it names.
"""

from __future__ import annotations

import sys

from gq.cli import app, quick
from gq.errors import UserError


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input is one line on stderr and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    try:
        code = quick.run(args)
        return _with_typer(args) if code is None else code
    except UserError as exc:
        print(f"gq: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C: as typer ends on it, silently, 128 + SIGINT
        return 130


def _with_typer(args: list[str]) -> int:
    """The command line parsed, and run, by typer (click): usage errors as one line."""
    import typer

    command = app.command(app.invoked_in(args))
    try:
        result = command(args, prog_name="gq", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("gq: aborted", file=sys.stderr)
        return 1
    except typer.TyperException as exc:
        from gq.cli.common import usage_message

        message = usage_message(exc)
        context = getattr(exc, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        print(f"gq: error: {message}{hint}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
