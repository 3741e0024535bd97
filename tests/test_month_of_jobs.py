"""A node after a month: many finished jobs are listed a page at a time, newest first, and
the daemon records many short jobs' ends together without letting one bad one cost the
others."""

from __future__ import annotations

import json
import sqlite3

import msgspec
import pytest

from gq import defaults
from gq.queue.states import JobState

from conftest import DaemonControl, gq, gq_ok, job, submit, wait_for, wait_state, write_script

FINISHED = defaults.LIST_PAGE + 50  # more than one of the daemon's pages


def _copies_of(root, job_id: int, count: int) -> None:
    """``count`` more finished jobs like ``job_id``, written behind the daemon's back as a
    month of use would have left them."""
    db = sqlite3.connect(root / "gq.db", timeout=30)
    columns = [row[1] for row in db.execute("PRAGMA table_info(jobs)") if row[1] != "id"]
    names = ", ".join(f'"{name}"' for name in columns)
    db.execute(
        f"INSERT INTO jobs ({names}) WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
        f"SELECT i + 1 FROM n WHERE i < {count}) SELECT {names} FROM jobs, n "
        "WHERE jobs.id = ?",
        (job_id,),
    )
    db.commit()
    db.close()


def _ids(out: str) -> list[int]:
    return [entry["id"] for entry in json.loads(out)]


def test_finished_jobs_are_listed_a_page_at_a_time_the_last_ended_first(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "true\n")
    go = tmp_path / "go"
    slow = submit(
        str(write_script(tmp_path / "slow.sh", f"while [ ! -e {go} ]; do sleep 0.02; done\n"))
    )
    first = submit(str(script))
    wait_state(first, "COMPLETED")
    _copies_of(daemon.root, first, FINISHED)
    pending = submit("--hold", str(script))
    newest = pending - 1
    go.touch()
    wait_state(slow, "COMPLETED")  # submitted first, it ended last: listed as the newest
    assert _ids(gq_ok("history", "--limit", "1", "--json")) == [slow]
    listed = gq("history", "--limit", "3")
    assert [int(row.split()[0]) for row in listed.out.splitlines()[1:]] == [
        newest - 1,
        newest,
        slow,
    ]  # the last ended at the bottom

    table = gq("history")
    assert table.code == 0, table.err
    rows = table.out.splitlines()[1:]
    shown = defaults.LISTED_FINISHED
    assert len(rows) == shown
    assert [int(row.split()[0]) for row in (rows[0], rows[-1])] == [newest - shown + 2, slow]
    assert f"the {shown} finished jobs that ended last shown; --limit N for more" in table.err

    everything = gq("history", "--json")  # for programs, every job: several daemon pages
    assert sorted(_ids(everything.out)) == [slow, *range(first, newest + 1)]
    assert "ended last shown" not in everything.err
    assert _ids(gq_ok("history", "--limit", "0", "--json")) == _ids(everything.out)

    listed = _ids(gq_ok("status", "--all", "--limit", "2", "--json"))
    assert listed == [slow, newest, pending]  # in id order; pending jobs are always listed
    assert _ids(gq_ok("status", "--json")) == [pending]
    assert _ids(gq_ok("history", "--limit", "2", "-t", "F", "--json")) == []


def test_a_job_that_ends_between_two_pages_is_listed_once_as_it_ended(monkeypatch):
    """The first page lists job 1 running; it ends before the second page is read, which
    lists it again: the listing has it once, ended."""
    from gq import messages
    from gq.cli import listing

    def info(job_id: int, state: str) -> messages.JobInfo:
        fields = dict.fromkeys(messages.JobInfo.__struct_fields__)
        return messages.JobInfo(**{**fields, "id": job_id, "state": state})

    pages = [
        msgspec.to_builtins(answer)
        for answer in (
            messages.Jobs([info(1, "RUNNING"), info(9, "COMPLETED")], older_end=5.0, older=9),
            messages.Jobs([info(1, "CANCELLED"), info(8, "COMPLETED")]),
        )
    ]
    asked = []
    monkeypatch.setattr(
        listing.client,
        "ask_plain",
        lambda kind, fields, answer_kind: asked.append((kind, fields, answer_kind)) or pages.pop(0),
    )
    listed = listing.listed(None, None, 0)
    assert [(job.id, job.state) for job in listed.jobs] == [
        (1, "CANCELLED"),
        (8, "COMPLETED"),
        (9, "COMPLETED"),
    ]
    kind, fields, answer_kind = asked[1]
    assert (kind, answer_kind, fields["before_end"], fields["before"]) == ("list", "jobs", 5.0, 9)
    assert fields["states"] == sorted(s.value for s in JobState if s.terminal)


def test_a_bad_page_request_is_refused(daemon):
    from gq import messages

    for args in (("history", "--limit", "-1"), ("status", "--all", "--limit", "x")):
        result = gq(*args)
        assert result.code == 2 and "--limit" in result.err, result
    for bad in (
        {"limit": 0},
        {"before": 0},
        {"limit": 2**70},
        {"before": "7"},
        {"before_end": -1.0},
        {"before_end": "NaN"},
    ):
        line = json.dumps({"v": defaults.PROTOCOL_VERSION, "kind": "list", **bad}).encode()
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
    db.execute(
        f"CREATE TRIGGER refuse BEFORE UPDATE OF state ON jobs WHEN NEW.id = {refused} "
        "AND NEW.state = 'COMPLETED' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    db.commit()
    db.close()
    gq_ok("release", str(array))
    wait_for(
        lambda: all(job(t)["state"] == "RUNNING" for t in tasks), 30, what="all eight tasks to run"
    )
    go.touch()
    for task in tasks:
        info = wait_state(task, "COMPLETED", "FAILED", timeout=30)
        if task == refused:
            assert (info["state"], info["reason"]) == (
                "FAILED",
                "its exit could not be recorded; see the daemon's log",
            )
        else:
            assert info["state"] == "COMPLETED", info
