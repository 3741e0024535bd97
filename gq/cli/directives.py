"""``#GQ`` and ``#SBATCH`` directives: options in a script's first comment block (pure)."""

from __future__ import annotations

from gq.errors import UserError

PREFIXES = ("#GQ", "#SBATCH")


class Directive:
    """One directive line: its number, its options' tokens, and its prefix ("#GQ" or
    "#SBATCH"). Plain, as what every submission imports is (gq/cli/quick.py)."""

    __slots__ = ("line", "tokens", "prefix")

    def __init__(self, line: int, tokens: list[str], prefix: str):
        self.line = line
        self.tokens = tokens
        self.prefix = prefix

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Directive) and (self.line, self.tokens, self.prefix) == (
            other.line,
            other.tokens,
            other.prefix,
        )

    def __repr__(self) -> str:
        return f"Directive({self.line!r}, {self.tokens!r}, {self.prefix!r})"


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
        body = line[len(prefix) :]
        import shlex

        try:
            tokens = shlex.split(body, comments=prefix == "#SBATCH")
        except ValueError as exc:
            raise UserError(f"{source}:{number}: malformed {prefix} directive: {exc}") from None
        if not tokens or not tokens[0].startswith("-"):
            raise UserError(
                f"{source}:{number}: malformed {prefix} directive {line!r}: "
                f"expected options such as '{prefix} -t 1:00:00'"
            )
        found.append(Directive(number, tokens, prefix))
    return found
