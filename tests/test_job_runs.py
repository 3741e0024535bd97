"""A requeued job's runs: gq history sums them (its wait before each, its run time, its
lane time) and says the steps it reached; gq show lists each run, how it ended and why."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

import pytest

from gq.exec.host.messages import JobProgress
from gq.home import Home
from gq.queue import engine, job_updates, lookups, purging, submissions, transitions
from gq.queue.engine import HEAD_REVISION, Database, migrate
from gq.queue.states import JobState

from conftest import gq_ok, submit, wait_for, wait_state, write_script


def _time(text: str | None) -> float:
    assert text is not None
    return datetime.fromisoformat(text).timestamp()


def test_a_requeued_jobs_history_sums_its_runs_and_show_lists_each(daemon, tmp_path):
    """It showed WAIT as its second start less its submission (its first run counted as a
    wait), RUN and lane time of its second run alone, and 20 of 30 steps for a job that
    completed all 30 over two runs."""
    checkpoint, waiting = tmp_path / "checkpoint", tmp_path / "waiting"
    script = write_script(
        tmp_path / "resume.py",
        (
            "import gq, os, time\n"
            f"done = int(open({str(checkpoint)!r}).read()) if os.path.exists({str(checkpoint)!r})"
            " else 0\n"
            "for step in gq.steps(range(done, 30)):\n"
            "    time.sleep(0.02)\n"
            f"    open({str(checkpoint)!r}, 'w').write(str(step + 1))\n"
            "    if step == 9 and done == 0:\n"
            f"        open({str(waiting)!r}, 'w').close()\n"
            "        time.sleep(300)\n"
        ),
    )
    job_id = submit("--steps", "30", str(script))
    wait_for(waiting.exists, 60, what="the first run to reach its checkpoint")
    gq_ok("requeue", str(job_id))
    shown = wait_state(job_id, "COMPLETED", timeout=60)
    first, second = shown["runs"]
    assert (first["run"], first["ended"], first["reason"]) == (1, "REQUEUED", "requeued by user")
    assert (second["run"], second["ended"], second["exit_code"]) == (2, "COMPLETED", 0)
    assert second["steps_done"] == 20 and 0 < first["steps_done"] <= 10, shown["runs"]
    assert first["run_time"] > 0.3
    # Its second run waited from its requeue (its first run's end) to its start.
    assert second["queued_time"] == first["end_time"]
    (listed,) = [j for j in json.loads(gq_ok("history", "--json")) if j["id"] == job_id]
    submitted = _time(listed["submit_time"])
    waits = (_time(first["start_time"]) - submitted) + (
        _time(second["start_time"]) - _time(first["end_time"])
    )
    for data in (listed, shown):
        assert data["wait_time"] == pytest.approx(waits, abs=0.01)
        # ... not the second start less the submission, which holds the first run
        assert data["wait_time"] < _time(second["start_time"]) - submitted - 0.3
        assert data["run_time"] == pytest.approx(first["run_time"] + second["run_time"], abs=0.01)
        assert data["attained"] == pytest.approx(first["attained"] + second["attained"])
        assert first["attained"] > 0 and second["attained"] > 0
        assert (data["steps_done"], data["steps_total"], data["run_count"]) == (30, 30, 2)
    row = next(line for line in gq_ok("history").splitlines() if line.startswith(f"{job_id} "))
    assert " 2 " in row and " 30/30 " in row, row
    page = gq_ok("show", str(job_id))
    assert "Steps: 30/30 (the job completed; run 2 counted 20)" in page, page
    assert "(its 2 runs)" in page
    runs = page.split("\nRuns:\n")[1].split("\n\n")[0].splitlines()
    assert runs[0].split()[:4] == ["RUN", "START", "END", "ENDED"]
    assert runs[1].split()[0] == "1" and "REQUEUED" in runs[1] and "requeued by user" in runs[1]
    assert runs[2].split()[0] == "2" and "COMPLETED" in runs[2] and " 20/30 " in runs[2]


def _job(session) -> int:
    new = submissions.NewJob(
        name="j",
        user="ann",
        uid=1000,
        gid=1000,
        script="/s.py",
        args=[],
        interpreter=None,
        workdir="/w",
        output_pattern=None,
        error_pattern=None,
        env={},
    )
    return submissions.submit(session, new, lambda p, i, a, t: "")[0]


def test_upgrade_to_0019_keeps_jobs_their_latest_run_and_purges_runs_with_them(tmp_path):
    """A queue from before runs were kept: a finished job's totals are its latest run's
    (as gq showed them), listed as its one run; a job pending after a requeue then runs
    again and its runs are kept and summed from there; purged, its runs go with it."""
    from gq.daemon.serving.handlers.common import job_info, run_infos
    from gq.queue import job_runs

    home = Home(tmp_path / "old").ensure()
    migrate(home, "0018")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[]', 0)"
    )
    common = (
        "name, user, priority, gpus, exclusive, requeue, script, spool_path, workdir, "
        "stdout_path, stderr_path, submit_time, steps_done, attained, holds_lane, held, "
        "payload_id, uid, suspended, state, run_count, start_time, end_time"
    )
    values = (
        "'a', 'ann', 0, 1, 0, 0, '/s', '', '/w', '/w/o', '/w/o', 10.0, 7, 2.5, 0, 0, 1, 1000, 0"
    )
    connection.execute(
        f"INSERT INTO jobs (id, {common}) VALUES (3, {values}, 'COMPLETED', 2, 40.0, 50.0)"
    )
    connection.execute(
        f"INSERT INTO jobs (id, {common}) VALUES (4, {values}, 'PENDING', 1, NULL, NULL)"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.write() as session:
        old = lookups.job(session, 3)
        info = job_info(old)
        assert (info.earlier_wait, info.earlier_run, info.earlier_steps) == (0.0, 0.0, 0)
        assert info.queued_time is None  # its wait: from its submission, as before
        (run,) = run_infos(old, job_runs.runs(session, [3])[3])
        assert (run.run, run.queued_time, run.start_time, run.end_time) == (2, 10.0, 40.0, 50.0)
        assert (run.ended, run.steps_done, run.attained) == ("COMPLETED", 7, 2.5)
        assert transitions.start(session, 4, "cpu", 0, now=20.0)
        job_updates.record_progress(
            session, 4, JobProgress(job=4, run=2, steps_done=4, attained=1.5)
        )
        assert transitions.requeue(session, 4, "requeued by user", now=30.0)
        assert transitions.start(session, 4, "cpu", 0, now=35.0)
        assert transitions.finish(session, 4, JobState.FAILED, 1, "exit 1", now=45.0)
        fresh = _job(session)
    with database.read() as session:
        pending = lookups.job(session, 4)
        kept = job_runs.runs(session, [4])[4]
        assert [(r.run, r.queued_time, r.start_time, r.end_time, r.ended) for r in kept] == [
            (2, 10.0, 20.0, 30.0, "REQUEUED"),
            (3, 30.0, 35.0, 45.0, "FAILED"),
        ]
        info = job_info(pending)
        assert (info.earlier_wait, info.earlier_run, info.queued_time) == (10.0, 10.0, 30.0)
        assert info.earlier_attained == 1.5 and info.earlier_steps == 4
        assert lookups.job(session, fresh).earlier_wait == 0.0
    with database.write() as session:
        purging.purge(session, [4])
    with database.read() as session:
        assert job_runs.runs(session, [4]) == {4: []}
    database.close()


def test_upgrade_to_0022_charges_old_jobs_whole_and_sums_what_runs_were_not_charged(tmp_path):
    """A running job from before is charged all its lane time; from then on each run keeps
    what its host did not charge (side by side, the share of the device it did not get), a
    requeue adds it to the earlier runs', and gq history's pace side by side is the charge
    over the lane time, all runs summed."""
    from gq.cli import render
    from gq.daemon.serving.handlers.common import job_info

    home = Home(tmp_path / "old").ensure()
    migrate(home, "0021")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[]', 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, priority, gpus, exclusive, requeue, script, "
        "spool_path, workdir, stdout_path, stderr_path, submit_time, steps_done, attained, "
        "holds_lane, held, payload_id, uid, suspended, preempted, state, run_count, "
        "start_time, device, lane) VALUES (5, 'a', 'ann', 0, 1, 0, 1, '/s', '', '/w', '/w/o', "
        "'/w/o', 10.0, 7, 2.5, 0, 0, 1, 1000, 0, 0, 'RUNNING', 1, 20.0, 'cpu', 0)"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.write() as session:
        old = job_info(lookups.job(session, 5))
        assert (old.attained, old.uncharged, old.earlier_uncharged) == (2.5, 0.0, 0.0)
        assert render.pace_side_by_side(old) is None  # charged whole
        progress = JobProgress(job=5, run=1, steps_done=9, attained=3.0, charged=1.0)
        job_updates.record_progress(session, 5, progress)
        assert job_info(lookups.job(session, 5)).uncharged == 2.0
        assert transitions.requeue(session, 5, "requeued by user", now=30.0)
        assert transitions.start(session, 5, "cpu", 0, now=35.0)
        started = job_info(lookups.job(session, 5))
        assert (started.uncharged, started.earlier_uncharged) == (0.0, 2.0)
        # A charge above the lane time is not believed: the run is charged whole.
        inflated = JobProgress(job=5, run=2, steps_done=2, attained=1.0, charged=50.0)
        job_updates.record_progress(session, 5, inflated)
    with database.read() as session:
        info = job_info(lookups.job(session, 5))
    assert render.lane_time(info) == 4.0 and render.charged_time(info) == 2.0
    assert render.pace_side_by_side(info) == 0.5
    database.close()
