"""gq status without typer (gq/cli/quick.py): the same options as the typer command, the
same output, and typer left unimported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

import pytest

from conftest import ROOT, gq, gq_ok, submit, write_script
from gq.cli import quick
from gq.cli.quick import Kind


def _typer_options(name: str) -> dict[str, tuple[str, Kind]]:
    """The options of the typer command ``name``, as quick.OPTIONS spells them (typer
    carries its own click: its classes are known here by their names)."""
    import typer

    from gq.cli.main import make_app

    group = typer.main.get_command(make_app(name))
    command = group.commands[name]
    found = {}
    for param in command.params:
        if param.param_type_name != "option" or param.name == "help":
            continue
        if param.is_flag:
            kind = Kind.FLAG
        elif param.multiple:
            kind = Kind.LIST
        elif param.type.name in ("integer", "int range"):
            kind = Kind.COUNT
        else:
            kind = Kind.VALUE
        for option in [*param.opts, *param.secondary_opts]:
            found[option] = (param.name, kind)
    return found


@pytest.mark.parametrize("name", sorted(quick.OPTIONS))
def test_the_quick_options_are_the_typer_commands(name):
    assert quick.OPTIONS[name] == _typer_options(name)


DEFAULTS = {"all_jobs": False, "json_out": False, "user": None, "state": None,
            "format_spec": None, "sort_spec": None, "limit": None, "start": False,
            "long": False}


@pytest.mark.parametrize("line, given", [
    ([], {}),
    (["-a", "--json"], {"all_jobs": True, "json_out": True}),
    (["-u", "root", "--user=bob", "-ucarol"], {"user": ["root", "bob", "carol"]}),
    (["-t", "PD,R", "--state", "CD"], {"state": ["PD,R", "CD"]}),
    (["-o", "%i %j", "--format=%u", "-S-p,i"], {"format_spec": "%u", "sort_spec": "-p,i"}),
    (["-S", "-p,i", "-u", "-a"], {"sort_spec": "-p,i", "user": ["-a"]}),
    (["--limit", "0", "--start", "-l", "--long"], {"limit": 0, "start": True, "long": True}),
    (["--limit=12"], {"limit": 12}),
])
def test_lines_read_here(line, given):
    assert quick.parse(line, quick.OPTIONS["status"]) == {**DEFAULTS, **given}


@pytest.mark.parametrize("line", [
    ["--help"], ["-h"], ["--bogus"], ["extra"], ["--"], ["-al"], ["-o"],
    ["--limit", "-1"], ["--limit", "x"], ["--limit"], ["--json=1"], ["--all=yes"], ["-"],
    ["--user", "root", "--usr", "bob"],
])
def test_lines_left_to_typer(line):
    assert quick.parse(line, quick.OPTIONS["status"]) is None


def test_a_line_left_to_typer_gets_typers_error_and_help(daemon):
    result = gq("status", "--limit", "-1")
    assert result.code == 2 and "--limit" in result.err and result.err.count("\n") == 1
    assert "Usage: gq status" in gq_ok("status", "--help")
    result = gq("status", "-t", "NOPE")
    assert result.code == 2 and "NOPE" in result.err and result.err.count("\n") == 1


def test_status_prints_what_typer_would(daemon, tmp_path, monkeypatch):
    script = write_script(tmp_path / "held.sh", "true\n")
    ids = [submit("--hold", "-J", f"held{i}", str(script)) for i in range(3)]
    monkeypatch.delenv("GQ_STATUS_FORMAT", raising=False)
    for line in (["status"], ["status", "-a"], ["status", "--json"], ["status", "-l"],
                 ["status", "-o", "%.6i %j %t %R", "-S", "-i"], ["status", "-t", "PD", "-u",
                                                                "nobody-here"]):
        assert quick.parse(line[1:], quick.OPTIONS["status"]) is not None
        quick_result = gq(*line)
        with mock.patch.object(quick, "run", return_value=False):  # typer's turn
            typer_result = gq(*line)
        assert quick_result == typer_result, line
        assert quick_result.code == 0
    listed = json.loads(gq_ok("status", "--json"))
    assert [job["id"] for job in listed] == ids
    lines = gq_ok("status", "-o", "%.6i %j %t %R", "-S", "-i").splitlines()
    assert [line.split() for line in lines[1:]] == [
        [str(job_id), f"held{i}", "PD", "JobHeldUser"] for i, job_id in reversed(
            list(enumerate(ids)))]


def test_status_imports_no_typer(daemon, tmp_path):
    script = write_script(tmp_path / "held.sh", "true\n")
    job_id = submit("--hold", str(script))
    code = ("import sys; from gq.cli.main import main; code = main(['status', '--json']); "
            "print('typer' in sys.modules, 'click' in sys.modules, code)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    *listing, verdict = done.stdout.splitlines()
    assert verdict == "False False 0", done.stdout
    assert [job["id"] for job in json.loads("\n".join(listing))] == [job_id]
