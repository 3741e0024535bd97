"""The queue database: guarded transitions, migrations, permissions."""

from __future__ import annotations

import os
import sqlite3
import stat
import time

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import update

from gq.daemon.serving.handlers.common import job_info
from gq.exec.host.messages import JobProgress
from gq.home import Home
from gq.messages import MemoryBasis
from gq.queue import (
    engine,
    job_updates,
    lookups,
    purging,
    queries,
    scheduling_rows,
    spool_usage,
    stats,
    submissions,
    transitions,
)
from gq.queue.engine import HEAD_REVISION, Database, migrate, migrations_dir
from gq.queue.models import Job
from gq.queue.states import JobState


def _new_job(name="j") -> submissions.NewJob:
    return submissions.NewJob(
        name=name,
        user="u",
        uid=1000,
        gid=1000,
        script="/x.sh",
        args=[],
        interpreter=None,
        workdir="/tmp",
        output_pattern="o",
        error_pattern="o",
        env={},
    )


@pytest.fixture
def db(tmp_path) -> Database:
    database = Database(Home(tmp_path / "h").ensure())
    yield database
    database.close()


def _add(db, name="j", snapshot=lambda job_id: "") -> int:
    with db.write() as session:
        return submissions.submit(session, _new_job(name), lambda p, i, a, t: f"{p}-{i}", snapshot)[
            0
        ]


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
        job = lookups.job(session, job_id)
        events = [(e.old_state, e.new_state) for e in lookups.events(session, [job_id])[job_id]]
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
        "'/w/o', '/w/o', '{}', 1.0, 1, 0, 0, 0.0, 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, state, priority, gpus, exclusive, requeue, script, "
        "spool_path, args, workdir, stdout_path, stderr_path, env, submit_time, "
        "cancel_requested, run_count, steps_done, attained, holds_lane) VALUES "
        "(8, 'mine', 'root', 'COMPLETED', 0, 1, 0, 0, '/s.sh', '/spool/s.sh', '[]', '/w', "
        "'/w/o', '/w/o', '{}', 2.0, 0, 1, 0, 0.0, 0)"
    )
    connection.execute(
        "INSERT INTO job_events (job_id, time, new_state, reason) "
        "VALUES (7, 1.0, 'PENDING', 'submitted')"
    )
    connection.execute("INSERT INTO settings (key, value) VALUES ('policy', '\"srtf\"')")
    connection.commit()
    connection.close()
    database = Database(home)  # opening upgrades
    with database.read() as session:
        job = lookups.job(session, 7)
        assert (job.name, job.user, job.priority, job.state) == ("old", "ann", 3, "RUNNING")
        assert job.stop_request == "cancel"  # 0002 carried the old cancel flag over
        assert job.array_job_id is None and not job.held and job.dependency is None
        # 0003: submitters by name (a name this machine does not know keeps none); 0004; 0005
        assert (job.uid, job.gid, job.umask, job.deadline) == (None, None, 0o022, None)
        assert job.mean_gap is None and job.mean_iteration is None
        mine = lookups.job(session, 8)
        assert (mine.uid, mine.gid, mine.state) == (0, 0, "COMPLETED")
        assert [e.reason for e in lookups.events(session, [7])[7]] == ["submitted"]
        from gq.queue import settings

        assert settings.get(session, "policy") == "srtf"
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_opening_current_database_skips_alembic(db, monkeypatch):
    import alembic.command

    monkeypatch.setattr(alembic.command, "upgrade", lambda *a: pytest.fail("ran alembic"))
    Database(db.home).close()


def test_upgrade_to_0006_moves_payloads_and_clears_what_no_valid_gq_writes(tmp_path):
    """Rows an older gq stored: an array's tasks and a plain job, each with its own copy of
    its environment and arguments, and values a hostile worker or client got in."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0005")
    connection = sqlite3.connect(home.db)
    columns = (
        "id, name, user, state, priority, gpus, exclusive, requeue, script, spool_path, "
        "args, workdir, stdout_path, stderr_path, env, submit_time, run_count, "
        "steps_done, attained, holds_lane, array_job_id, array_task_id, held, "
        "mem_persistent, deadline, mean_iteration"
    )
    rows = [
        (
            1,
            "arr",
            "ann",
            "PENDING",
            0,
            1,
            0,
            0,
            "/s.sh",
            "/sp/1/s.sh",
            '["--lr", "3"]',
            "/w",
            "/w/o",
            "/w/o",
            '{"A": "1"}',
            1.0,
            0,
            0,
            0.0,
            0,
            1,
            0,
            0,
            None,
            None,
            None,
        ),
        (
            2,
            "arr",
            "ann",
            "PENDING",
            0,
            1,
            0,
            0,
            "/s.sh",
            "/sp/1/s.sh",
            '["--lr", "3"]',
            "/w",
            "/w/o",
            "/w/o",
            '{"A": "1"}',
            1.0,
            0,
            0,
            0.0,
            0,
            1,
            1,
            0,
            None,
            None,
            None,
        ),
        (
            3,
            "bad\x00name",
            "bob",
            "RUNNING",
            0,
            1,
            0,
            0,
            "/t.py",
            "/sp/3/t.py",
            "not json",
            "/w",
            "/w/o",
            "/w/o",
            '{"B": "2"}',
            2.0,
            1,
            0,
            0.0,
            0,
            None,
            None,
            0,
            "abc",
            1e21,
            float("inf"),
        ),
    ]
    connection.executemany(f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' * 26)})", rows)
    connection.commit()
    connection.close()
    database = Database(home)  # opening upgrades
    with database.read() as session:
        first, second, bad = (lookups.job(session, i) for i in (1, 2, 3))
        assert first.payload_id == second.payload_id  # an array's tasks share one
        assert (first.args, lookups.payload(session, first.payload_id).env) == (
            ["--lr", "3"],
            {"A": "1"},
        )
        assert bad.args == [] and lookups.payload(session, bad.payload_id).env == {"B": "2"}
        assert (bad.name, bad.mem_persistent, bad.deadline, bad.mean_iteration) == (
            "bad?name",
            None,
            None,
            None,
        )
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.write() as session:  # purged ids are never given again
        purging.purge(session, [3])
    assert _add(database) == 4
    database.close()


def test_upgrade_to_0007_measures_the_snapshots_kept(tmp_path):
    """Submissions from before the spool bound get their snapshot's size from the disk, so
    that what a user keeps counts from the first submit after the upgrade."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0006")
    kept = tmp_path / "spool-7" / "s.sh"
    kept.parent.mkdir()
    kept.write_bytes(b"x" * 1234)
    connection = sqlite3.connect(home.db)
    connection.executemany(
        "INSERT INTO payloads (id, env, args) VALUES (?, '{}', '[]')", [(1,), (2,)]
    )
    columns = (
        "id, name, user, state, priority, gpus, exclusive, requeue, script, spool_path, "
        "workdir, stdout_path, stderr_path, submit_time, run_count, steps_done, "
        "attained, holds_lane, held, payload_id, array_job_id, array_task_id, uid"
    )
    rows = [
        (
            7,
            "a",
            "ann",
            "PENDING",
            0,
            1,
            0,
            0,
            "/s.sh",
            str(kept),
            "/w",
            "/w/o",
            "/w/o",
            1.0,
            0,
            0,
            0.0,
            0,
            0,
            1,
            7,
            0,
            1000,
        ),
        (
            8,
            "a",
            "ann",
            "PENDING",
            0,
            1,
            0,
            0,
            "/s.sh",
            str(kept),
            "/w",
            "/w/o",
            "/w/o",
            1.0,
            0,
            0,
            0.0,
            0,
            0,
            1,
            7,
            1,
            1000,
        ),
        (
            9,
            "b",
            "ann",
            "COMPLETED",
            0,
            1,
            0,
            0,
            "/t.sh",
            "/gone/9/t.sh",
            "/w",
            "/w/o",
            "/w/o",
            2.0,
            1,
            0,
            0.0,
            0,
            0,
            2,
            None,
            None,
            1000,
        ),
    ]
    connection.executemany(f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' * 23)})", rows)
    connection.commit()
    connection.close()
    database = Database(home)
    with database.read() as session:
        assert [j.id for j in queries.jobs(session)] == [7, 8, 9]
        assert lookups.payload(session, 1).spool_bytes == 3 * 4096  # an array counts once
        assert lookups.payload(session, 2).spool_bytes == 0  # its snapshot is gone
        assert spool_usage.spool_bytes(session, 1000) == 3 * 4096
        assert [tuple(r) for r in spool_usage.finished_snapshots(session, 1000)] == []
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_a_snapshot_costs_its_blocks_and_two_inodes_even_when_empty():
    from gq.queue import spool

    assert [spool.footprint(n) for n in (0, 1, 4096, 4097)] == [8192, 12288, 12288, 16384]


def test_purge_forgets_old_finished_jobs_but_what_pending_jobs_depend_on(db):
    from gq.daemon import retention
    from gq.queue import spool

    def snapshot(job_id: int) -> str:
        return str(spool.snapshot(db.home, job_id, "s.sh", b"true\n"))

    old, needed = (_add(db, name, snapshot) for name in ("old", "needed"))
    recent = _add(db, "recent")
    waiting = _add(db, "waiting")
    with db.write() as session:
        for job_id, end in ((old, 100.0), (needed, 100.0), (recent, 990.0)):
            assert transitions.start(session, job_id, "cpu", 0, now=end - 1)
            assert transitions.finish(session, job_id, JobState.COMPLETED, 0, None, now=end)
        lookups.job(session, waiting).dependency = f"afterok:{needed}"
    assert retention.purge(db, db.home, retention=500.0, now=1000.0) == 1
    with db.read() as session:
        assert [j.id for j in queries.jobs(session)] == [needed, recent, waiting]
        assert lookups.events(session, [old]) == {old: []}
    assert not spool.job_dir(db.home, old).exists() and spool.job_dir(db.home, needed).exists()
    assert sqlite3.connect(db.home.db).execute("SELECT count(*) FROM payloads").fetchone() == (3,)


def test_a_new_database_has_the_schema_the_migrations_build(tmp_path):
    """New databases are made from the models at once; old ones are upgraded by Alembic:
    both must end with the same tables, columns, keys and indexes."""

    def schema(path) -> dict:
        connection = sqlite3.connect(path)
        tables = [
            name
            for (name,) in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        found = {}
        for table in tables:
            columns = connection.execute(f"PRAGMA table_info({table})").fetchall()
            keys = connection.execute(f"PRAGMA foreign_key_list({table})").fetchall()
            indexes = {
                (
                    name,
                    unique,
                    tuple(c[2] for c in connection.execute(f"PRAGMA index_info({name})")),
                )
                for _, name, unique, *_ in connection.execute(f"PRAGMA index_list({table})")
                if not name.startswith("sqlite_autoindex")
            }
            found[table] = (
                sorted((c[1], c[2].upper(), c[3], c[5]) for c in columns),
                sorted((k[2], k[3], k[4], k[6]) for k in keys),
                indexes,
            )
        autoincrement = connection.execute(
            "SELECT sql LIKE '%AUTOINCREMENT%' FROM sqlite_master WHERE name = 'jobs'"
        ).fetchone()
        connection.close()
        return {"tables": found, "autoincrement": autoincrement}

    fresh = Home(tmp_path / "fresh").ensure()
    migrate(fresh)
    upgraded = Home(tmp_path / "upgraded").ensure()
    migrate(upgraded, "0001")
    migrate(upgraded)
    assert engine.current_revision(fresh.db) == engine.current_revision(upgraded.db)
    assert schema(fresh.db) == schema(upgraded.db)


def test_a_discarded_snapshot_keeps_no_blocks_for_whoever_holds_it_open(db):
    """A job's descriptor 3, passed on to another process, would keep a deleted snapshot's
    blocks on the state disk where --max-spool no longer counts them."""
    from gq.queue import spool

    path = spool.snapshot(db.home, 41, "s.sh", b"x" * 100_000)
    held = os.open(path, os.O_RDONLY)
    try:
        spool.discard(db.home, 41)
        assert not path.exists() and os.fstat(held).st_size == 0
    finally:
        os.close(held)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (gives files to another uid)")
def test_snapshots_of_an_older_gq_become_the_daemons_own(db):
    from gq.queue import spool

    old = db.home.spool / "42"
    old.mkdir(mode=0o711)
    (old / "s.sh").write_text("echo old\n")
    os.chown(old / "s.sh", 65534, 65534)
    os.chmod(old / "s.sh", 0o500)
    assert spool.make_private(db.home) == 1
    assert (stat.S_IMODE(old.stat().st_mode), old.stat().st_uid) == (0o700, 0)
    assert (stat.S_IMODE((old / "s.sh").stat().st_mode), (old / "s.sh").stat().st_uid) == (0o555, 0)
    assert spool.make_private(db.home) == 0


def test_what_the_spool_keeps_per_user_is_tallied_through_submit_drop_and_purge(db):
    """A submit reads one row for --max-spool: the tally must equal the sum over the
    user's payloads however they come and go (an array counts once)."""
    from dataclasses import replace

    def submit(uid: int, size: int, tasks=None) -> list[int]:
        new = replace(_new_job("s"), uid=uid, gid=uid, spool_bytes=size, array_tasks=tasks)
        with db.write() as session:
            return submissions.submit(session, new, lambda p, i, a, t: f"{p}-{i}")

    def recomputed(uid: int) -> int:
        connection = sqlite3.connect(db.home.db)
        row = connection.execute(
            "SELECT coalesce(sum(spool_bytes), 0) FROM payloads WHERE id IN "
            "(SELECT payload_id FROM jobs WHERE uid = ?)",
            (uid,),
        ).fetchone()
        connection.close()
        return row[0]

    alice = [submit(1001, 8192), submit(1001, 12288, tasks=(0, 1, 2)), submit(1001, 16384)]
    bob = submit(1002, 8192)
    with db.read() as session:
        assert spool_usage.spool_bytes(session, 1001) == 8192 + 12288 + 16384 == recomputed(1001)
        assert spool_usage.spool_bytes(session, 1002) == 8192
    with db.write() as session:
        first = lookups.job(session, alice[0][0]).payload_id
        spool_usage.drop_snapshots(session, 1001, [first])
    with db.read() as session:
        assert spool_usage.spool_bytes(session, 1001) == 12288 + 16384 == recomputed(1001)
    with db.write() as session:
        purging.purge(session, alice[1][:2])  # the array's payload is still used
    with db.read() as session:
        assert spool_usage.spool_bytes(session, 1001) == 12288 + 16384
    with db.write() as session:
        purging.purge(session, alice[1][2:] + alice[2] + bob)
    with db.read() as session:
        assert spool_usage.spool_bytes(session, 1001) == 0 == recomputed(1001)
        assert spool_usage.spool_bytes(session, 1002) == 0


def test_upgrade_to_0008_keeps_jobs_with_no_sbatch_extras(tmp_path):
    """Jobs from before host memory, CPUs, GPU types, begin times and kept output patterns
    come through with none of them (no limit, any device, patterns rebuilt on export)."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0007")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[\"--lr\"]', 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, state, priority, gpus, mem, exclusive, requeue, "
        "script, spool_path, workdir, stdout_path, stderr_path, submit_time, run_count, "
        "steps_done, attained, holds_lane, held, payload_id, uid) VALUES (5, 'run12', 'ann', "
        "'PENDING', 0, 1, 1024, 0, 0, '/s.sh', '', '/w', '/w/run12-5.out', '/w/run12-5.out', "
        "1.0, 0, 0, 0.0, 0, 0, 1, 1000)"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    with database.read() as session:
        job = lookups.job(session, 5)
        assert (job.name, job.mem, job.args, job.stdout_path) == (
            "run12",
            1024,
            ["--lr"],
            "/w/run12-5.out",
        )
        assert (
            job.host_mem,
            job.cpus,
            job.gpu_type,
            job.begin_time,
            job.output_pattern,
            job.error_pattern,
        ) == (None,) * 6
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_upgrade_to_0009_keeps_jobs_unpinned_without_retries(tmp_path):
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0008")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[]', 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, state, priority, gpus, exclusive, requeue, script, "
        "spool_path, workdir, stdout_path, stderr_path, submit_time, run_count, steps_done, "
        "attained, holds_lane, held, payload_id, uid, host_mem, warn_signal) VALUES (4, 'a', "
        "'ann', 'FAILED', 0, 1, 0, 0, '/s.sh', '', '/w', '/w/o', '/w/o', 1.0, 1, 0, 0.0, 0, 0, "
        "1, 1000, 1048576, 'B:10@60')"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    with database.read() as session:
        job = lookups.job(session, 4)
        assert (job.host_mem, job.warn_signal, job.state) == (1 << 20, "B:10@60", "FAILED")
        assert (job.nodelist, job.retries, job.retries_left, job.retry_delay, job.ntasks) == (
            None,
        ) * 5
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def _finished_jobs(home: Home, rows: list[dict]) -> None:
    """Finished jobs written into an older revision's queue: each row's values over those of
    a completed job of ann's, with one payload for all."""
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[]', 0)"
    )
    for values in rows:
        row = dict(
            name="a",
            user="ann",
            state="COMPLETED",
            priority=0,
            gpus=1,
            exclusive=0,
            requeue=0,
            script="/s.sh",
            spool_path="",
            workdir="/w",
            stdout_path="/w/o",
            stderr_path="/w/o",
            submit_time=1.0,
            run_count=1,
            steps_done=0,
            attained=0.0,
            holds_lane=0,
            held=0,
            payload_id=1,
            uid=1000,
            suspended=0,
        )
        row.update(values)
        connection.execute(
            f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
            list(row.values()),
        )
    connection.commit()
    connection.close()


def test_upgrade_to_0011_indexes_end_times_and_keeps_finished_jobs(tmp_path):
    """History reads finished jobs by end time: a queue from before gets the index, its
    jobs intact (one without an end time gets one) and paged, the last ended first."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0010")
    _finished_jobs(
        home,
        [
            dict(id=job_id, end_time=end)
            for job_id, end in ((3, 10.0), (4, 30.0), (5, 20.0), (6, None))
        ],
    )
    database = Database(home)
    indexes = {row[1] for row in sqlite3.connect(home.db).execute("PRAGMA index_list(jobs)")}
    assert "ix_jobs_end_time" in indexes
    with database.read() as session:
        assert lookups.job(session, 6).end_time == 1.0  # a first version's: its submission
        page, older = queries.finished_page(session, [JobState.COMPLETED], 2)
        assert ([job.id for job in page], older) == ([4, 5], (20.0, 5))  # the last ended first
        page, older = queries.finished_page(session, [JobState.COMPLETED], 2, before=older)
        assert ([job.id for job in page], older) == ([3, 6], None)
        page, _ = queries.finished_page(session, [JobState.COMPLETED], 5, ended_since=15.0)
        assert [job.id for job in page] == [4, 5]
        assert stats.oldest_end(session) == 1.0
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_upgrade_to_0012_indexes_a_users_runs_by_name_and_keeps_them(tmp_path):
    """Forecasts read a user's last completed jobs of one name: a queue from before gets the
    index, its jobs intact, and the read finds them by it, the last ended first."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0011")
    _finished_jobs(
        home,
        [
            dict(
                id=job_id,
                name=name,
                user=user,
                state=state,
                start_time=2.0,
                end_time=end,
                steps_done=job_id * 10,
                attained=1.5,
            )
            for job_id, name, user, state, end in (
                (3, "train", "ann", "COMPLETED", 10.0),
                (4, "train", "ann", "COMPLETED", 30.0),
                (5, "train", "ann", "FAILED", 40.0),
                (6, "train", "bob", "COMPLETED", 50.0),
                (7, "eval", "ann", "COMPLETED", 60.0),
            )
        ],
    )
    database = Database(home)
    indexes = {row[1] for row in sqlite3.connect(home.db).execute("PRAGMA index_list(jobs)")}
    assert "ix_jobs_user_name_end" in indexes
    plan = " ".join(
        str(row)
        for row in sqlite3.connect(home.db).execute(
            "EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE user = 'ann' AND name = 'train' "
            "AND end_time IS NOT NULL ORDER BY end_time DESC"
        )
    )
    assert "ix_jobs_user_name_end" in plan
    with database.read() as session:
        runs = stats.recent_runs(session, "ann", "train", 5)
        assert [(start, end, steps) for start, end, steps, *_ in runs] == [
            (2.0, 30.0, 40),
            (2.0, 10.0, 30),
        ]  # completed ones only, the last ended first
        assert len(stats.recent_runs(session, "ann", "train", 1)) == 1
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_upgrade_to_0013_keeps_jobs_and_reads_their_memory_as_declared(tmp_path):
    """Memory safety's columns: a queue from before keeps its jobs, each with no runs out
    of memory, requeued at an out-of-memory, and its --gpu-mem read as declared."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0012")
    _finished_jobs(
        home,
        [
            dict(id=3, mem=2 << 30, end_time=5.0),
            dict(id=4, mem=None, state="PENDING", end_time=None),
        ],
    )
    database = Database(home)
    with database.read() as session:
        declared, undeclared = lookups.job(session, 3), lookups.job(session, 4)
        assert (declared.mem, declared.mem_basis, declared.on_oom, declared.ooms) == (
            2 << 30,
            None,
            None,
            0,
        )
        assert (undeclared.state, undeclared.ooms) == ("PENDING", 0)
        info = job_info(declared, detail=False)
        assert (info.mem_basis.value, info.on_oom.value, info.ooms) == ("declared", "requeue", 0)
        assert job_info(undeclared, detail=False).mem_basis is None
    with database.write() as session:
        job_updates.set_memory_figure(session, 4, 300 << 20, MemoryBasis.MEASURED)
    with database.read() as session:
        assert (lookups.job(session, 4).mem, lookups.job(session, 4).mem_basis) == (
            300 << 20,
            "measured",
        )
    assert engine.current_revision(home.db) == HEAD_REVISION
    database.close()


def test_upgrade_to_0014_pages_history_by_end_time_for_all_and_for_one_user(tmp_path):
    """A page of finished jobs, the last ended first, comes from an end-time index (never a
    read and sort of every finished job, which cost a quarter of a second with 100,000
    kept): for everyone's, and, through the index the upgrade adds, for one user's. A few
    states are still found by the state index, and every page holds what it should."""
    from sqlalchemy import event

    home = Home(tmp_path / "old").ensure()
    migrate(home, "0013")
    _finished_jobs(
        home,
        [
            dict(id=job_id, user=user, state=state, end_time=end)
            for job_id, user, state, end in (
                (3, "ann", "COMPLETED", 10.0),
                (4, "bob", "FAILED", 30.0),
                (5, "ann", "COMPLETED", 20.0),
                (6, "ann", "CANCELLED", 40.0),
            )
        ],
    )
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    raw = sqlite3.connect(home.db)
    assert "ix_jobs_user_end" in {row[1] for row in raw.execute("PRAGMA index_list(jobs)")}
    finished = [state for state in JobState if state.terminal]
    plans: list[str] = []

    def explain(conn, cursor, statement, parameters, context, executemany):
        if "ORDER BY jobs.end_time DESC" in statement:
            plans.append(
                " ".join(
                    row[3] for row in raw.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
                )
            )

    with database.read() as session:
        event.listen(session.get_bind(), "before_cursor_execute", explain)
        try:
            pages = [
                queries.finished_page(session, finished, 2),
                queries.finished_page(session, finished, 2, before=(20.0, 5)),
                queries.finished_page(session, finished, 5, users=["ann"]),
                queries.finished_page(session, [JobState.FAILED], 5),
            ]
        finally:
            event.remove(session.get_bind(), "before_cursor_execute", explain)
    assert [([job.id for job in page], older) for page, older in pages] == [
        ([6, 4], (30.0, 4)),
        ([3], None),
        ([6, 5, 3], None),
        ([4], None),
    ]
    everyone, next_page, anns, failed = plans
    for plan in (everyone, next_page):
        assert "ix_jobs_end_time" in plan and "TEMP B-TREE" not in plan, plan
    assert "ix_jobs_user_end" in anns and "TEMP B-TREE" not in anns, anns
    assert "ix_jobs_state" in failed or "ix_jobs_user_state" in failed, failed
    raw.close()
    database.close()


def test_settings_are_read_again_after_a_write_that_changed_one(db):
    from gq.queue import settings

    assert db.settings()[settings.POLICY] == "fifo"
    with db.write() as session:
        settings.put(session, settings.POLICY, "srtf")
    assert db.settings()[settings.POLICY] == "srtf"
    with pytest.raises(RuntimeError), db.write() as session:  # rolled back: still srtf
        settings.put(session, settings.POLICY, "fair")
        raise RuntimeError
    assert db.settings()[settings.POLICY] == "srtf"
    db.settings()[settings.POLICY] = "rr"  # a copy: the kept settings do not change
    assert db.settings()[settings.POLICY] == "srtf"
    other = Database(db.home)  # another daemon's object reads the queue itself
    assert other.settings()[settings.POLICY] == "srtf"
    other.close()


def test_prepared_statements_read_and_write_what_sqlalchemy_would(db):
    from sqlalchemy import bindparam, insert, select

    from gq.queue.models import Job, Payload
    from gq.queue.prepared import Prepared

    first, second, third = (_add(db, name) for name in ("a", "b", "c"))
    with db.write() as session:
        assert transitions.start(session, second, "cpu", 0)
        job_updates.set_pending_reasons(session, {first: "Resources", third: None})
        submissions.submit(
            session,
            submissions.NewJob(
                **{
                    **_new_job("d").__dict__,
                    "env": {"K": "v w"},
                    "args": ["--x", "ü"],
                    "exclusive": True,
                    "held": True,
                }
            ),
            lambda p, i, a, t: "o",
        )
    by_ids = Prepared(
        select(Job.__table__)
        .where(Job.__table__.c.id.in_(bindparam("ids", expanding=True)))
        .order_by(Job.__table__.c.id)
    )
    payloads = Prepared(select(Payload.__table__).order_by(Payload.__table__.c.id))
    with db.read() as session:
        for ids in ([], [first], [first, second, third, first + 99], list(range(1, 5))):
            core = [
                tuple(row) for row in session.connection().execute(by_ids.statement, {"ids": ids})
            ]
            assert [tuple(row) for row in by_ids.rows(session, {"ids": ids})] == core
        assert [tuple(row) for row in payloads.rows(session)] == [
            tuple(row) for row in session.connection().execute(payloads.statement)
        ]
        held = scheduling_rows.for_scheduling(session, JobState.PENDING, held=True)
        pending = scheduling_rows.for_scheduling(session, JobState.PENDING, held=False)
        running = scheduling_rows.for_scheduling(session, JobState.RUNNING)
    assert [row.id for row in pending] == [first, third] and pending[0].reason == "Resources"
    assert running[0].id == second and running[0].held is False
    assert held[0].held is True and held[0].exclusive is True  # booleans, not 0 and 1
    with db.read() as session:
        assert session.get(Payload, 4).env == {"K": "v w"}
        assert session.get(Payload, 4).args == ["--x", "ü"]
    with pytest.raises(TypeError, match="every column with a default"):
        with db.write() as session:  # a default SQLAlchemy would fill in is refused
            Prepared(insert(Job.__table__)).execute(session, {"name": "x"})


def test_a_transaction_commits_or_rolls_back_prepared_and_session_work_as_one(db):
    from gq.queue import settings

    job_id = _add(db)
    with pytest.raises(RuntimeError, match="boom"):
        with db.write() as session:
            assert transitions.start(session, job_id, "cpu", 0)  # a prepared statement
            settings.put(session, settings.POLICY, "srtf")  # through the session
            raise RuntimeError("boom")
    with db.read() as session:
        assert lookups.job(session, job_id).state == JobState.PENDING.value
        assert settings.get(session, settings.POLICY) != "srtf"
        assert lookups.events(session, [job_id])[job_id][-1].new_state == "PENDING"
    writes = db.writes
    with db.write() as session:
        assert transitions.start(session, job_id, "cpu", 0)
        settings.put(session, settings.POLICY, "srtf")
    assert db.writes == writes + 1 and db.settings()[settings.POLICY] == "srtf"
    with db.read() as session:
        assert lookups.job(session, job_id).state == JobState.RUNNING.value
        with pytest.raises(RuntimeError, match="inside another"):
            with db.write():
                pass


def test_retries_and_lost_launches_move_jobs_through_kept_statements(db):
    job_id = _add(db)
    with db.write() as session:
        session.execute(
            update(Job).where(Job.id == job_id).values(retries=1, retries_left=1, retry_delay=30.0)
        )
    kept = None
    for _ in range(2):  # the second round reuses what the first compiled
        with db.write() as session:
            assert transitions.start(session, job_id, "cpu", 0, now=100.0)
            assert transitions.requeue(session, job_id, "launch lost", now=101.0, started=False)
            assert transitions.start(session, job_id, "cpu", 0, now=102.0)
            assert transitions.retry(session, job_id, 3, "failed", now=200.0)
            job = lookups.job(session, job_id)
            assert (job.state, job.run_count, job.retries_left, job.begin_time, job.exit_code) == (
                "PENDING",
                1,
                0,
                230.0,
                3,
            )
            assert transitions.start(session, job_id, "cpu", 0, now=300.0)
            assert not transitions.retry(session, job_id, 3, "failed", now=301.0)  # none left
            assert transitions.finish(session, job_id, JobState.FAILED, 3, "failed")
        with db.write() as session:  # a new session: the job as it is now, not as read
            assert transitions.requeue_finished(session, lookups.job(session, job_id))
            session.execute(update(Job).where(Job.id == job_id).values(run_count=0))
        assert kept in (None, len(transitions._kept))
        kept = len(transitions._kept)


def test_the_pending_rows_kept_between_passes_are_those_a_full_read_finds(db):
    """A pass reads again only the pending jobs a transaction changed: after each kind of
    change (submit, hold, release, update, reasons, start, requeue, cancel, a rolled-back
    one), what it keeps is exactly what reading them all finds."""
    kept = scheduling_rows.PendingRows(reread_after=3600)

    def read(now: float = 0.0) -> list:
        changed = db.pending_changes()
        with db.read() as session:
            return kept.read(session, changed, now)

    def full() -> list:
        with db.read() as session:
            return scheduling_rows.for_scheduling(session, JobState.PENDING, held=False)

    assert read() == [] and db.pending_changes() == set()  # the watch has begun
    first, second, third = _add(db), _add(db), _add(db)
    assert db.pending_changes() == {first, second, third}
    with db.read() as session:
        rows = kept.read(session, {first, second, third}, 0.0)
    assert rows == full() and [row.id for row in rows] == [first, second, third]
    steps = [
        lambda s: job_updates.set_held(s, [second], True),
        lambda s: job_updates.modify(s, [first], priority=7, time_limit=60),
        lambda s: job_updates.set_pending_reasons(s, {third: "Resources"}),
        lambda s: job_updates.set_held(s, [second], False),
        lambda s: transitions.start(s, first, "cpu0", 0),
        lambda s: transitions.requeue(s, first, "requeued"),
        lambda s: transitions.cancel_pending(s, third, "cancelled by user"),
        lambda s: submissions.submit(s, _new_job(), lambda p, i, a, t: p),
    ]
    for step in steps:
        with db.write() as session:
            step(session)
        assert read() == full()
    with pytest.raises(RuntimeError):
        with db.write() as session:
            job_updates.modify(session, [second], priority=3)
            raise RuntimeError("rolled back")
    assert read() == full() and all(row.priority != 3 for row in full())
    # a write from outside the daemon is seen at the next full read
    outside = sqlite3.connect(db.home.db, isolation_level=None)
    outside.execute("UPDATE jobs SET priority = 9 WHERE id = ?", (second,))
    outside.close()
    assert read(now=1.0) != full() and kept.drifted == []
    assert read(now=3600.0) == full() and kept.drifted == [second]


def test_upgrade_to_0015_keeps_jobs_as_batch_jobs_and_takes_interactive_ones(tmp_path):
    """Interactive jobs' flag: a queue from before keeps every job, each a batch job, and
    takes an interactive one (gq run --pty) whose output is its terminal's."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0014")
    _finished_jobs(home, [dict(id=3, end_time=5.0), dict(id=4, state="PENDING", end_time=None)])
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    new = submissions.NewJob(
        name="sh",
        user="ann",
        uid=1000,
        gid=1000,
        script="/(command)",
        args=[],
        interpreter=None,
        workdir="/w",
        output_pattern=None,
        error_pattern=None,
        env={},
        interactive=True,
    )
    with database.write() as session:
        added = submissions.submit(session, new, lambda p, i, a, t: f"/w/{p}-{i}")[0]
    with database.read() as session:
        old, pending, interactive = (lookups.job(session, i) for i in (3, 4, added))
        assert (old.state, old.interactive, old.stdout_path) == ("COMPLETED", False, "/w/o")
        assert (pending.state, pending.interactive) == ("PENDING", False)
        assert (interactive.interactive, interactive.stdout_path, interactive.stderr_path) == (
            True,
            "",
            "",
        )
        assert job_info(interactive).interactive and not job_info(old, detail=False).interactive


def test_upgrade_to_0016_keeps_runs_and_learns_start_ups_from_new_ones(tmp_path):
    """Start-ups as hosts measure them: a queue from before keeps its jobs, its completed
    runs read with no start-up (forecasts go on their overheads, as before), and a running
    job's progress records its start-up, which its next run starts without."""
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0014")
    _finished_jobs(
        home,
        [
            dict(
                id=3,
                name="train",
                start_time=2.0,
                end_time=14.0,
                steps_done=100,
                attained=10.0,
                mean_iteration=0.1,
            ),
            dict(id=4, name="train", state="RUNNING", start_time=20.0, end_time=None),
        ],
    )
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.read() as session:
        assert stats.recent_runs(session, "ann", "train", 5) == [
            (2.0, 14.0, 100, 10.0, 0.1, None, None)
        ]
    with database.write() as session:
        job_updates.record_progress(
            session,
            4,
            JobProgress(
                job=1,
                run=1,
                steps_done=5,
                attained=0.5,
                mean_iteration=0.1,
                mem_persistent=None,
                mem_peak=None,
                holds_lane=True,
                startup=1.25,
            ),
        )
    with database.read() as session:
        assert lookups.job(session, 4).startup == 1.25
    with database.write() as session:
        transitions.finish(session, 4, JobState.COMPLETED, 0, None, now=30.0)
    with database.read() as session:
        assert [run[-1] for run in stats.recent_runs(session, "ann", "train", 5)] == [1.25, None]
    database.close()


def test_upgrade_to_0017_keeps_jobs_and_learns_idle_time_from_new_runs(tmp_path):
    """Interactive jobs' idle time: a queue from before keeps its jobs (no --idle-timeout, no
    activity known: a running interactive job reads idle since its start), and a new
    interactive job keeps its --idle-timeout and the activity its host reports."""
    now = time.time()
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0016")
    _finished_jobs(
        home,
        [
            dict(id=3, end_time=5.0),
            dict(id=4, state="RUNNING", start_time=now - 1100, end_time=None),
        ],
    )
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.write() as session:
        session.execute(update(Job).where(Job.id == 4).values(interactive=True))
    new = submissions.NewJob(
        name="python",
        user="ann",
        uid=1000,
        gid=1000,
        script="/(python)",
        args=[],
        interpreter="/usr/bin/python3",
        workdir="/w",
        output_pattern=None,
        error_pattern=None,
        env={},
        interactive=True,
        idle_timeout=600,
    )
    with database.write() as session:
        added = submissions.submit(session, new, lambda p, i, a, t: f"/w/{p}-{i}")[0]
        transitions.start(session, added, "cpu", 0, now=now - 1000)
        job_updates.record_progress(
            session,
            added,
            JobProgress(
                job=1,
                run=1,
                steps_done=0,
                attained=0.0,
                mean_iteration=None,
                mem_persistent=None,
                mem_peak=None,
                holds_lane=False,
                active_at=now - 950,
            ),
        )
    with database.read() as session:
        old, running, fresh = (lookups.job(session, i) for i in (3, 4, added))
        assert (old.state, old.idle_timeout, old.active_at) == ("COMPLETED", None, None)
        assert job_info(old).idle is None  # ended: no idle time
        assert running.active_at is None and job_info(running).idle >= 1100  # since its start
        assert (fresh.idle_timeout, fresh.active_at) == (600, now - 950)
        info = job_info(fresh)
        assert info.idle_timeout == 600
        assert 950 <= info.idle < 960  # since its last activity, not its start
    database.close()


def test_a_scheduling_row_names_the_columns_it_is_read_from_in_their_order():
    from gq.queue.scheduling_rows import SCHEDULING_COLUMNS, SchedulingRow

    assert SchedulingRow._fields == tuple(column.key for column in SCHEDULING_COLUMNS)


def test_upgrade_to_0018_keeps_jobs_and_starts_every_users_usage_at_nothing(tmp_path):
    """The scheduler's device: a queue from before keeps its jobs, each taken 0 times; no
    user has used anything yet, and a user's usage charged now is kept across a reopen
    (a daemon's restart), decayed from when it was charged."""
    from gq.daemon.scheduling.fair_share import Charged, Ledger

    home = Home(tmp_path / "old").ensure()
    migrate(home, "0017")
    _finished_jobs(home, [dict(id=3, end_time=5.0, attained=12.5)])
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.read() as session:
        old = lookups.job(session, 3)
        assert (old.state, old.attained, old.lane_taken) == ("COMPLETED", 12.5, 0)
        assert job_info(old).lane_taken == 0
        ledger = Ledger(half_life=100.0)
        ledger.load(session)
        assert ledger.usages() == {}
    run = Charged()
    with database.write() as session:
        ledger.charge("ann", run, 8.0, now=1000.0)
        ledger.charge("ann", run, 8.0, now=1000.0)  # the same figure again: nothing more
        ledger.charge("ann", run, float("nan"), now=1000.0)  # nor a figure that is none
        ledger.save(session)
    database.close()
    reopened = Database(home)
    with reopened.read() as session:
        again = Ledger(half_life=100.0)
        again.load(session)
    assert again.usage("ann", now=1100.0) == pytest.approx(4.0)
    assert again.beside([("ann", run)], now=1100.0) == {"ann": pytest.approx(0.0)}
    reopened.close()
