"""gq show without typer (gq/cli/quick.py): a line it reads completely prints what typer's
gq show prints, errors included, and imports no typer; any other line is typer's."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from gq.cli import quick

from conftest import gq, main_in_a_new_interpreter, submit, write_script


@pytest.mark.parametrize(
    "line, job_id, json_out",
    [
        (["17"], "17", False),
        (["--json", "17"], "17", True),
        (["17", "--json"], "17", True),  # click reads options after the argument too
        (["17_3"], "17_3", False),
        (["--", "17"], "17", False),
        (["--json", "--", "-"], "-", True),  # (a label the daemon is never asked about)
    ],
)
def test_show_lines_read_here(line, job_id, json_out):
    parsed = quick.parse(line, "show")
    assert parsed.params == {"job_id": job_id, "json_out": json_out}


@pytest.mark.parametrize(
    "line", [[], ["--json"], ["1", "2"], ["--help", "1"], ["-j", "1"], ["--json=1", "1"], ["-1"]]
)
def test_show_lines_left_to_typer(line):
    assert quick.parse(line, "show") is None


def _both(*line: str):
    by_quick = gq(*line)
    with mock.patch.object(quick, "run", return_value=None):  # typer's turn
        by_typer = gq(*line)
    assert by_quick == by_typer, line
    return by_quick


def test_show_prints_what_typer_would(daemon, tmp_path):
    script = write_script(tmp_path / "held.sh", "true\n")
    job_id = submit("--hold", "-J", "held", str(script))
    array = submit("--hold", "--array", "0-101", str(script))
    for line in (["show", str(job_id)], ["show", "--json", str(job_id)]):
        assert quick.parse(line[1:], "show") is not None
        assert _both(*line).code == 0
    shown = json.loads(_both("show", str(job_id), "--json").out)
    assert (shown["id"], shown["name"], shown["state"]) == (job_id, "held", "PENDING")
    assert "State history:" in _both("show", str(job_id)).out
    tasks = _both("show", "--json", str(array))
    assert len(json.loads(tasks.out)) == 100
    assert f"gq: note: 2 more tasks of array {array} not shown" in tasks.err


@pytest.mark.parametrize(
    "label, says",
    [
        ("999", "gq: error: no job 999 (see 'gq status --all' for the ids in the queue)"),
        ("17_x", "gq: error: "),
        ("\x00", "gq: error: "),
        (str(2**70), "gq: error: "),
    ],
)
def test_show_refuses_what_typer_refuses_in_one_line(daemon, label, says):
    refused = _both("show", "--json", label)
    assert refused.code != 0 and refused.out == ""
    assert refused.err.startswith(says) and refused.err.count("\n") == 1, refused.err


def test_show_imports_no_typer(daemon, tmp_path):
    script = write_script(tmp_path / "held.sh", "true\n")
    job_id = submit("--hold", str(script))
    shown, imported_typer = main_in_a_new_interpreter("show", "--json", str(job_id))
    assert not imported_typer
    assert json.loads("\n".join(shown))["id"] == job_id
