"""``#GQ`` directives: options written in a script's first comment block (pure)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gq.errors import UserError

PREFIX = "#GQ"


@dataclass(frozen=True)
class Directive:
    line: int
    tokens: list[str]


def read(text: str, source: str) -> list[Directive]:
    """Directives from the leading block of comment and blank lines (after any shebang)."""
    found = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break
        if line.split(maxsplit=1)[0] != PREFIX:
            continue
        body = line[len(PREFIX):]
        try:
            tokens = shlex.split(body, comments=False)
        except ValueError as exc:
            raise UserError(f"{source}:{number}: malformed #GQ directive: {exc}") from None
        if not tokens or not tokens[0].startswith("-"):
            raise UserError(f"{source}:{number}: malformed #GQ directive {line!r}: "
                            "expected options such as '#GQ --mem 6G'")
        found.append(Directive(number, tokens))
    return found
