"""What every command shares: asking the daemon, and printing its reports."""

from __future__ import annotations

import sys
from typing import Any

import typer

from gq import client, messages


def ask(request: Any, wait: float | None = None) -> Any:
    return client.ask(request, wait=wait)


def labels(texts: list[str]) -> list[str]:
    """Job ids as typed: checked here, so a typo never reaches (or starts) a daemon."""
    from gq.queue.arrays import parse_label

    return [parse_label(text) for text in texts]


def usage_message(exc: Exception) -> str:
    """The one-line message of a typer (click) usage error."""
    format_message = getattr(exc, "format_message", None)
    return format_message() if format_message is not None else str(exc)


def print_report(report: messages.Report) -> None:
    """Info lines to stdout, warnings and refusals to stderr; exit 2 if any was refused."""
    refused = False
    for line in report.lines:
        if line.level == messages.INFO:
            typer.echo(line.text)
        else:
            prefix = "gq: error: " if line.level == messages.REFUSED else "gq: "
            print(prefix + line.text, file=sys.stderr)
            refused |= line.level == messages.REFUSED
    if refused:
        raise typer.Exit(2)
