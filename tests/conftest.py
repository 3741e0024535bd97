"""Shared harness: a temporary GQ_HOME, the real CLI (in-process, through gq's own entry
point), and a real detached daemon with its execution hosts and workers."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from gq.cli import common as cli_common
from gq.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    code: int
    out: str
    err: str


def gq(*args: str) -> Result:
    """Run one gq command exactly as the console script would, capturing its output."""
    out, err = _stream(), _stream()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Result(code, _text(out), _text(err))


def _stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode()


def gq_ok(*args: str) -> str:
    result = gq(*args)
    assert result.code == 0, f"gq {' '.join(map(str, args))} -> {result.code}: {result.err}"
    return result.out


def submit(*args: str) -> int:
    return int(gq_ok("submit", "--parsable", *args).strip())


def job(job_id: int) -> dict:
    return json.loads(gq_ok("show", "--json", str(job_id)))


def all_jobs() -> list[dict]:
    return json.loads(gq_ok("status", "--all", "--json"))


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_state(job_id: int, *states: str, timeout: float = 30.0) -> dict:
    return wait_for(lambda: (j := job(job_id))["state"] in states and j, timeout,
                    what=f"job {job_id} to reach {'/'.join(states)} (now {job(job_id)['state']})")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "gqhome"
    monkeypatch.setenv("GQ_HOME", str(root))
    monkeypatch.chdir(tmp_path)
    cli_common.the_home.cache_clear()
    cli_common.database.cache_clear()
    yield root
    cli_common.the_home.cache_clear()
    cli_common.database.cache_clear()


class DaemonControl:
    def __init__(self, root: Path):
        self.root = root
        self.args: list[str] = []

    def start(self, *args: str) -> int:
        self.args = list(args) or self.args
        gq_ok("daemon", "start", "--kill-wait", "1", *self.args)
        return self.pid()

    def pid(self) -> int:
        return int((self.root / "daemon.pid").read_text())

    def stop(self) -> None:
        if gq("daemon", "status").code == 0:
            gq_ok("daemon", "stop")

    def kill9(self) -> int:
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: gq("daemon", "status").code == 1, 10, what="daemon to die")
        return pid

    def log(self) -> str:
        path = self.root / "daemon.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def daemon(home):
    control = DaemonControl(home)
    control.start()
    yield control
    control.stop()


def write_script(path: Path, body: str, mode: int = 0o644) -> Path:
    path.write_text(body)
    path.chmod(mode)
    return path


PYTHON = sys.executable
