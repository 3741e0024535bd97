"""The typer app: every command, or only the one a line names (building a command costs a
few times Python's own start-up, so only the module of the command being run is imported,
and ``gq --help`` loads them all)."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on every command

if TYPE_CHECKING:
    from typing import Any

    import typer

HELP = (
    "gq: a Slurm-like job queue for one GPU node. Jobs that share a device stay resident "
    "and are swapped at every training iteration under the node's policy "
    "(fifo, srtf, fair, priority, rr, deadline).\n\n"
    "Submit with 'gq submit train.py', watch with 'gq status'. On a shared node the "
    "commands talk to its system daemon (socket in /var/lib/gq, or GQ_SYSTEM_HOME); "
    "elsewhere each user's own daemon starts on the first command, its state in GQ_HOME "
    "(default ~/.local/state/gq).\n\n"
    "Exit status: 0 done; 1 the daemon could not be reached; 2 a refused request (bad "
    "input, no permission, a job in the wrong state), nothing changed."
)

# name -> (module in gq.cli, attribute, is a group of subcommands)
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "submit": ("submit", "submit", False),
    "run": ("submit", "submit", False),
    "status": ("jobs", "status", False),
    "show": ("jobs", "show", False),
    "history": ("jobs", "history", False),
    "logs": ("logs", "logs", False),
    "wait": ("wait", "wait", False),
    "cancel": ("cancel", "cancel", False),
    "hold": ("control", "hold", False),
    "release": ("control", "release", False),
    "requeue": ("control", "requeue", False),
    "update": ("control", "update", False),
    "suspend": ("control", "suspend", False),
    "drain": ("control", "drain", False),
    "resume": ("control", "resume", False),
    "info": ("info", "info", False),
    "top": ("top", "top", False),
    "simulate": ("simulate", "simulate", False),
    "policy": ("policy", "app", True),
    "daemon": ("daemon", "app", True),
    "export": ("export", "app", True),
    "kernel": ("kernel", "app", True),
}
_EXTRA = {
    name: {"context_settings": {"allow_interspersed_args": False}} for name in ("submit", "run")
}


def _version(value: bool) -> None:
    if value:
        import typer

        from gq import __version__, defaults

        typer.echo(f"gq {__version__} (protocol {defaults.PROTOCOL_VERSION})")
        raise typer.Exit()


def make_app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or with ``only`` that one."""
    import typer

    app = typer.Typer(
        name="gq",
        help=HELP,
        add_completion=True,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    @app.callback()
    def _root(
        version: bool = typer.Option(
            False,
            "--version",
            "-V",
            is_eager=True,
            callback=_version,
            help="Print gq's version and exit.",
        ),
    ) -> None:
        pass

    for name, (module_name, attribute, group) in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(f"gq.cli.{module_name}")
        target = getattr(module, attribute)
        if group:
            app.add_typer(target, name=name)
        else:
            extra: dict[str, Any] = dict(_EXTRA.get(name, {}))
            if doc := getattr(module, f"{name.upper()}_HELP", None):
                extra["help"] = doc
            app.command(name, **extra)(target)
    return app


def invoked_in(args: list[str]) -> str | None:
    """The command named on the line, when it is the first argument and a known one."""
    return args[0] if args and args[0] in COMMANDS else None


_BUILT: dict[str | None, Any] = {}


def command(invoked: str | None):
    """The click command for the app with ``invoked`` (or every command): built once a
    process, since building one costs more than most commands take to run (a script that
    calls main() in a loop, the tests)."""
    if invoked not in _BUILT:
        import typer

        _BUILT[invoked] = typer.main.get_command(make_app(invoked))
    return _BUILT[invoked]
