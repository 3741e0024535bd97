"""The ``gq`` command: a Slurm-like queue for one GPU node."""

from __future__ import annotations

import sys

import typer

from gq.cli import cancel, control, daemon, export, info, jobs, policy, simulate, submit
from gq.errors import UserError

app = typer.Typer(
    name="gq",
    help=(
        "gq: a Slurm-like job queue for one GPU node. Jobs that share a device stay resident "
        "and are swapped at every training iteration under the node's policy "
        "(fifo, srtf, fair, priority).\n\n"
        "Start with 'gq daemon start', then 'gq submit train.py' and 'gq status'. "
        "State lives in GQ_HOME (default ~/.local/state/gq)."
    ),
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

app.command("submit", help=submit.HELP,
            context_settings={"allow_interspersed_args": False})(submit.submit)
app.command("status")(jobs.status)
app.command("show")(jobs.show)
app.command("history")(jobs.history)
app.command("logs")(jobs.logs)
app.command("cancel")(cancel.cancel)
app.command("hold")(control.hold)
app.command("release")(control.release)
app.command("requeue")(control.requeue)
app.command("update")(control.update)
app.command("info")(info.info)
app.command("simulate")(simulate.simulate)
app.add_typer(policy.app, name="policy")
app.add_typer(daemon.app, name="daemon")
app.add_typer(export.app, name="export")


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; bad input is one line on stderr and exit code 2."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else argv
    try:
        result = command(args, prog_name="gq", standalone_mode=False)
    except UserError as exc:
        print(f"gq: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        print("gq: aborted", file=sys.stderr)
        return 1
    except typer.TyperException as exc:
        message = getattr(exc, "format_message", lambda: str(exc))()
        context = getattr(exc, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        print(f"gq: error: {message}{hint}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2))
    except BrokenPipeError:
        return 0
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
