"""``#GQ`` and ``#SBATCH`` directives: options in a script's first comment block (pure)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from gq.errors import UserError

PREFIXES = ("#GQ", "#SBATCH")


@dataclass(frozen=True)
class Directive:
    line: int
    tokens: list[str]
    prefix: str  # "#GQ" or "#SBATCH"


def read(text: str, source: str) -> list[Directive]:
    """Directives from the leading block of comment and blank lines (after any shebang)."""
    found = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("#"):
            break
        prefix = line.split(maxsplit=1)[0]
        if prefix not in PREFIXES:
            continue
        body = line[len(prefix):]
        try:
            tokens = shlex.split(body, comments=prefix == "#SBATCH")
        except ValueError as exc:
            raise UserError(f"{source}:{number}: malformed {prefix} directive: {exc}") from None
        if not tokens or not tokens[0].startswith("-"):
            raise UserError(f"{source}:{number}: malformed {prefix} directive {line!r}: "
                            f"expected options such as '{prefix} -t 1:00:00'")
        found.append(Directive(number, tokens, prefix))
    return found
