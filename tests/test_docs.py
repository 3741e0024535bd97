"""The command reference in docs/ is what gq's typer app says today, and reads as its kind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from gq.cli import docs
from gq.cli.app import COMMANDS

from conftest import ROOT


@pytest.mark.parametrize("path", [docs.MARKDOWN, docs.MAN], ids=str)
def test_checked_in_page_is_current(path):
    expected = docs.rendered()[path]
    current = (ROOT / path).read_text(encoding="utf-8")
    assert current == expected, (
        f"{path} is stale: run `{docs.REGENERATE}` from the repository root and commit it"
    )


def test_pages_do_not_follow_the_terminal_or_the_environment(tmp_path):
    """Written in another directory, on a narrow terminal that asks for colours, the pages
    come out as they do here."""
    env = {**os.environ, "COLUMNS": "20", "TERM": "xterm-256color", "FORCE_COLOR": "1"}
    env["GQ_HOME"] = str(tmp_path / "state")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    (tmp_path / "docs").mkdir()
    subprocess.run(
        [sys.executable, "-m", "gq.cli.docs"], cwd=tmp_path, env=env, check=True, timeout=60
    )
    for path, text in docs.rendered().items():
        assert (tmp_path / path).read_text(encoding="utf-8") == text


def test_every_command_and_option_is_on_the_page():
    page = docs.markdown()
    for name in COMMANDS:
        assert f"## `gq {name}`" in page
    for spelling in ("--gpu-mem SIZE", "--lanes auto|N", "--max-hold", "--idle-timeout TIME"):
        assert spelling in page


def test_check_says_what_to_run_when_a_page_is_stale(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    assert docs.main([]) == 0
    assert docs.main(["--check"]) == 0
    (tmp_path / docs.MARKDOWN).write_text("# old\n", encoding="utf-8")
    assert docs.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert str(docs.MARKDOWN) in err and docs.REGENERATE in err
    assert (tmp_path / docs.MARKDOWN).read_text(encoding="utf-8") == "# old\n"


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_manual_page_sets_without_warnings():
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z"],
        input=docs.man(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == ""
