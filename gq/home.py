"""Where gq keeps its state: the queue database, the script spool, sockets and logs.

Everything lives under one directory, ``GQ_HOME`` (default: the user's state directory,
``$XDG_STATE_HOME/gq`` or ``~/.local/state/gq``), created private (0700) on first use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def db(self) -> Path:
        return self.root / "gq.db"

    @property
    def migration_lock(self) -> Path:
        return self.root / "gq.db.lock"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def daemon_socket(self) -> Path:
        return self.root / "daemon.sock"

    @property
    def daemon_pidfile(self) -> Path:
        return self.root / "daemon.pid"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    def ensure(self) -> "Home":
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.spool.mkdir(mode=0o700, exist_ok=True)
        return self


def default_root() -> Path:
    if explicit := os.environ.get("GQ_HOME"):
        return Path(explicit).expanduser().absolute()
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "gq"


def home() -> Home:
    return Home(default_root()).ensure()
