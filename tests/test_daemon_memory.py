"""The daemon's memory, through the real CLI and daemon: what ``gq info`` reports of it, and
that what it is asked leaves nothing behind that grows with the asking."""

from __future__ import annotations

import json

import pytest

from conftest import gq_ok, submit, write_script

ARRAYS = 40


def _memory() -> dict:
    return json.loads(gq_ok("info", "--json"))["memory"]


def test_info_reports_the_daemons_memory(home):
    memory = _memory()
    assert memory["rss"] > 10 * 2**20  # an interpreter with SQLAlchemy loaded
    assert memory["sqlite"] is None or 0 < memory["sqlite"] < memory["rss"]
    assert "daemon memory" in gq_ok("info")


def test_listings_of_every_length_leave_sqlite_no_statement_each(home, tmp_path):
    """A listing reads the first task of each array it folds by their ids: a statement per
    number of arrays, were each length its own SQL, and SQLite keeps the last 128 prepared
    (about 45 KB each), so polling a queue whose arrays come and go grew the daemon by MBs."""
    if _memory()["sqlite"] is None:
        pytest.skip("this interpreter's SQLite does not tell its memory")
    script = write_script(tmp_path / "tiny.sh", "true\n")
    arrays = [submit("--hold", "--array", "0-1", str(script)) for _ in range(ARRAYS)]
    assert len(json.loads(gq_ok("status", "--json"))) == ARRAYS  # folded: one line an array
    before = _memory()["sqlite"]
    for left, array in zip(range(ARRAYS, 1, -1), arrays):
        assert len(json.loads(gq_ok("status", "--json"))) == left
        gq_ok("cancel", str(array))
    grown = _memory()["sqlite"] - before
    assert grown < 256 * 1024, f"SQLite grew by {grown} bytes over {ARRAYS} listings"
