"""The suite's own fixtures leave nothing running: a test that fails, with a daemon whose
stop then fails too, still has its daemon, hosts and jobs killed when it is over."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from conftest import ROOT, pid_alive, wait_for

# Run by a pytest of its own with this suite's conftest as a plugin: a running job, then a
# daemon that answers nothing (stopped), and a failure. The home fixture's stop can only
# time out (after a second, not the client's two minutes).
FAILING_TEST = """\
import json, os, signal

from conftest import live_hosts, submit, wait_for_words, write_script
from gq import defaults


def test_hung(home, tmp_path, monkeypatch):
    submit(str(write_script(tmp_path / "s.sh", "echo $$ > job.pid; exec sleep 300\\n")))
    job = int(wait_for_words(tmp_path / "job.pid", 1, what="the job to start")[0])
    daemon = int((home / "daemon.pid").read_text())
    with open(os.environ["LEFT_RUNNING"], "w") as left:
        json.dump([daemon, *live_hosts(home), job], left)
    monkeypatch.setattr(defaults, "CLIENT_TIMEOUT", 1.0)
    os.kill(daemon, signal.SIGSTOP)
    assert False, "fails on purpose"
"""


def test_a_failed_test_whose_daemon_stop_fails_leaves_nothing_running(tmp_path):
    test = tmp_path / "test_failing.py"
    test.write_text(FAILING_TEST)
    record = tmp_path / "left.json"
    # Short: the inner test's sockets must fit a Unix socket's path (108 bytes).
    inner = tempfile.mkdtemp(prefix="gq-inner-")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"), LEFT_RUNNING=str(record))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            f"--basetemp={inner}",
            f"--rootdir={tmp_path}",
            str(test),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert record.exists(), run.stdout[-3000:]
    pids = json.loads(record.read_text())
    try:
        assert "1 failed, 1 error" in run.stdout, run.stdout[-2000:]
        assert "Unreachable" in run.stdout or "the daemon did not answer" in run.stdout
        assert len(pids) == 3  # the daemon, the cpu device's host, the job
        wait_for(lambda: not any(map(pid_alive, pids)), 10, what="the daemon, host and job to die")
    finally:
        for pid in pids:  # killed here when the fixture did not (and the test failed)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(inner, ignore_errors=True)
