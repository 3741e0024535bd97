"""gq status without typer: importing typer takes longer than the whole command otherwise.

A command line this module reads completely (known options, values where they belong, no
help, no completion) runs from here; any other, typos included, goes to typer, which
parses it again and gives its usual help and errors. The options are the same as the typer
command's (tests/test_cli_quick.py holds the two to each other), so both read a line alike.
"""

from __future__ import annotations

import enum
import os
from typing import Any


class Kind(enum.Enum):
    FLAG = "flag"  # --json
    VALUE = "value"  # -o FORMAT (the last one given counts)
    LIST = "list"  # -u USER, once for each
    COUNT = "count"  # --limit N: an integer, 0 or more


# option -> (the typer parameter it sets, its kind), per command
OPTIONS: dict[str, dict[str, tuple[str, Kind]]] = {
    "status": {
        "-a": ("all_jobs", Kind.FLAG), "--all": ("all_jobs", Kind.FLAG),
        "--json": ("json_out", Kind.FLAG),
        "-u": ("user", Kind.LIST), "--user": ("user", Kind.LIST),
        "-t": ("state", Kind.LIST), "--state": ("state", Kind.LIST),
        "-o": ("format_spec", Kind.VALUE), "--format": ("format_spec", Kind.VALUE),
        "-S": ("sort_spec", Kind.VALUE), "--sort": ("sort_spec", Kind.VALUE),
        "--limit": ("limit", Kind.COUNT),
        "--start": ("start", Kind.FLAG),
        "-l": ("long", Kind.FLAG), "--long": ("long", Kind.FLAG),
    },
}


def parse(args: list[str], options: dict[str, tuple[str, Kind]]) -> dict[str, Any] | None:
    """The parameters a command line gives, every one of ``options`` present (False or None
    where not given); None for a line this parser leaves to typer."""
    params: dict[str, Any] = {name: False if kind is Kind.FLAG else None
                              for name, kind in options.values()}
    rest = list(args)
    while rest:
        token = rest.pop(0)
        option, value = _split(token, options)
        if option is None:
            return None
        name, kind = options[option]
        if kind is Kind.FLAG:
            if value is not None:
                return None
            params[name] = True
            continue
        if value is None:
            if not rest:
                return None
            value = rest.pop(0)  # whatever it is, as click takes it: -S -p,i
        if kind is Kind.COUNT:
            try:
                params[name] = int(value)  # as click reads it
            except ValueError:
                return None
            if params[name] < 0:
                return None
        elif kind is Kind.LIST:
            params[name] = [*(params[name] or []), value]
        else:
            params[name] = value
    return params


def _split(token: str, options: dict[str, tuple[str, Kind]]) -> tuple[str | None, str | None]:
    """A token as (option, value attached to it): --format=%i, -uroot, or the option alone."""
    if token in options:
        return token, None
    if token.startswith("--") and "=" in token:
        option, value = token.split("=", 1)
        return (option, value) if option in options else (None, None)
    option = token[:2]
    if (not token.startswith("--") and option in options
            and options[option][1] is not Kind.FLAG):
        return option, token[2:]
    return None, None


def run(args: list[str]) -> bool:
    """Run the command line here if this module reads it (True), else leave it (False)."""
    if not args or args[0] not in OPTIONS or "_GQ_COMPLETE" in os.environ:
        return False
    params = parse(args[1:], OPTIONS[args[0]])
    if params is None:
        return False
    from gq.cli import listing

    listing.status(**params)
    return True
