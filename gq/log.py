"""The daemon's and hosts' logs: one line per event, whatever a user put in a value it
quotes (a newline in a working directory would forge a line of its own)."""

from __future__ import annotations

import logging

from gq.validation import printable


class _OneLine(logging.Formatter):
    """Control characters in a message are written escaped; tracebacks stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))


def configure(who: str) -> None:
    """Log INFO and up to standard error, each line stamped and naming ``who``."""
    handler = logging.StreamHandler()
    handler.setFormatter(_OneLine(f"%(asctime)s {who} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
