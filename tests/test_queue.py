"""The queue database: guarded transitions, migrations, permissions."""

from __future__ import annotations

import sqlite3
import stat

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from gq.home import Home
from gq.queue import engine, queries, transitions
from gq.queue.engine import HEAD_REVISION, Database, migrate, migrations_dir
from gq.queue.states import JobState


def _new_job(name="j") -> transitions.NewJob:
    return transitions.NewJob(name=name, user="u", uid=1000, gid=1000, script="/x.sh", args=[],
                              interpreter=None,
                              workdir="/tmp", output_pattern="o", error_pattern="o", env={})


@pytest.fixture
def db(tmp_path) -> Database:
    database = Database(Home(tmp_path / "h").ensure())
    yield database
    database.close()


def _add(db, name="j") -> int:
    with db.write() as session:
        return transitions.submit(session, _new_job(name), lambda p, job: f"{p}-{job.id}")[0].id


def test_head_revision_constant_matches_migrations():
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    assert ScriptDirectory.from_config(config).get_current_head() == HEAD_REVISION


def test_transitions_are_guarded_and_recorded(db):
    job_id = _add(db)
    with db.write() as session:
        assert transitions.start(session, job_id, "cpu", 0)
        assert not transitions.start(session, job_id, "cpu", 0)  # never twice
        assert not transitions.cancel_pending(session, job_id, "late")
        assert transitions.finish(session, job_id, JobState.COMPLETED, 0, None)
        assert not transitions.finish(session, job_id, JobState.FAILED, 1, "again")
    with db.read() as session:
        job = queries.job(session, job_id)
        events = [(e.old_state, e.new_state) for e in queries.events(session, job_id)]
    assert job.state == "COMPLETED" and job.exit_code == 0 and job.run_count == 1
    assert events == [(None, "PENDING"), ("PENDING", "RUNNING"), ("RUNNING", "COMPLETED")]


def test_cancel_race_only_one_side_wins(db):
    job_id = _add(db)
    with db.write() as session:
        assert transitions.cancel_pending(session, job_id, "cancelled by user")
        assert not transitions.start(session, job_id, "cpu", 0)


def test_files_are_private(tmp_path):
    home = Home(tmp_path / "private").ensure()
    Database(home).close()
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(home.db.stat().st_mode) == 0o600


def test_wal_mode(db):
    connection = sqlite3.connect(db.home.db)
    assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    connection.close()


def test_upgrade_from_first_revision_keeps_rows(tmp_path):
    """A database created at the first revision, holding rows in every table, upgrades
    to head with its data intact (each later revision must keep this passing)."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0001")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO jobs (id, name, user, state, priority, gpus, exclusive, requeue, script, "
        "spool_path, args, workdir, stdout_path, stderr_path, env, submit_time, "
        "cancel_requested, run_count, steps_done, attained, holds_lane) VALUES "
        "(7, 'old', 'ann', 'RUNNING', 3, 1, 0, 0, '/s.py', '/spool/s.py', '[]', '/w', "
        "'/w/o', '/w/o', '{}', 1.0, 1, 0, 0, 0.0, 0)")
    connection.execute(
        "INSERT INTO jobs (id, name, user, state, priority, gpus, exclusive, requeue, script, "
        "spool_path, args, workdir, stdout_path, stderr_path, env, submit_time, "
        "cancel_requested, run_count, steps_done, attained, holds_lane) VALUES "
        "(8, 'mine', 'root', 'COMPLETED', 0, 1, 0, 0, '/s.sh', '/spool/s.sh', '[]', '/w', "
        "'/w/o', '/w/o', '{}', 2.0, 0, 1, 0, 0.0, 0)")
    connection.execute("INSERT INTO job_events (job_id, time, new_state, reason) "
                       "VALUES (7, 1.0, 'PENDING', 'submitted')")
    connection.execute("INSERT INTO settings (key, value) VALUES ('policy', '\"srtf\"')")
    connection.commit()
    connection.close()
    database = Database(home)  # opening upgrades
    with database.read() as session:
        job = queries.job(session, 7)
        assert (job.name, job.user, job.priority, job.state) == ("old", "ann", 3, "RUNNING")
        assert job.stop_request == "cancel"  # 0002 carried the old cancel flag over
        assert job.array_job_id is None and not job.held and job.dependency is None
        # 0003: submitters by name (a name this machine does not know keeps none); 0004; 0005
        assert (job.uid, job.gid, job.umask, job.deadline) == (None, None, 0o022, None)
        assert job.mean_gap is None and job.mean_iteration is None
        mine = queries.job(session, 8)
        assert (mine.uid, mine.gid, mine.state) == (0, 0, "COMPLETED")
        assert [e.reason for e in queries.events(session, 7)] == ["submitted"]
        from gq.queue import settings

        assert settings.get(session, "policy") == "srtf"
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_opening_current_database_skips_alembic(db, monkeypatch):
    import alembic.command

    monkeypatch.setattr(alembic.command, "upgrade", lambda *a: pytest.fail("ran alembic"))
    Database(db.home).close()
