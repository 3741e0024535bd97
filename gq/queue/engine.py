"""The queue database: SQLite in WAL mode, migrated to the current schema on open.

Writers begin with ``BEGIN IMMEDIATE`` so that SQLite's busy timeout, not an error,
resolves contention between the CLI and the daemon; readers use plain deferred
transactions and never block writers (WAL).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from gq.home import Home
from gq.queue import settings

# The newest Alembic revision; a test keeps it equal to the head of migrations/.
HEAD_REVISION = "0011"
BUSY_TIMEOUT_MS = 60_000


class Database:
    def __init__(self, home: Home):
        self.home = home
        migrate(home)
        self.engine = _engine(home.db)
        self.writes = 0  # transactions committed through write(): whether anything changed
        self._settings: dict[str, Any] | None = None  # as last read
        self._read = sessionmaker(self.engine, expire_on_commit=False)
        self._write = sessionmaker(
            self.engine.execution_options(gq_immediate=True), expire_on_commit=False
        )

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._write() as session:
            with session.begin():
                yield session
            self.writes += 1
            if session.info.get(settings.CHANGED):
                self._settings = None

    def settings(self) -> dict[str, Any]:
        """Every setting, as :func:`gq.queue.settings.get_all` reads them: read again only
        after a write through this object changed one (the daemon's every pass reads them,
        and only it writes the queue)."""
        if self._settings is None:
            with self.read() as session:
                self._settings = settings.get_all(session)
        return dict(self._settings)

    def close(self) -> None:
        self.engine.dispose()


def _engine(path: Path) -> Engine:
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's begin event issues BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection) -> None:
        immediate = connection.get_execution_options().get("gq_immediate")
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def current_revision(path: Path) -> str | None:
    if not path.exists():
        return None
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        return connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    except (sqlite3.OperationalError, TypeError):
        return None
    finally:
        connection.close()


def migrations_dir() -> Path:
    import gq

    source_tree = Path(gq.__file__).resolve().parent.parent / "migrations"
    if (source_tree / "env.py").exists():
        return source_tree
    import gq.migrations

    return Path(gq.migrations.__file__).parent


def migrate(home: Home, revision: str = "head") -> None:
    """Bring the database to ``revision``, creating it if needed. Cheap when already there;
    a new database at head is made from the models at once (a test keeps the two schemas
    equal), an existing one is upgraded by Alembic."""
    if revision == "head" and current_revision(home.db) == HEAD_REVISION:
        return
    with open(home.migration_lock, "a") as lock:
        os.chmod(home.migration_lock, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if revision == "head" and current_revision(home.db) == HEAD_REVISION:
            return
        if revision == "head" and not home.db.exists():
            _create(home.db)
        else:
            _upgrade(home.db, revision)
        os.chmod(home.db, 0o600)  # root's database in system mode: the daemon alone reads it
        connection = sqlite3.connect(home.db)
        connection.execute("PRAGMA journal_mode=WAL")  # persistent: set once, at creation
        connection.close()


def _create(path: Path) -> None:
    """A new database at the head revision, built from the models."""
    from gq.queue.models import Base

    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as connection:
        Base.metadata.create_all(connection)
        connection.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT "
                                   "NULL, CONSTRAINT alembic_version_pkc PRIMARY KEY "
                                   "(version_num))")
        connection.exec_driver_sql("INSERT INTO alembic_version VALUES (?)", (HEAD_REVISION,))
    engine.dispose()


def _upgrade(path: Path, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{path}")
    command.upgrade(config, revision)
