"""A node after a month: many finished jobs are listed a page at a time, newest first, and
the daemon records many short jobs' ends together without letting one bad one cost the
others."""

from __future__ import annotations

import json
import sqlite3

import pytest

from gq import defaults

from conftest import DaemonControl,  gq, gq_ok, job, submit, wait_for, wait_state, write_script

FINISHED = defaults.LIST_PAGE + 50  # more than one of the daemon's pages


def _copies_of(root, job_id: int, count: int) -> None:
    """``count`` more finished jobs like ``job_id``, written behind the daemon's back as a
    month of use would have left them."""
    db = sqlite3.connect(root / "gq.db", timeout=30)
    columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)") if row[1] != "id"]
    names = ", ".join(f'"{name}"' for name in columns)
    db.execute(f"INSERT INTO jobs ({names}) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
               f"SELECT i + 1 FROM n WHERE i < {count}) SELECT {names} FROM jobs, n "
               "WHERE jobs.id = ?", (job_id,))
    db.commit()
    db.close()


def _ids(out: str) -> list[int]:
    return [entry["id"] for entry in json.loads(out)]


def test_finished_jobs_are_listed_newest_first_a_page_at_a_time(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "true\n")
    first = submit(str(script))
    wait_state(first, "COMPLETED")
    _copies_of(daemon.root, first, FINISHED)
    pending = submit("--hold", str(script))
    newest = pending - 1

    table = gq("history")
    assert table.code == 0, table.err
    rows = table.out.splitlines()[1:]
    shown = defaults.LISTED_FINISHED  # the newest, oldest of them first
    assert len(rows) == shown
    assert [int(row.split()[0]) for row in (rows[0], rows[-1])] == [newest - shown + 1, newest]
    assert f"the newest {shown} finished jobs shown; --limit N for more" in table.err

    assert _ids(gq_ok("history", "--limit", "3", "--json")) == [newest - 2, newest - 1, newest]
    everything = gq("history", "--limit", "0", "--json")  # two of the daemon's pages
    assert _ids(everything.out) == list(range(first, newest + 1))
    assert "newest" not in everything.err

    listed = _ids(gq_ok("status", "--all", "--limit", "2", "--json"))
    assert listed == [newest - 1, newest, pending]  # pending jobs are always listed
    assert _ids(gq_ok("status", "--json")) == [pending]
    assert _ids(gq_ok("history", "--limit", "2", "-t", "F", "--json")) == []


def test_a_bad_page_request_is_refused(daemon):
    from gq import messages

    for args in (("history", "--limit", "-1"), ("status", "--all", "--limit", "x")):
        result = gq(*args)
        assert result.code == 2 and "--limit" in result.err, result
    for bad in ({"limit": 0}, {"before": 0}, {"limit": 2**70}, {"before": "7"}):
        line = json.dumps({"v": 1, "kind": "list", **bad}).encode()
        with pytest.raises(messages.MessageError):
            messages.decode(line, messages.REQUESTS)


def test_many_exits_at_once_are_recorded_and_one_bad_one_fails_alone(home, tmp_path):
    """Eight tasks end within moments of each other, so their host reports the exits
    together; the queue refuses to record one task's COMPLETED: that task alone ends
    FAILED, saying so, and the others complete."""
    go = tmp_path / "go"
    script = write_script(tmp_path / "s.sh", f"while [ ! -e {go} ]; do sleep 0.01; done\n")
    DaemonControl(home).start("--max-resident", "8")
    array = submit("--array", "0-7", "--hold", str(script))
    tasks = [entry["id"] for entry in json.loads(gq_ok("show", "--json", str(array)))]
    refused = tasks[3]
    db = sqlite3.connect(home / "gq.db", timeout=30)
    db.execute(f"CREATE TRIGGER refuse BEFORE UPDATE OF state ON jobs WHEN NEW.id = {refused} "
               "AND NEW.state = 'COMPLETED' BEGIN SELECT RAISE(ABORT, 'refused'); END")
    db.commit()
    db.close()
    gq_ok("release", str(array))
    wait_for(lambda: all(job(t)["state"] == "RUNNING" for t in tasks), 30,
             what="all eight tasks to run")
    go.touch()
    for task in tasks:
        info = wait_state(task, "COMPLETED", "FAILED", timeout=30)
        if task == refused:
            assert (info["state"], info["reason"]) == (
                "FAILED", "its exit could not be recorded; see the daemon's log")
        else:
            assert info["state"] == "COMPLETED", info
