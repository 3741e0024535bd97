"""Faults, load and hostile input: every job ends in exactly one state with a reason."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import psutil
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gq import defaults

from conftest import (
    ROOT,
    DaemonControl,
    all_jobs,
    gq,
    gq_ok,
    job,
    live_hosts,
    pid_alive,
    submit,
    wait_for,
    wait_for_words,
    wait_state,
    write_script,
)


def host_process(daemon_pid: int, device: str | None = None) -> psutil.Process:
    """The execution host of the daemon's home (of ``device``, where the node has several: a
    GPU node has one for each GPU and one for its cpu device), as its pidfile names it: a
    host that runs holds its pidfile's lock. (Not the daemon's child: the suite's hosts are
    forked from tests/preloaded.py's server.)"""
    root = Path(psutil.Process(daemon_pid).cwd())  # a daemon works in its home

    def find():
        live = live_hosts(root)
        if device is None:
            return bool(live) and psutil.Process(live[0])
        said = (root / "hosts" / f"{device}.pid").read_text().split()
        return bool(said) and int(said[0]) in live and psutil.Process(int(said[0]))

    return wait_for(find, 10, what="the execution host")


def test_killed_execution_host_is_noticed_and_replaced(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 300\n")
    plain, requeued = submit(str(script)), submit("--requeue", str(script))
    device = wait_state(plain, "RUNNING")["device"]  # cpu; gpu0 on a GPU node
    assert wait_state(requeued, "RUNNING")["device"] == device
    host = host_process(daemon.pid(), device)
    host.kill()
    killed_at = time.time()
    info = wait_state(plain, "FAILED", timeout=10)
    # When the daemon ended the job, not when this test read it (its reads are slow on a
    # loaded machine).
    noticed = datetime.fromisoformat(info["end_time"]).timestamp() - killed_at
    assert info["reason"] == f"execution host of {device} died"
    assert noticed < 2.0, f"daemon took {noticed:.2f}s to notice"
    again = wait_state(requeued, "RUNNING", timeout=10)  # on the fresh host
    assert again["run_count"] == 2
    assert host_process(daemon.pid(), device).pid != host.pid
    quick = write_script(tmp_path / "q.sh", "true\n")
    wait_state(submit(str(quick)), "COMPLETED")
    gq_ok("cancel", str(requeued))
    wait_state(requeued, "CANCELLED")


def test_cancel_ends_children_and_double_forked_grandchildren(daemon, tmp_path):
    script = write_script(
        tmp_path / "forks.py",
        (
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
        ),
    )
    job_id = submit(str(script))
    pids = [
        int(wait_for_words(tmp_path / name, 1, 30, what="the forks")[0])
        for name in ("child.pid", "grandchild.pid")
    ]
    assert all(pid_alive(p) for p in pids)
    gq_ok("cancel", str(job_id))
    wait_state(job_id, "CANCELLED", timeout=10)
    wait_for(lambda: not any(pid_alive(p) for p in pids), 5, what="the whole tree to die")


def test_cancel_of_job_ignoring_sigterm_uses_sigkill(daemon, tmp_path):
    script = write_script(
        tmp_path / "stubborn.sh", "trap '' TERM\necho up\nwhile true; do sleep 0.1; done\n"
    )
    job_id = submit(str(script))
    wait_for(
        lambda: (
            (tmp_path / f"gq-{job_id}.out").exists()
            and "up" in (tmp_path / f"gq-{job_id}.out").read_text()
        ),
        10,
        what="the job",
    )
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
    status = subprocess.Popen(
        [sys.executable, "-c", STATUS_LOOP, "20"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    submitters = [
        subprocess.Popen(
            [sys.executable, "-c", SUBMITTER, str(script), "50"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    ids, errors = [], []
    for process in submitters:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
        ids += [int(line) for line in out.split()]
        errors.append(err)
    status.terminate()
    _, status_err = status.communicate(timeout=30)
    assert len(ids) == 400 and len(set(ids)) == 400
    assert sorted(ids) == list(range(1, 401))
    assert not any("locked" in text for text in errors + [status_err])
    assert len(all_jobs()) == 400


def test_files_and_sockets_are_private(daemon):
    home = daemon.root
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    for name in ("gq.db", "gq.sock", "daemon.pid", "daemon.log"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    for name in ("spool", "hosts"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o700, name


def _exchange(root, payload: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes on the daemon's stream socket; what it answers before closing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(root / "gq.sock"))
    try:
        sock.sendall(payload)
    except OSError:
        pass  # it may close on us mid-send (an oversized request)
    answer = b""
    try:
        while chunk := sock.recv(1 << 16):
            answer += chunk
    except OSError:
        pass
    sock.close()
    return answer


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    payload=st.one_of(
        st.binary(max_size=4096),
        st.dictionaries(
            st.sampled_from(["v", "kind", "labels", "states", "script", "options", "name", "x"]),
            st.one_of(
                st.none(),
                st.integers(),
                st.text(max_size=20),
                st.lists(st.text(max_size=5), max_size=3),
                st.sampled_from([1, "submit", "list", "cancel", "show"]),
            ),
            max_size=6,
        ).map(lambda d: json.dumps(d).encode()),
    )
)
@example(payload=b'{"v": "\\n"}')  # a version that is a newline: once quoted raw
def test_fuzzed_requests_get_an_error_answer_and_do_no_harm(daemon, payload):
    from gq import messages

    answer = _exchange(daemon.root, payload.replace(b"\n", b" ") + b"\n")
    decoded = messages.decode(answer.strip(), messages.ANSWERS)  # always a well-formed answer
    if isinstance(decoded, messages.Error):
        assert decoded.exit_code == 2 and "\n" not in decoded.message
    assert pid_alive(daemon.pid())


def test_silent_garbage_and_huge_clients_neither_block_others_nor_crash_it(home, tmp_path):
    from gq import messages

    daemon = DaemonControl(home)
    daemon.start("--client-timeout", "3")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(daemon.root / "gq.sock"))  # connects, then says nothing
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(str(daemon.root / "gq.sock"))
    # Half a request, never finished.
    half.sendall(b'{"v": %d, "kind": "li' % defaults.PROTOCOL_VERSION)
    started = time.monotonic()
    assert gq_ok("status").startswith("JOBID")
    assert time.monotonic() - started < 5
    garbage = messages.decode(
        _exchange(daemon.root, b"\x00\xff garbage\n").strip(), messages.ANSWERS
    )
    assert isinstance(garbage, messages.Error) and "malformed request" in garbage.message
    huge = _exchange(daemon.root, b"x" * (100 << 20) + b"\n", timeout=60)
    refused = messages.decode(huge.strip(), messages.ANSWERS)
    assert isinstance(refused, messages.Error) and "over 8388608 bytes" in refused.message
    assert pid_alive(daemon.pid())
    wait_for(lambda: silent.recv(1) == b"", 30, what="the silent client to be dropped")
    assert time.monotonic() - started >= 2.9  # not before --client-timeout
    silent.close()
    half.close()
    script = write_script(tmp_path / "after.sh", "echo fine\n")
    wait_state(submit(str(script)), "COMPLETED")


def test_protocol_versions_that_differ_say_so_in_one_line(daemon, monkeypatch):
    from gq import messages

    answer = messages.decode(
        _exchange(daemon.root, b'{"v": 99, "kind": "list"}\n').strip(), messages.ANSWERS
    )
    assert isinstance(answer, messages.Error)
    assert f"protocol version {defaults.PROTOCOL_VERSION} and the client 99" in answer.message
    ours = defaults.PROTOCOL_VERSION
    with monkeypatch.context() as patch:
        patch.setattr(defaults, "PROTOCOL_VERSION", 99)
        result = gq("status")
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1
    assert f"the daemon speaks protocol version {ours} and this gq speaks 99" in result.err


def test_a_stop_ends_the_jobs_of_a_host_the_daemon_has_just_let_go(daemon, tmp_path):
    """A daemon lets go of a host that hangs up while alive and attaches it again a second
    later; a `gq daemon stop` in that second used to leave the host and its jobs running."""
    job_id = submit(str(write_script(tmp_path / "s.sh", "sleep 300\n")))
    wait_state(job_id, "RUNNING")
    host = host_process(daemon.pid())
    intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # root's own connection: the host takes it for a newer daemon and drops the old
        intruder.connect(str(daemon.root / "hosts" / "cpu.sock"))
        wait_for(
            lambda: "let go of the execution host" in daemon.log(),
            10,
            interval=0.005,
            what="the daemon to let its host go",
        )
        gq_ok("daemon", "stop")
    finally:
        intruder.close()
    assert wait_for(
        lambda: not host.is_running() or host.status() == psutil.STATUS_ZOMBIE,
        15,
        what="the host to exit",
    )
    assert live_hosts(daemon.root) == []
    gq_ok("daemon", "start")
    info = job(job_id)
    assert (info["state"], info["reason"]) == ("FAILED", "daemon stopped")
