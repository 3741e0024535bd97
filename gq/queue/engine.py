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
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from gq.home import Home
from gq.queue import settings

# The newest Alembic revision; a test keeps it equal to the head of migrations/.
HEAD_REVISION = "0022"
BUSY_TIMEOUT_MS = 60_000
# The daemon's page cache. SQLite's default, 2 MiB, filled only after thousands of jobs had
# passed (RSS rising by it long after start); the pages read again and again (pending and
# running jobs, their indexes, the newest events) fit in half of it, and a miss is a read
# from the kernel's page cache.
CACHE_KIB = 1024


class Database:
    def __init__(self, home: Home):
        self.home = home
        migrate(home)
        self.writes = 0  # transactions committed through write(): whether anything changed
        self._settings: dict[str, Any] | None = None  # as last read
        # The daemon's own connection: every transaction it makes runs on it (one at a
        # time: the daemon has one thread), its sessions joined to it through this engine.
        self._connection = _connect(home.db)
        self._sessions = sessionmaker(_joining_engine(self._connection), expire_on_commit=False)
        self._pending_changed: set[int] | None = None  # None: not watched yet

    def pending_changes(self) -> set[int] | None:
        """The ids of the jobs that were or became PENDING in a transaction on this
        connection since the last call (a rolled-back one's too: read again, they are as
        they were). None at the first call, which begins the watch: read them all."""
        if self._pending_changed is None:
            self._pending_changed = set()
            changed = self._pending_changed.add
            self._connection.create_function("gq_pending_changed", 1, changed)
            for statement in _WATCH_PENDING:
                self._connection.execute(statement)
            return None
        found = set(self._pending_changed)
        self._pending_changed.clear()
        return found

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        with self._transaction("BEGIN") as transaction:
            yield transaction

    @contextmanager
    def write(self) -> Iterator[Transaction]:
        with self._transaction("BEGIN IMMEDIATE") as transaction:
            yield transaction
        self.writes += 1
        if transaction.info.get(settings.CHANGED):
            self._settings = None

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[Transaction]:
        if self._connection.in_transaction:
            raise RuntimeError("a transaction inside another on the same connection")
        self._connection.execute(begin)
        transaction = Transaction(self._connection, self._sessions)
        try:
            yield transaction
        except BaseException:
            transaction.end(commit=False)
            raise
        transaction.end(commit=True)

    def settings(self) -> dict[str, Any]:
        """Every setting, as :func:`gq.queue.settings.get_all` reads them: read again only
        after a write through this object changed one (the daemon's every pass reads them,
        and only it writes the queue)."""
        if self._settings is None:
            with self.read() as session:
                self._settings = settings.get_all(session)
        return dict(self._settings)

    def close(self) -> None:
        self._connection.close()


# For type checkers a Transaction is the Session it answers as (see __getattr__).
if TYPE_CHECKING:
    _AnswersAsSession = Session
else:
    _AnswersAsSession = object


class Transaction(_AnswersAsSession):
    """One transaction on the database's connection. The statements on a job's path run on
    that connection directly (:class:`gq.queue.prepared.Prepared`: a SQLAlchemy session
    costs more than SQLite's work for them); everything else is a SQLAlchemy ``Session``'s,
    made on first use and joined to the same transaction, and this object answers as that
    session does (``transaction.get(Job, 3)``, ``transaction.scalars(...)``)."""

    def __init__(self, connection: sqlite3.Connection, sessions: sessionmaker):
        self.sqlite = connection
        self.info: dict[str, Any] = {}
        self._sessions = sessions
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = self._sessions()
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def end(self, commit: bool) -> None:
        """Commit (or roll back) the session's work and the connection's, as one."""
        try:
            if self._session is not None:
                if commit:
                    self._session.commit()  # commits the connection's transaction
                else:
                    self._session.rollback()
        finally:
            if self._session is not None:
                self._session.close()  # rolls back what a failed commit left
            if self.sqlite.in_transaction:
                self.sqlite.execute("COMMIT" if commit else "ROLLBACK")


# Temporary triggers: this connection's alone, so they cost the CLI's nothing and no
# schema holds them; the daemon is the queue's one writer.
_WATCH_PENDING = [
    "CREATE TEMP TRIGGER gq_pending_inserted AFTER INSERT ON main.jobs "
    "WHEN new.state = 'PENDING' BEGIN SELECT gq_pending_changed(new.id); END",
    "CREATE TEMP TRIGGER gq_pending_updated AFTER UPDATE ON main.jobs "
    "WHEN new.state = 'PENDING' OR old.state = 'PENDING' "
    "BEGIN SELECT gq_pending_changed(new.id); END",
    "CREATE TEMP TRIGGER gq_pending_deleted AFTER DELETE ON main.jobs "
    "WHEN old.state = 'PENDING' BEGIN SELECT gq_pending_changed(old.id); END",
]


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions begin where gq says, not before each statement
    connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    for pragma in (
        "journal_mode=WAL",
        "synchronous=NORMAL",
        f"busy_timeout={BUSY_TIMEOUT_MS}",
        "foreign_keys=ON",
        f"cache_size=-{CACHE_KIB}",
    ):
        connection.execute(f"PRAGMA {pragma}")
    return connection


def _joining_engine(connection: sqlite3.Connection) -> Engine:
    """An engine whose one connection is ``connection``, whose transaction a
    :class:`Transaction` has begun: its sessions join it instead of beginning their own."""
    engine = create_engine(
        "sqlite://", creator=lambda: connection, poolclass=StaticPool, pool_reset_on_return=None
    )

    @event.listens_for(engine, "begin")
    def _on_begin(sa_connection) -> None:
        if not connection.in_transaction:  # a session used after its transaction ended
            raise RuntimeError("a session used outside its transaction")

    engine.connect().close()  # SQLAlchemy's first connect rolls back: here, not in one
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

    # In one transaction, so one sync to disk: the driver would commit each CREATE on its
    # own (dozens of syncs, tenths of a second at every first start on a busy disk).
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # transactions begin where we say

    @event.listens_for(engine, "begin")
    def _on_begin(sa_connection) -> None:
        sa_connection.exec_driver_sql("BEGIN")

    with engine.begin() as connection:
        Base.metadata.create_all(connection)
        connection.exec_driver_sql(
            "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT "
            "NULL, CONSTRAINT alembic_version_pkc PRIMARY KEY "
            "(version_num))"
        )
        connection.exec_driver_sql("INSERT INTO alembic_version VALUES (?)", (HEAD_REVISION,))
    engine.dispose()


def _upgrade(path: Path, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", f"sqlite:///{path}")
    command.upgrade(config, revision)
