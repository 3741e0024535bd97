"""One user cannot hurt the node: hostile values on every wire end only their sender's job
or request, loops survive them, limits hold, and nothing a job starts outlives it. Real
daemon, real hosts, real workers; the system-mode side (other users) is in
test_shared_node_hardening.py."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from test_reliability import host_process

from gq import messages
from gq.defaults import PROTOCOL_VERSION as VERSION
from gq.exec.host.messages import HOST_VERSION

from conftest import (
    DaemonControl,
    all_jobs,
    cgroups_usable,
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

NEIGHBOUR = "import gq, time\nfor _ in gq.steps(range(40)):\n    time.sleep(0.01)\n"

# Each task of the array sends one hostile line on its worker's own socket, then iterates.
HOSTILE = r"""
import gq, json, os, time
from gq.exec.job import session as job_session
sock = job_session.active.channel.sock
frames = [
    b'{"kind": "total", "steps": null}\n',
    b'{"kind": "total", "steps": ' + str(2**70).encode() + b'}\n',
    b'{"kind": "done", "steps": 1, "mem_persistent": "abc"}\n',
    b'{"kind": "done", "steps": NaN}\n',
    b'[' * 100000 + b']' * 100000 + b'\n',
    b'{"kind": "progress", "steps": "' + b'x' * 300000 + b'"}\n',
    b'\x00\xffnot json at all\n',
    b'{' + b'x' * (2 << 20),
    b'{"kind": "oom", "held": null}\n',
    b'{"kind": "oom", "held": 1, "wanted": [[[1]]]}\n',
    # A NUL in what the refusal quotes: its exit report once held it, and the daemon could
    # never take that report (the host sent it again at every attach).
    b'{"kind": "ready", "x\\u0000": 1}\n',
    b'{"kind": "done", "steps": -1, "kind": "\\u0000"}\n',
    b'{"x": ' + b'[' * 5000 + b']' * 5000 + b', "kind": "ready"}\n',
]
sock.sendall(frames[int(os.environ["SLURM_ARRAY_TASK_ID"])])
time.sleep(0.5)
for _ in gq.steps(range(3)):
    pass
"""
FRAGMENTS = [
    "total.steps: expected `int`, got `null`",
    "total.steps: expected `int` <= 9223372036854775807",
    "done.mem_persistent",
    "not JSON (JSON is malformed: invalid character",
    "not a JSON object",
    "progress.steps: expected `int`, got `str`",
    "not JSON",
    "a message over 1048576 bytes",
    "oom.held: expected `int`, got `null`",
    "oom.wanted: expected `int | null`, got `array`",
    "ready: object contains unknown field `x\\x00`",
    "\\x00.steps: expected `int` >= 0",
    "nested too deeply",
]


def _db(home: Path) -> sqlite3.Connection:
    """The queue, opened behind the daemon's back: how a row an older gq wrote, or a
    corrupted one, gets there."""
    connection = sqlite3.connect(home / "gq.db", timeout=30, isolation_level=None)
    return connection


def test_hostile_worker_frames_end_only_their_own_job(daemon, tmp_path):
    host = host_process(daemon.pid())
    neighbours = [submit(str(write_script(tmp_path / "n.py", NEIGHBOUR))) for _ in range(2)]
    hostile = submit(
        "--array", f"0-{len(FRAGMENTS) - 1}", str(write_script(tmp_path / "hostile.py", HOSTILE))
    )
    tasks = sorted(
        (j for j in all_jobs() if j["array_job_id"] == hostile), key=lambda j: j["array_task_id"]
    )
    for task, fragment in zip(tasks, FRAGMENTS):
        info = wait_state(task["id"], "FAILED", timeout=60)
        assert info["reason"].startswith("protocol error: its worker sent"), info["reason"]
        assert fragment in info["reason"], (fragment, info["reason"])
    for job_id in neighbours:
        assert wait_state(job_id, "COMPLETED", timeout=60)["steps_done"] == 40
    assert host_process(daemon.pid()).pid == host.pid  # the host never went down
    assert gq("daemon", "status").code == 0 and len(all_jobs()) == 2 + len(FRAGMENTS)
    assert len(gq_ok("history").splitlines()) == 1 + 2 + len(FRAGMENTS)


def test_an_absurd_total_fails_in_the_script_not_in_the_daemon(daemon, tmp_path):
    script = write_script(tmp_path / "huge.py", "import gq\ngq.set_total_steps(2**70)\n")
    info = wait_state(submit(str(script)), "FAILED", timeout=60)
    assert info["exit_code"] == 1
    out = (tmp_path / f"gq-{info['id']}.out").read_text()
    assert "gq.set_total_steps(1180591620717411303424)" in out and "ValueError" in out
    assert gq("status", "--all").code == 0


def test_worker_step_counts_are_held_to_what_is_plausible(daemon, tmp_path):
    script = write_script(
        tmp_path / "claims.py",
        (
            "import gq\n"
            "from gq.exec.job import session as job_session\n"
            "for _ in gq.steps(range(5)):\n"
            "    pass\n"
            "job_session.active.channel.send('progress', steps=10**12)\n"  # more than it declared
            "job_session.active.channel.send('progress', steps=1)\n"  # fewer than it did
        ),
    )
    info = wait_state(submit(str(script)), "COMPLETED", timeout=60)
    assert (info["steps_done"], info["steps_total"]) == (5, 5)


def test_an_output_fifo_nobody_reads_fails_its_job_at_once(daemon, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = write_script(tmp_path / "s.sh", "echo hi\n")
    started = time.monotonic()
    info = wait_state(submit("-o", str(fifo), str(script)), "FAILED", timeout=20)
    assert "is a FIFO that nobody reads" in info["reason"]
    assert time.monotonic() - started < 10  # the host never waited for a reader
    wait_state(submit(str(script)), "COMPLETED")


def test_a_terminal_as_output_neither_captures_nor_hangs_up_the_daemon(daemon, tmp_path):
    master, slave = os.openpty()
    terminal = os.ttyname(slave)
    os.close(slave)
    try:
        job_id = submit("-o", terminal, str(write_script(tmp_path / "t.sh", "echo on-tty\n")))
        assert wait_state(job_id, "COMPLETED")["exit_code"] == 0
        assert b"on-tty" in os.read(master, 1024)
        result = gq("logs", str(job_id))
        assert result.code == 2 and "is not a regular file" in result.err
    finally:
        os.close(master)  # a daemon holding the terminal would get SIGHUP now
    time.sleep(0.2)
    assert pid_alive(daemon.pid()) and gq("status").code == 0


def test_export_reads_a_snapshot_with_a_bound(daemon, tmp_path):
    job_id = submit("--hold", str(write_script(tmp_path / "s.sh", "echo hi\n")))
    snapshot = Path(job(job_id)["script"]).name
    spool = daemon.root / "spool" / str(job_id) / snapshot
    with open(spool, "r+b") as handle:
        handle.truncate(200 << 30)  # a sparse 200 GB file
    result = gq("export", "slurm", str(job_id))
    assert result.code == 2 and "has grown past 4 MiB" in result.err
    assert gq("status").code == 0


def test_the_daemon_and_hosts_import_nothing_from_their_callers(home, tmp_path, monkeypatch):
    trap = tmp_path / "trap"
    trap.mkdir()
    for name in ("array", "typer", "sqlalchemy", "selectors", "json", "gq_evil"):
        (trap / f"{name}.py").write_text(f"raise SystemExit('user {name}.py imported')\n")
    monkeypatch.chdir(trap)
    monkeypatch.setenv("PYTHONPATH", str(trap))
    monkeypatch.setenv("PYTHONSTARTUP", str(trap / "array.py"))
    gq_ok("daemon", "start")
    job_id = submit(str(write_script(tmp_path / "s.sh", "true\n")))
    assert wait_state(job_id, "COMPLETED")["exit_code"] == 0  # the host started too
    log = (home / "daemon.log").read_text() + (home / "hosts" / "cpu.log").read_text()
    assert "imported" not in log
    daemon_pid = int((home / "daemon.pid").read_text())
    assert Path(f"/proc/{daemon_pid}/cwd").resolve() == home.resolve()


def test_host_death_kills_everything_its_jobs_started(daemon, tmp_path):
    """A daemonised grandchild (its own session, parent 1) dies with its job's host, and a
    requeued job's old run is gone before its new run starts."""
    script = write_script(
        tmp_path / "escape.sh",
        (
            "setsid sh -c 'echo $$ > escaped-$GQ_JOB_ID-$$; while true; do sleep 0.05; done' &\n"
            "echo run >> runs-$GQ_JOB_ID\n"
            "sleep 300\n"
        ),
    )
    plain, requeued = submit(str(script)), submit("--requeue", str(script))
    escaped, devices = {}, set()
    for job_id in (plain, requeued):
        devices.add(wait_state(job_id, "RUNNING")["device"])  # cpu; gpu0 on a GPU node
        escaped[job_id] = wait_for(
            lambda j=job_id: list(tmp_path.glob(f"escaped-{j}-*")),
            20,
            what="the escaped grandchild",
        )[0]
    pids = {
        j: int(wait_for_words(path, 1, what="the grandchild's pid")[0])
        for j, path in escaped.items()
    }
    assert all(pid_alive(pid) for pid in pids.values())
    (device,) = devices
    host_process(daemon.pid(), device).kill()
    assert wait_state(plain, "FAILED", timeout=15)["reason"] == f"execution host of {device} died"
    wait_for(lambda: job(requeued)["run_count"] == 2, 20, what="the requeued job's second run")
    for pid in pids.values():
        assert not pid_alive(pid), "a process of a job outlived its host"
    gq_ok("cancel", str(requeued))
    wait_state(requeued, "CANCELLED")


def test_a_launch_too_large_for_the_wire_fails_only_its_job(daemon, tmp_path):
    """A row from before the payload limit (written behind the daemon's back here)."""
    script = write_script(tmp_path / "s.sh", "true\n")
    job_id = submit("--hold", str(script))
    db = _db(daemon.root)
    db.execute(
        "UPDATE payloads SET env = ? WHERE id = (SELECT payload_id FROM jobs WHERE id = ?)",
        (json.dumps({f"HUGE{i}": "x" * 260_000 for i in range(5)}), job_id),
    )
    db.close()
    host = host_process(daemon.pid())
    gq_ok("release", str(job_id))
    info = wait_state(job_id, "FAILED", timeout=20)
    assert f"cannot launch job {job_id}" in info["reason"] and "frame" in info["reason"]
    assert host_process(daemon.pid()).pid == host.pid
    wait_state(submit(str(script)), "COMPLETED")


def test_an_output_path_too_long_once_expanded_is_refused_at_submit(daemon, tmp_path):
    """-o '%x%x...' with a 255-character name resolves past PATH_MAX: refused at submit (it
    once reached the host, which dropped the daemon over it at every launch)."""
    script = write_script(tmp_path / "s.sh", "true\n")
    result = gq("submit", "-J", "N" * 255, "-o", "%x" * 20, str(script))
    assert result.code == 2 and "output path '%x%x" in result.err and "4096" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert all_jobs() == [] and not list(daemon.root.glob("spool/*"))
    assert gq("status").code == 0


def test_a_launch_the_hosts_wire_would_refuse_fails_only_its_job(daemon, tmp_path):
    """A stored value past a bound of the host's wire (written behind the daemon's back
    here) fails its own launch; the host keeps the daemon, its other jobs run on, and a
    cancel is never lost to a launch that cannot arrive."""
    script = write_script(tmp_path / "s.sh", "true\n")
    neighbour = submit(str(write_script(tmp_path / "n.py", NEIGHBOUR)))
    job_id = submit("--hold", str(script))
    db = _db(daemon.root)
    db.execute(
        "UPDATE payloads SET env = ? WHERE id = (SELECT payload_id FROM jobs WHERE id = ?)",
        (json.dumps({"A": "x\u0000y"}), job_id),
    )
    db.close()
    host = host_process(daemon.pid())
    gq_ok("release", str(job_id))
    info = wait_state(job_id, "FAILED", timeout=20)
    assert f"cannot launch job {job_id}" in info["reason"], info["reason"]
    assert "launch.job.env['A']: holds a NUL character" in info["reason"], info["reason"]
    assert wait_state(neighbour, "COMPLETED", timeout=60)["steps_done"] == 40
    assert host_process(daemon.pid()).pid == host.pid
    wait_state(submit(str(script)), "COMPLETED")


def test_a_workers_memory_claims_are_believed_only_as_far_as_its_host_sees_them(daemon, tmp_path):
    """A worker that reports 2**63-1 bytes used is believed only as far as its host sees
    its processes hold (its cgroup, on the cpu device, whose memory is the host's): its
    probe's figure is what they held, the next job starts beside it, 'gq info' answers and
    shows the claim as a claim, and both complete. Where no cgroup counts its memory, it is
    believed up to its lane, no further, and the next job waits for room."""
    gq_ok("policy", "set", "fair")  # (under fifo the next job would wait for it anyway)
    claim = write_script(
        tmp_path / "claim.py",
        (
            "import os, time, gq\n"
            "from gq.exec.job import session as job_session\n"
            "session = job_session.active\n"
            "session.acquire()\n"
            "session.held = False\n"
            "session.channel.send('done', steps=1, mem_persistent=2**63 - 1, mem_peak=2**63 - 1)\n"
            "while not os.path.exists('go'):\n"
            "    time.sleep(0.02)\n"
        ),
    )
    claimer = submit(str(claim))
    probed = wait_for(
        lambda: (info := job(claimer))["mem_basis"] == "measured" and info,
        20,
        what="its probe to end",
    )
    lane = json.loads(gq_ok("info", "--json"))["devices"][0]["memory_total"]
    other = submit(str(write_script(tmp_path / "n.py", NEIGHBOUR)))
    if cgroups_usable("auto", memory=True):
        assert 0 < probed["mem"] < 1 << 30 < lane, probed["mem"]  # what its cgroup held
        assert wait_state(other, "COMPLETED", timeout=60)["steps_done"] == 40
        assert job(claimer)["state"] == "RUNNING"  # beside it, not after it
    else:
        assert probed["mem"] == lane  # believed up to its lane, no further
        assert wait_for(lambda: job(other)["reason"] == "Resources", 20, what="the next to wait")
    assert gq("info").code == 0 and gq("info", "--json").code == 0
    (tmp_path / "go").touch()
    wait_state(claimer, "COMPLETED", timeout=30)
    assert wait_state(other, "COMPLETED", timeout=60)["steps_done"] == 40


def test_the_daemon_checks_a_new_name_itself(daemon):
    """The client checks names too, but the daemon trusts no client."""
    job_id = submit("--hold", str(write_script(daemon.root.parent / "s.sh", "true\n")))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.root / "gq.sock"))
        sock.sendall(
            json.dumps(
                {"v": VERSION, "kind": "update", "labels": [str(job_id)], "name": "\u001b[2Jgone"}
            ).encode()
            + b"\n"
        )
        answer = sock.makefile("rb").readline()
    assert b"printable" in answer and b'"exit_code":2' in answer.replace(b" ", b""), answer
    assert job(job_id)["name"] == "s.sh"


def test_a_big_array_with_big_arguments_lists_small_and_shows_its_first_tasks(daemon, tmp_path):
    """800 tasks that share 240 KB of arguments: listing the queue carries none of them (it
    once sent 190 MB to everyone who typed 'gq status'), each task listed or not, and 'gq
    show' of the array details its first 100 tasks and says how many more there are."""
    big = "a" * 120_000
    array = submit(
        "--hold", "--array", "0-799", str(write_script(tmp_path / "s.sh", "true\n")), big, big
    )
    listing = gq("status", "--json", "--array-tasks")
    assert listing.code == 0 and len(listing.out) < 4 << 20, (listing.code, listing.err)
    jobs = json.loads(listing.out)
    assert len(jobs) == 800 and "args" not in jobs[0] and jobs[0]["state"] == "PENDING"
    (folded,) = json.loads(gq_ok("status", "--json"))
    assert folded["array_task_count"] == 800 and "args" not in folded
    shown = gq("show", "--json", str(array))
    assert shown.code == 0, shown.err
    tasks = json.loads(shown.out)
    assert [t["array_task_id"] for t in tasks] == list(range(100))
    assert tasks[0]["args"] == [big, big] and tasks[0]["events"][0]["new_state"] == "PENDING"
    assert "700 more tasks of array" in shown.err
    gq_ok("cancel", str(array))


def test_hostile_requests_get_one_error_each_and_store_nothing(daemon):
    def exchange(line: bytes) -> messages.Error:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(daemon.root / "gq.sock"))
            sock.sendall(line)
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = sock.recv(1 << 16)
                assert chunk, "the daemon hung up without answering"
                answer += chunk
        return messages.decode(answer.strip(), messages.ANSWERS)

    submit_line = {
        "v": VERSION,
        "kind": "submit",
        "script_path": "/tmp/s.sh",
        "script": "dHJ1ZQo=",
        "args": [],
        "workdir": "/tmp",
        "env": {},
        "umask": 18,
        "options": {},
    }
    hostile = [
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        b'{"v": %d, "kind": "cancel", "labels": ["99999999999999999999"]}\n' % VERSION,
        b'{"v": %d, "kind": "update", "labels": ["1"], "priority": ' % VERSION + b"9" * 30 + b"}\n",
    ]
    for change in (
        {"env": {"A": "b\u0000c"}},
        {"env": {"A=B": "c"}},
        {"args": ["\ud800"]},
        {"options": {"deadline": 1e21}},
        {"options": {"name": "x\u0000y"}},
        {"options": {"name": "\u001b[2Jwipe"}},
        {"options": {"priority": 2**70}},
        {"script_path": "/tmp/.."},
        {"test_only": None},
        {"test_only": 2**70},
        {"test_only": "yes"},
        {"test_only": 1},
        {"test_only": [[[True]]]},
        {"options": {"oom": None}},
        {"options": {"oom": 2**70}},
        {"options": {"oom": "explode"}},
        {"options": {"oom": "\u0000"}},
        {"options": {"oom": [[["fail"]]]}},
    ):
        hostile.append(json.dumps({**submit_line, **change}).encode() + b"\n")
    for value in (None, 2**70, "yes", 1, [[[True]]], "\u0000"):
        hostile.append(
            json.dumps({"v": VERSION, "kind": "list", "forecast": value}).encode() + b"\n"
        )
    hostile.append(b'{"v": %d, "kind": "list", "forecast": NaN}\n' % VERSION)
    for line in hostile:
        answer = exchange(line)
        assert isinstance(answer, messages.Error) and answer.exit_code == 2, line[:80]
        assert "\n" not in answer.message
    assert all_jobs() == [] and gq("daemon", "status").code == 0


def test_rows_no_valid_gq_writes_cannot_break_anyones_queries(daemon, tmp_path):
    job_id = submit("--hold", str(write_script(tmp_path / "s.sh", "true\n")))
    db = _db(daemon.root)
    db.execute("UPDATE jobs SET name = ? WHERE id = ?", ("\x1b[2Jgone\nfake row", job_id))
    db.close()
    status = gq_ok("status")
    assert "\x1b" not in status and "\\x1b[2Jgone\\nfake row" in status
    assert "\\x1b" in gq_ok("show", str(job_id))


def test_per_user_limits_are_refused_before_anything_is_stored(home, tmp_path):
    control = DaemonControl(home)
    control.start("--max-pending", "5", "--max-array", "10")
    script = write_script(tmp_path / "s.sh", "true\n")
    result = gq("submit", "--hold", "--array", "0-5", str(script))
    assert result.code == 2 and "limit of 5 pending jobs per user" in result.err
    assert "--max-pending" in result.err
    started = time.monotonic()
    result = gq("submit", "--array", "0-3999999", str(script))  # counted, never expanded
    assert result.code == 2 and "4000000 tasks is more than" in result.err
    assert time.monotonic() - started < 5
    assert all_jobs() == []
    info = gq_ok("info")
    assert "5 pending jobs per user, 10 tasks per array" in info
    control.stop()


def _big_script(path: Path, mib: int) -> Path:
    return write_script(path, "true\nexit 0\n" + ("x" * 1023 + "\n") * (mib << 10))


def test_a_users_spool_is_bounded_and_their_oldest_finished_scripts_go_first(home, tmp_path):
    """10,000 pending jobs of 4 MiB each would be 40 GB of one user's scripts on the node's
    disk: the spool keeps at most --max-spool of each user's, the snapshots of their jobs
    that ended longest ago making room first, and refuses what their unfinished jobs' alone
    cannot fit, storing nothing."""
    control = DaemonControl(home)
    control.start("--max-spool", "6M")
    spool = home / "spool"
    done = submit(str(_big_script(tmp_path / "a.sh", 3)))
    wait_state(done, "COMPLETED")
    held = submit("--hold", str(_big_script(tmp_path / "b.sh", 2)))  # 5 MiB kept: fits
    assert (spool / str(done)).exists()
    newer = submit("--hold", str(_big_script(tmp_path / "c.sh", 2)))  # 7: the old one goes
    assert not (spool / str(done)).exists() and (spool / str(held)).exists()
    result = gq("requeue", str(done))
    assert result.code == 2 and "dropped from the spool" in result.err
    result = gq("export", "slurm", str(done))
    assert result.code == 2 and "dropped from the spool" in result.err
    assert job(done)["state"] == "COMPLETED"
    before = sorted(os.listdir(spool))
    result = gq("submit", "--hold", str(_big_script(tmp_path / "d.sh", 3)))
    assert result.code == 2 and "--max-spool" in result.err and "limit of 6" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert [j["id"] for j in all_jobs()] == [done, held, newer]
    assert sorted(os.listdir(spool)) == before
    assert "of them kept per user" in gq_ok("info")
    control.stop()


def test_a_big_array_is_held_released_and_cancelled_in_one_statement_each(home, tmp_path):
    """Linear in the number of tasks (bench/abuse.py times 9,999 of them)."""
    control = DaemonControl(home)
    control.start("--max-array", "3000", "--max-pending", "3001")
    script = write_script(tmp_path / "s.sh", "true\n")
    blocker = submit("--hold", str(script))  # keeps the released tasks from starting
    array = submit("--hold", "--array", "0-2999", "--dependency", f"afterok:{blocker}", str(script))
    assert gq_ok("release", str(array)).count("Released job") == 3000
    assert gq_ok("hold", str(array)).count("Held job") == 3000
    gq_ok("cancel", str(blocker))
    result = gq_ok("cancel", str(array))
    assert result.count("Cancelled job") == 3000
    assert {j["state"] for j in all_jobs()} == {"CANCELLED"}
    db = _db(home)
    events = db.execute("SELECT count(*) FROM job_events WHERE new_state = 'CANCELLED'").fetchone()
    payloads = db.execute("SELECT count(*) FROM payloads").fetchone()
    db.close()
    assert events == (3001,) and payloads == (2,)  # the array's tasks share one payload
    control.stop()


def _idle_connections(home: Path, count: int) -> list[socket.socket]:
    """``count`` clients that connect and say nothing, once only the test's own client is
    left (the daemon start's connection has been dropped when a status is served)."""
    gq_ok("status")
    idle = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(home / "gq.sock"))
        idle.append(sock)
    return idle


def test_connections_per_user_are_bounded_and_the_daemon_keeps_accepting(home):
    control = DaemonControl(home)
    control.start("--max-connections-per-user", "4")
    idle = _idle_connections(home, 4)
    wait_for(
        lambda: "connections to the daemon open" in gq("status").err,
        10,
        what="the fifth connection to be refused",
    )
    result = gq("status")
    assert result.code == 1 and "--max-connections-per-user" in result.err
    for sock in idle:
        sock.close()
    wait_for(lambda: gq("status").code == 0, 10, what="the daemon to serve again")
    control.stop()


def test_the_daemon_raises_its_descriptor_limit_and_bounds_all_connections(home):
    """Started with systemd's kind of soft limit, the daemon raises it to the hard one; past
    --max-connections in all, a new client is told so and the daemon keeps serving."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 300:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")
    control = DaemonControl(home)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    try:
        pid = control.start("--max-connections", "6")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    limits = Path(f"/proc/{pid}/limits").read_text()
    line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    assert line.split()[3] == line.split()[4] != "256", line
    idle = _idle_connections(home, 6)
    wait_for(
        lambda: "--max-connections)" in gq("status").err,
        10,
        what="a connection past the total to be refused",
    )
    for sock in idle:
        sock.close()
    wait_for(lambda: gq("status").code == 0, 10, what="the daemon to serve again")
    control.stop()


def test_finished_jobs_are_purged_after_the_retention(home, tmp_path):
    control = DaemonControl(home)
    control.start("--retention", "1s")
    done = submit(str(write_script(tmp_path / "s.sh", "true\n")))
    wait_state(done, "COMPLETED")
    held = submit("--hold", "--dependency", f"afterok:{done}", str(tmp_path / "s.sh"))
    old = submit(str(tmp_path / "s.sh"))
    wait_state(old, "COMPLETED")
    time.sleep(1.2)
    gq_ok("daemon", "restart")  # a starting daemon purges at once
    remaining = wait_for(
        lambda: [j["id"] for j in all_jobs()] if len(all_jobs()) == 2 else None,
        20,
        what="the purge",
    )
    assert remaining == [done, held]  # kept: a pending job depends on it
    assert not (home / "spool" / str(old)).exists()
    assert "finished jobs are kept 1 second after" in gq("history").err
    control.stop()


def test_a_running_job_reports_its_processes_and_host_memory(daemon, tmp_path):
    if not cgroups_usable("auto"):
        pytest.skip("no cgroup hierarchy to keep jobs in on this machine")
    job_id = submit(str(write_script(tmp_path / "s.sh", "sleep 300 & sleep 300 & wait\n")))
    info = wait_for(
        lambda: (j := job(job_id))["processes"] == 3 and j, 20, what="the job's three processes"
    )
    assert info["host_memory"] > 0
    assert "Processes: 3" in gq_ok("show", str(job_id))
    gq_ok("cancel", str(job_id))
    wait_state(job_id, "CANCELLED")


def test_jobs_are_kept_in_cgroup_v2_where_one_is_mounted(home, tmp_path):
    if not cgroups_usable("v2"):
        pytest.skip("no cgroup v2 hierarchy this process may use")
    control = DaemonControl(home)
    control.start("--cgroup", "v2")
    assert "jobs kept in cgroup v2" in gq_ok("info")
    script = write_script(
        tmp_path / "escape.sh", ("setsid sh -c 'echo $$ > escaped; exec sleep 300' &\nsleep 300\n")
    )
    job_id = submit(str(script))
    pid = int(
        wait_for(
            lambda: (tmp_path / "escaped").exists() and (tmp_path / "escaped").read_text().strip(),
            20,
            what="the escapee",
        )
    )
    gq_ok("cancel", str(job_id))
    wait_state(job_id, "CANCELLED")
    wait_for(lambda: not pid_alive(pid), 10, what="the escaped process to die with its job")
    control.stop()


def test_under_systemds_supervisor_leaf_jobs_cgroups_go_beside_it(home, tmp_path):
    """packaging/gq.service has systemd start the daemon in its unit cgroup's leaf
    'supervisor' (DelegateSubgroup=): on v2, which passes controllers only below cgroups
    that hold no processes, the jobs' cgroups go beside that leaf, in the unit's cgroup.
    Below it (where they went), v2 could pass them no memory controller at all. Only where
    systemd marked the unit's cgroup delegated: a 'supervisor' elsewhere changes nothing."""
    import sys
    import uuid

    from gq.exec.cgroups import hierarchies

    if not cgroups_usable("v2"):
        pytest.skip("no cgroup v2 hierarchy this process may use")
    point, root = hierarchies.mounts()[hierarchies.V2]
    own = hierarchies._directory(point, root, hierarchies.own_cgroups()[hierarchies.V2])
    unit = Path(own) / f"gq-test-{uuid.uuid4().hex[:8]}.service"
    supervisor = unit / hierarchies.SUPERVISOR
    supervisor.mkdir(parents=True)

    def into_supervisor() -> None:  # as systemd starts a unit's main process
        with open(supervisor / "cgroup.procs", "w") as procs:
            procs.write(str(os.getpid()))

    def base_seen_there() -> Path:
        found = subprocess.run(
            [
                sys.executable,
                "-c",
                "from gq.exec.cgroups import job_cgroups as cgroups; "
                "from gq.exec.cgroups.hierarchies import V2; "
                "print(cgroups.detect('v2', 'probe').bases[V2])",
            ],
            preexec_fn=into_supervisor,
            capture_output=True,
            text=True,
            check=True,
        )
        base = Path(found.stdout.strip())
        base.rmdir()
        return base

    try:
        assert base_seen_there().parent == supervisor  # not delegated: below, as before
    except BaseException:
        _remove_cgroup_tree(unit, None)
        raise
    os.setxattr(unit, "trusted.delegate", b"1")  # as systemd marks a delegated unit
    assert base_seen_there().parent == unit

    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gq.cli.main",
            "daemon",
            "start",
            "--foreground",
            "--cgroup",
            "v2",
            "--kill-wait",
            "1",
        ],
        preexec_fn=into_supervisor,
        env={**os.environ, "GQ_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: gq("daemon", "status").code == 0, 30, what="the daemon")
        script = write_script(
            tmp_path / "where.sh",
            (
                "cat /proc/self/cgroup > where-$GQ_JOB_ID\n"
                "while [ ! -e leave ]; do sleep 0.05; done\n"
            ),
        )
        job_id = submit(str(script))
        lines = wait_for_words(tmp_path / f"where-{job_id}", 1, what="the job's cgroup")
        path = next(line for line in lines if line.startswith("0::")).split("::", 1)[1]
        relative = "/" + os.path.relpath(unit, point)
        assert path.startswith(f"{relative}/gq-") and "/supervisor/" not in path, path
        for pid in [daemon.pid, *live_hosts(home)]:  # daemon and hosts: in the leaf
            assert _v2_cgroup(pid) == f"{relative}/supervisor", pid
        (tmp_path / "leave").touch()
        wait_state(job_id, "COMPLETED")
        gq_ok("daemon", "stop")
        assert daemon.wait(timeout=30) == 0
        wait_for(lambda: not live_hosts(home), 30, what="the hosts to exit")
    finally:
        _remove_cgroup_tree(unit, daemon)


def _remove_cgroup_tree(unit: Path, daemon: subprocess.Popen | None) -> None:
    """Whatever the test came to: the daemon, its hosts and its jobs ended, and the unit's
    cgroups removed, deepest first."""
    if daemon is not None and daemon.poll() is None:
        daemon.kill()
        daemon.wait()
    directories = sorted(
        (p for p in unit.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
    ) + [unit]
    for directory in directories:  # hosts and jobs left behind by a failure
        for pid in (directory / "cgroup.procs").read_text().split():
            os.kill(int(pid), 9)
    for directory in directories:
        wait_for(
            lambda d=directory: not (d / "cgroup.procs").read_text().split(),
            10,
            what=f"{directory} to empty",
        )
        directory.rmdir()


def _v2_cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as membership:
        return next(line for line in membership if line.startswith("0::")).split("::")[1].strip()


def test_a_host_that_speaks_garbage_costs_only_its_own_connection(home, tmp_path):
    """Something listening at a device's host socket answers the daemon's hello with
    hostile lines: the daemon keeps answering everyone, and once the impostor is gone it
    starts a host of its own and runs jobs."""
    import threading

    (home / "hosts").mkdir(parents=True, mode=0o700)
    impostor = socket.socket(socket.AF_UNIX)
    impostor.bind(str(home / "hosts" / "cpu.sock"))
    impostor.listen(8)
    impostor.settimeout(0.2)
    lines = [
        b'{"kind": "state", "version": "' + HOST_VERSION.encode() + b'", "pid": "abc"}\n',
        b"[" * 100_000 + b"\n",
        b'{"kind": "state", "pid": ' + str(2**70).encode() + b"}\n",
        b"\xff" * 100 + b"\n",
    ]
    served, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = impostor.accept()
            except OSError:
                continue
            with conn:
                conn.recv(1 << 16)
                conn.sendall(lines[len(served) % len(lines)])
                served.append(True)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        gq_ok("daemon", "start", "--kill-wait", "1")
        wait_for(lambda: len(served) >= len(lines), 30, what="every hostile line to be sent")
        result = gq("status")
        assert result.code == 0 and "execution host of cpu is restarting" in result.err
        assert "no state from the execution host of cpu" in (home / "daemon.log").read_text()
    finally:
        stop.set()
        thread.join()
        impostor.close()
        os.unlink(home / "hosts" / "cpu.sock")
    job_id = submit(str(write_script(tmp_path / "s.sh", "echo fine\n")))
    assert wait_state(job_id, "COMPLETED", timeout=30)["exit_code"] == 0


def test_an_exit_that_cannot_be_recorded_fails_its_job_and_is_acknowledged(daemon, tmp_path):
    """The queue refuses to record one job's COMPLETED (a trigger stands in for whatever
    may go wrong): the job ends FAILED saying so, the report is acknowledged, and neither
    this daemon nor the next is stopped by it."""
    script = write_script(tmp_path / "s.sh", "true\n")
    job_id = submit("--hold", str(script))
    db = _db(daemon.root)
    db.execute(
        f"CREATE TRIGGER refuse BEFORE UPDATE OF state ON jobs WHEN NEW.id = {job_id} "
        "AND NEW.state = 'COMPLETED' BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    db.close()
    gq_ok("release", str(job_id))
    info = wait_state(job_id, "FAILED", timeout=20)
    assert info["reason"] == "its exit could not be recorded; see the daemon's log"
    assert "cannot record the exit of job" in daemon.log()
    gq_ok("daemon", "restart")
    assert job(job_id)["state"] == "FAILED"
    wait_state(submit(str(script)), "COMPLETED")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (gives a directory to another uid)")
def test_the_system_daemon_keeps_no_state_where_another_user_could_change_it(tmp_path, monkeypatch):
    """Root would write its log, socket and spool there: a directory on the way that another
    user owns, or may write, would let them swap those files for links (a root write into
    any file). Refused by the CLI and by the daemon itself (systemd starts it directly),
    before anything is written; a sticky directory such as /tmp is fine."""
    from gq.exec.host.spawn import gq_python

    owned, shared, sticky = (tmp_path / name for name in ("owned", "shared", "sticky"))
    for directory, mode in ((owned, 0o755), (shared, 0o777), (sticky, 0o1777)):
        directory.mkdir()
        os.chmod(directory, mode)
    os.chown(owned, 65534, 65534)
    monkeypatch.delenv("GQ_HOME", raising=False)
    for parent, problem in (
        (owned, "is owned by uid 65534"),
        (shared, "may be written by other users"),
    ):
        monkeypatch.setenv("GQ_SYSTEM_HOME", str(parent / "state"))
        result = gq("daemon", "start", "--system")
        assert result.code == 2 and problem in result.err and "GQ_SYSTEM_HOME" in result.err
        assert len(result.err.strip().splitlines()) == 1
        daemon = subprocess.run(
            gq_python("gq.daemon", "--system"),
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
            env=dict(os.environ, GQ_SYSTEM_HOME=str(parent / "state")),
        )
        assert daemon.returncode == 1 and problem in daemon.stderr
        assert list(parent.iterdir()) == []
    monkeypatch.setenv("GQ_SYSTEM_HOME", str(sticky / "state"))
    assert gq("daemon", "start", "--system").code == 0
    try:
        assert (sticky / "state" / "daemon.pid").exists()
    finally:
        assert gq("daemon", "stop").code == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (gives a directory to another uid)")
def test_a_state_directory_made_by_another_user_in_the_meantime_is_refused(tmp_path, monkeypatch):
    """Under a sticky /tmp, a missing state directory passes the first check; a user who
    makes it before root does would own it: the check after mkdir refuses it."""
    from gq import home as home_module

    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    node = home_module.Home(sticky / "state", home_module.SYSTEM)
    made = node.root.mkdir

    def raced_mkdir(*args, **kwargs):
        os.mkdir(node.root)  # the other user's
        os.chown(node.root, 65534, 65534)
        made(*args, **kwargs)

    monkeypatch.setattr(
        type(node.root),
        "mkdir",
        lambda self, *a, **k: (
            raced_mkdir(*a, **k) if self == node.root else made.__func__(self, *a, **k)
        ),
    )
    with pytest.raises(home_module.UnsafeStateDirectory, match="is owned by uid 65534"):
        node.ensure()
    assert list(node.root.iterdir()) == []


def test_a_value_a_user_chose_cannot_forge_a_line_of_the_daemons_log():
    import logging

    from gq import log

    formatter = log._OneLine("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "gq",
        logging.INFO,
        __file__,
        1,
        "job %d: %s",
        (7, "cannot enter working directory /w/x\n2026-01-01 daemon INFO forged\x1b[2J"),
        None,
    )
    line = formatter.format(record)
    assert "\n" not in line and "\x1b" not in line
    assert line == (
        "INFO job 7: cannot enter working directory /w/x\\n2026-01-01 daemon INFO forged\\x1b[2J"
    )
