"""A Jupyter kernel's pending note (gq.exec.job.pending_notes): kept in a directory of its
owner's alone, one per connection file, read once and only so much of it; nothing planted
at its names is followed, read, or waited on. The kernels that use it: tests/test_kernel.py."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from gq import defaults
from gq.cli import kernel_launch
from gq.exec.job import pending_notes

from conftest import _open_to_all

NOBODY = 65534  # a uid that is not the test's


@pytest.fixture
def bases(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A private runtime directory (XDG_RUNTIME_DIR) and a cache (XDG_CACHE_HOME), not
    made yet, of the test's own."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return runtime, tmp_path / "cache"


def _promptly(call):
    """``call()``'s value, which comes within seconds (an open that blocks never would)."""
    done: list = []
    worker = threading.Thread(target=lambda: done.append(call()), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), f"{call} blocked"
    return done[0]


def _note(tmp_path: Path) -> str:
    note = pending_notes.place(str(tmp_path / "kernel-1.json"))
    assert note is not None
    return note


def test_each_connection_file_has_its_note_in_a_directory_of_the_users_alone(
    bases, tmp_path, monkeypatch
):
    runtime, cache = bases
    note = _note(tmp_path)
    directory = os.lstat(os.path.dirname(note))
    assert os.path.dirname(note) == str(runtime / "gq" / "kernel-notes")
    assert stat.S_ISDIR(directory.st_mode) and stat.S_IMODE(directory.st_mode) == 0o700
    assert directory.st_uid == os.geteuid() and not cache.exists()
    monkeypatch.chdir(tmp_path)
    assert pending_notes.place("kernel-1.json") == note  # the same file: the same note
    hostile = ["kernel-2.json", "", "x" * 100_000, "\0", "\udcff.json", "../kernel-1.json"]
    names = {pending_notes.place(name) for name in hostile}
    assert len(names) == len(hostile) and note not in names
    assert all(os.path.dirname(str(name)) == os.path.dirname(note) for name in names)


@pytest.mark.parametrize(
    "spoil", ["unset", "relative", "open to others", "a link", "another user's", "a file"]
)
def test_a_runtime_directory_not_the_users_alone_is_passed_over(
    spoil, bases, tmp_path, monkeypatch
):
    runtime, cache = bases
    if spoil == "unset":
        monkeypatch.delenv("XDG_RUNTIME_DIR")
    elif spoil == "relative":
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("XDG_RUNTIME_DIR", "run")
    elif spoil == "open to others":
        runtime.chmod(0o755)
    elif spoil == "a link":
        os.symlink(runtime, tmp_path / "link")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "link"))
    elif spoil == "another user's":
        os.chown(runtime, NOBODY, NOBODY)
    else:
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "file"))
    assert os.path.dirname(_note(tmp_path)) == str(cache / "gq" / "kernel-notes")
    assert not (runtime / "gq").exists()


def test_without_a_private_place_a_kernel_is_queued_without_a_note(bases, tmp_path, monkeypatch):
    connection = tmp_path / "kernel-1.json"
    connection.write_text("{}")
    assert kernel_launch.kernel_job(str(connection)).args == [str(connection), _note(tmp_path)]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(connection / "cache"))  # under a file
    assert pending_notes.place(str(connection)) is None
    assert kernel_launch.kernel_job(str(connection)).args == [str(connection)]


@pytest.mark.parametrize("spoil", ["a link", "open to others", "another user's"])
def test_a_notes_directory_not_the_users_alone_is_neither_written_nor_read(spoil, bases, tmp_path):
    note = _note(tmp_path)
    directory = Path(note).parent
    assert pending_notes.write(note, "job 1 pending (Priority)")
    if spoil == "a link":  # to a directory of the user's own, as private as the real one
        elsewhere = tmp_path / "elsewhere"
        directory.rename(elsewhere)
        directory.symlink_to(elsewhere)
    elif spoil == "open to others":
        directory.chmod(0o755)
    else:
        os.chown(directory, NOBODY, NOBODY)
    assert pending_notes.take(note) is None
    assert not pending_notes.write(note, "job 1 pending (Resources)")
    pending_notes.forget(note)
    assert os.listdir(directory) == [os.path.basename(note)]
    assert Path(note).read_text() == "job 1 pending (Priority)"
    assert os.path.dirname(_note(tmp_path)) != str(directory)  # the cache's, now


def test_a_note_is_written_whole_replaced_read_once_and_bounded(bases, tmp_path):
    note = _note(tmp_path)
    assert pending_notes.take(note) is None
    assert pending_notes.write(note, "job 3 pending (Priority)")
    assert pending_notes.write(note, "job 3 pending (Resources), starts 12:00")
    info = os.lstat(note)
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert os.listdir(os.path.dirname(note)) == [os.path.basename(note)]
    assert pending_notes.take(note) == "job 3 pending (Resources), starts 12:00"
    assert not os.path.lexists(note) and pending_notes.take(note) is None
    assert pending_notes.write(note, "é" * 1_000_000)
    assert os.path.getsize(note) == defaults.KERNEL_NOTE_BYTES
    Path(note).write_bytes(b"\xff" * (10 << 20))
    said = pending_notes.take(note)
    assert said is not None and len(said) <= defaults.KERNEL_NOTE_BYTES
    assert pending_notes.write(note, "job 3 pending (Priority)")
    pending_notes.forget(note)
    pending_notes.forget(note)
    assert os.listdir(os.path.dirname(note)) == []


def test_nothing_planted_at_a_notes_names_is_followed_read_or_waited_on(bases, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("the owner's own\n")
    secret.chmod(0o600)
    note = _note(tmp_path)
    os.symlink(secret, f"{note}.new")  # where the launcher writes first
    assert pending_notes.write(note, "job 1 pending (Priority)")
    assert secret.read_text() == "the owner's own\n"
    assert Path(note).read_text() == "job 1 pending (Priority)" and not os.path.lexists(
        f"{note}.new"
    )
    os.unlink(note)
    os.symlink(secret, note)
    assert pending_notes.take(note) is None
    assert secret.read_text() == "the owner's own\n"
    os.unlink(note)
    os.mkfifo(note)
    assert _promptly(lambda: pending_notes.take(note)) is None
    assert _promptly(lambda: pending_notes.write(note, "job 1 pending (Resources)"))
    assert pending_notes.take(note) == "job 1 pending (Resources)"
    os.mkdir(f"{note}.new")
    assert not pending_notes.write(note, "job 1 pending (Priority)")
    os.mkdir(note)
    assert pending_notes.take(note) is None
    os.rmdir(note)
    Path(note).write_text("someone else's")
    os.chown(note, NOBODY, NOBODY)
    assert pending_notes.take(note) is None and os.path.exists(note)


@pytest.mark.parametrize(
    "where", ["", "kernel-1", "/nowhere/kernel-1", "/a\0b", "{open}/kernel-1", "{tmp}/kernel-1"]
)
def test_a_note_outside_a_directory_of_the_users_alone_is_nothing(where, tmp_path, monkeypatch):
    """Relative, missing, hostile, or in a directory others may enter (0755) or add to
    (sticky, as /tmp): nothing is read, written or removed there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "open").mkdir(mode=0o755)
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(0o1777)
    note = where.format(open=tmp_path / "open", tmp=tmp_path / "tmp")
    assert pending_notes.take(note) is None
    assert not pending_notes.write(note, "job 1 pending (Priority)")
    pending_notes.forget(note)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["open", "tmp"]


def test_another_user_cannot_plant_anything_among_the_notes(tmp_path, monkeypatch, users):
    """Even where the user's cache lets everyone through (0755), no one else may add a
    link or a FIFO to their notes' directory."""
    _open_to_all(tmp_path)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    (tmp_path / "cache").mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    note = _note(tmp_path)
    assert os.path.dirname(note) == str(tmp_path / "cache" / "gq" / "kernel-notes")
    for argv in (
        ["ln", "-s", "/etc/shadow", note],
        ["ln", "-s", "/etc/shadow", f"{note}.new"],
        ["mkfifo", note],
    ):
        done = subprocess.run(
            ["runuser", "-u", users["bob"].name, "--", *argv],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done)
    assert os.listdir(os.path.dirname(note)) == []
