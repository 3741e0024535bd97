"""Faults, load and hostile input: every job ends in exactly one state with a reason."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import (ROOT, all_jobs, gq_ok, job, pid_alive, submit, wait_for, wait_state,
                      write_script)


def host_process(daemon_pid: int) -> psutil.Process:
    def find():
        for child in psutil.Process(daemon_pid).children():
            if "gq.exec.host" in " ".join(child.cmdline()):
                return child
        return None

    return wait_for(find, 10, what="the execution host")


def test_killed_execution_host_is_noticed_and_replaced(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 300\n")
    plain, requeued = submit(str(script)), submit("--requeue", str(script))
    wait_state(plain, "RUNNING")
    wait_state(requeued, "RUNNING")
    host = host_process(daemon.pid())
    host.kill()
    killed_at = time.monotonic()
    info = wait_state(plain, "FAILED", timeout=10)
    noticed = time.monotonic() - killed_at
    assert info["reason"] == "execution host of cpu died"
    assert noticed < 2.0, f"daemon took {noticed:.2f}s to notice"
    again = wait_state(requeued, "RUNNING", timeout=10)  # on the fresh host
    assert again["run_count"] == 2
    assert host_process(daemon.pid()).pid != host.pid
    quick = write_script(tmp_path / "q.sh", "true\n")
    wait_state(submit(str(quick)), "COMPLETED")
    gq_ok("cancel", str(requeued))
    wait_state(requeued, "CANCELLED")


def test_cancel_ends_children_and_double_forked_grandchildren(daemon, tmp_path):
    script = write_script(tmp_path / "forks.py", (
        "import os, time\n"
        "pids = []\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(300); os._exit(0)\n"
        "middle = os.fork()\n"
        "if middle == 0:\n"
        "    grandchild = os.fork()\n"
        "    if grandchild == 0:\n"
        "        time.sleep(300); os._exit(0)\n"
        "    open('grandchild.pid', 'w').write(str(grandchild))\n"
        "    os._exit(0)  # the grandchild is orphaned: a classic double fork\n"
        "os.waitpid(middle, 0)\n"
        "open('child.pid', 'w').write(str(child))\n"
        "time.sleep(300)\n"
    ))
    job_id = submit(str(script))
    wait_for(lambda: (tmp_path / "child.pid").exists(), 30, what="the forks")
    pids = [int((tmp_path / name).read_text()) for name in ("child.pid", "grandchild.pid")]
    assert all(pid_alive(p) for p in pids)
    gq_ok("cancel", str(job_id))
    wait_state(job_id, "CANCELLED", timeout=10)
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, what="the whole tree to die")


def test_cancel_of_job_ignoring_sigterm_uses_sigkill(daemon, tmp_path):
    script = write_script(tmp_path / "stubborn.sh", "trap '' TERM\necho up\nwhile true; do sleep 0.1; done\n")
    job_id = submit(str(script))
    wait_for(lambda: (tmp_path / f"gq-{job_id}.out").exists()
             and "up" in (tmp_path / f"gq-{job_id}.out").read_text(), 10, what="the job")
    gq_ok("cancel", str(job_id))
    info = wait_state(job_id, "CANCELLED", timeout=10)
    assert info["exit_code"] == 128 + 9


def test_job_printing_200_mb_completes_and_daemon_memory_stays_flat(daemon, tmp_path):
    rss_before = psutil.Process(daemon.pid()).memory_info().rss
    script = write_script(tmp_path / "loud.sh", "yes 'gq output line' | head -c 209715200\n")
    job_id = submit(str(script))
    wait_state(job_id, "COMPLETED", timeout=120)
    assert (tmp_path / f"gq-{job_id}.out").stat().st_size == 200 << 20
    growth = psutil.Process(daemon.pid()).memory_info().rss - rss_before
    assert growth < 10 << 20, f"daemon grew {growth >> 20} MB"


SUBMITTER = """
import sys
from gq.cli.main import main
script = sys.argv[1]
for _ in range(int(sys.argv[2])):
    code = main(["submit", "--parsable", script])
    if code != 0:
        sys.exit(code)
"""

STATUS_LOOP = """
import sys, time
from gq.cli.main import main
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    if main(["status", "--json"]) != 0:
        sys.exit(1)
"""


def test_eight_concurrent_submitters_and_a_status_loop(daemon, tmp_path):
    script = write_script(tmp_path / "t.sh", "true\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    status = subprocess.Popen([sys.executable, "-c", STATUS_LOOP, "20"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    submitters = [subprocess.Popen([sys.executable, "-c", SUBMITTER, str(script), "100"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True) for _ in range(8)]
    ids, errors = [], []
    for process in submitters:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
        ids += [int(line) for line in out.split()]
        errors.append(err)
    status.terminate()
    _, status_err = status.communicate(timeout=30)
    assert len(ids) == 800 and len(set(ids)) == 800
    assert sorted(ids) == list(range(1, 801))
    assert not any("locked" in text for text in errors + [status_err])
    assert len(all_jobs()) == 800


def test_files_and_sockets_are_private(daemon):
    home = daemon.root
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for name in ("gq.db", "daemon.sock", "daemon.pid", "daemon.log"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=4096))
def test_fuzzed_daemon_socket_does_no_harm(daemon, payload):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.sendto(payload, str(daemon.root / "daemon.sock"))
    except OSError:
        pass
    finally:
        sock.close()
    assert pid_alive(daemon.pid())


def test_daemon_survives_fuzzing_and_still_runs_jobs(daemon, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    for size in (0, 1, 65507, 200_000):
        try:
            sock.sendto(os.urandom(size), str(daemon.root / "daemon.sock"))
        except OSError:
            pass  # larger than a datagram may be: refused by the kernel
    sock.close()
    script = write_script(tmp_path / "after.sh", "echo fine\n")
    wait_state(submit(str(script)), "COMPLETED")


HOSTILE = """
import gq, os, sys, time
from gq.exec import runtime
channel = runtime.active.channel
how = sys.argv[1]
if how == "garbage":
    channel.sock.sendall(b"\\x00\\xffnot json at all\\n{\\"no-op\\": 1}\\n[1, 2]\\n")
elif how == "oversized":
    channel.sock.sendall(b"{" + b"x" * (2 << 20))
time.sleep(0.5)
for _ in gq.steps(range(3)):
    pass
"""


def test_malformed_and_oversized_worker_messages_leave_the_host_unharmed(daemon, tmp_path):
    hostile = write_script(tmp_path / "hostile.py", HOSTILE)
    neighbour = write_script(tmp_path / "neighbour.py", (
        "import gq, time\n"
        "for _ in gq.steps(range(40)):\n"
        "    time.sleep(0.01)\n"
    ))
    host = host_process(daemon.pid())
    others = [submit(str(neighbour)) for _ in range(2)]
    garbage = submit(str(hostile), "garbage")
    oversized = submit(str(hostile), "oversized")
    # Malformed lines are dropped; the job's own valid messages still work.
    assert wait_state(garbage, "COMPLETED", timeout=60)["steps_done"] == 3
    # An oversized message costs the job its connection, so it cannot acquire: it fails.
    assert wait_state(oversized, "FAILED", timeout=60)["exit_code"] == 1
    for job_id in others:
        assert wait_state(job_id, "COMPLETED", timeout=60)["steps_done"] == 40
    assert host_process(daemon.pid()).pid == host.pid
    assert "dropping" in daemon.log()


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=8))
def test_channel_decoder_never_raises_on_arbitrary_bytes(chunks):
    from gq.exec.protocol import Channel

    left, right = socket.socketpair()
    channel = Channel(right)
    right.setblocking(False)
    try:
        for chunk in chunks:
            if chunk:
                left.sendall(chunk)
            for message in channel.receive():
                assert isinstance(message, dict) and isinstance(message["op"], str)
    finally:
        left.close()
        right.close()
