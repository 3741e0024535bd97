"""Running jobs outlive the daemon: kill -9, restart and upgrade lose and repeat nothing.

The execution hosts keep their jobs running while no daemon runs, enforce time limits,
and keep each exit report until a new daemon has recorded it."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time

from conftest import (
    DECLARED,
    KERNEL_LOOP,
    ROOT,
    all_jobs,
    gq,
    gq_ok,
    job,
    live_hosts,
    pid_alive,
    start_together,
    submit,
    wait_for,
    wait_state,
    write_script,
)


def test_kill9_with_four_resident_srtf_jobs_loses_and_repeats_nothing(daemon, tmp_path):
    gq_ok("policy", "set", "srtf")
    steps = [800, 600, 400, 200]
    go = tmp_path / "go"
    ids = [
        submit(
            *DECLARED,
            "--steps",
            str(n),
            *KERNEL_LOOP,
            "--steps",
            str(n),
            "--iter-ms",
            "4",
            "--start-file",
            str(go),
        )
        for n in steps
    ]
    workers = {i: wait_for(lambda i=i: job(i)["pid"], 60, what="four resident jobs") for i in ids}
    start_together(go, len(ids))
    wait_for(lambda: any(job(i)["steps_done"] > 0 for i in ids), 30, what="iterations")
    old = daemon.kill9()
    hosts = live_hosts(daemon.root)
    assert hosts and all(pid_alive(p) for p in hosts), "the host died with the daemon"
    assert pid_alive(workers[ids[0]]), "jobs died with the daemon"  # srtf runs it last
    daemon.start()
    assert daemon.pid() != old
    for job_id, total in zip(ids, steps):
        info = wait_state(job_id, "COMPLETED", timeout=120)
        assert info["exit_code"] == 0 and info["steps_done"] == total == info["steps_total"]
        assert info["run_count"] == 1 and info["pid"] == workers[job_id]
        assert info["attained"] >= total * 0.004 * 0.9, info  # device time of every step
        assert [e["new_state"] for e in info["events"]] == ["PENDING", "RUNNING", "COMPLETED"]
        out = (tmp_path / f"gq-{job_id}.out").read_text().splitlines()
        assert len(out) == 1 and json.loads(out[0])["steps"] == total  # one run, to the end


def test_a_job_that_ends_while_no_daemon_runs_keeps_its_exit_code_and_end_time(daemon, tmp_path):
    script = write_script(tmp_path / "three.sh", "while [ ! -e go ]; do sleep 0.05; done\nexit 3\n")
    job_id = submit(str(script))
    pid = wait_state(job_id, "RUNNING")["pid"] or wait_for(lambda: job(job_id)["pid"], 10)
    daemon.kill9()
    (tmp_path / "go").touch()
    # Reaped, not merely a zombie: the host takes the end time as it reaps, which on a busy
    # machine comes a little after the exit.
    wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, what="the host to reap the job")
    ended_before = time.time()
    daemon.start()
    info = wait_state(job_id, "FAILED")
    assert info["exit_code"] == 3 and info["reason"] == "exit code 3"
    from datetime import datetime

    assert datetime.fromisoformat(info["end_time"]).timestamp() <= ended_before
    assert info["run_count"] == 1


def test_a_time_limit_passing_while_no_daemon_runs_ends_the_job_timeout(daemon, tmp_path):
    script = write_script(tmp_path / "long.sh", "sleep 300\n")
    job_id = submit("-t", "0:02", str(script))
    pid = wait_for(lambda: job(job_id)["pid"], 10, what="the job's process")
    daemon.kill9()
    wait_for(lambda: not pid_alive(pid), 15, what="the host to enforce the limit alone")
    daemon.start()
    info = wait_state(job_id, "TIMEOUT")
    assert info["reason"] == "time limit 0:02 reached" and info["run_count"] == 1


def test_restart_replaces_the_daemon_and_keeps_the_running_job(daemon, tmp_path):
    # 7.5 s of iterations: a restart on a loaded machine ends well before the job does
    job_id = submit(*KERNEL_LOOP, "--steps", "1500", "--iter-ms", "5")
    worker = wait_for(
        lambda: job(job_id)["steps_done"] > 0 and job(job_id)["pid"], 60, what="the job to iterate"
    )
    old = daemon.pid()
    result = gq("daemon", "restart")
    assert result.code == 0 and "running jobs kept" in result.out, result.err
    assert daemon.pid() != old and pid_alive(worker)
    info = wait_state(job_id, "COMPLETED", timeout=120)
    assert info["run_count"] == 1 and info["pid"] == worker and info["steps_done"] == 1500


def test_periods_are_said_as_people_write_them_and_kept_by_a_restart(home):
    """People read ``36 hours``; the daemon's command line keeps ``36hours``, which the
    restarted daemon is started with again."""
    gq_ok("daemon", "start", "--retention", "36hours", "--fair-half-life", "90min")
    gq_ok("policy", "set", "fair")
    for _ in range(2):
        info = gq_ok("info")
        assert "finished jobs kept 36 hours;" in info, info
        assert "fair share (lane time used, half-life 90 minutes)" in info, info
        assert "finished jobs are kept 36 hours after they end" in gq("history").err
        options = json.loads(gq_ok("info", "--json"))["options"]
        assert options[options.index("--retention") + 1] == "36hours"
        assert options[options.index("--fair-half-life") + 1] == "90minutes"
        assert "restarted" in gq_ok("daemon", "restart")


def test_stop_keep_jobs_then_start_adopts_them(daemon, tmp_path):
    go = tmp_path / "go"
    script = write_script(
        tmp_path / "s.sh", (f"while [ ! -e {go} ]; do sleep 0.05; done; echo finished\n")
    )
    job_id = submit(str(script))
    pid = wait_for(lambda: job(job_id)["pid"], 10, what="the job's process")
    assert "leaving running jobs" in gq_ok("daemon", "stop", "--keep-jobs")
    assert gq("daemon", "status").code == 1 and pid_alive(pid)
    go.touch()  # it ends while no daemon runs
    wait_for(lambda: not pid_alive(pid), 10, what="the job to finish alone")
    daemon.start()
    assert wait_state(job_id, "COMPLETED")["run_count"] == 1
    assert (tmp_path / f"gq-{job_id}.out").read_text() == "finished\n"


def test_twenty_kill_restart_cycles_during_fifty_short_jobs_lose_and_repeat_nothing(
    daemon, tmp_path
):
    runs = tmp_path / "runs.log"
    script = write_script(tmp_path / "short.sh", f"echo $GQ_JOB_ID >> {runs}\nsleep 0.2\n")
    ids = [submit(str(script)) for _ in range(50)]
    rng = random.Random(7)
    for _ in range(20):
        daemon.kill9()
        time.sleep(rng.uniform(0, 0.3))  # jobs go on ending (or not) while none runs
        daemon.start()
        wait_for(lambda: gq("status").code == 0, 30, what="the daemon to answer")
    for job_id in ids:
        info = wait_state(job_id, "COMPLETED", timeout=120)
        assert info["run_count"] == 1, info["events"]
    started = runs.read_text().split()
    assert sorted(map(int, started)) == ids, "a job was lost or ran twice"
    assert len(all_jobs()) == 50


def _older_gq(tmp_path):
    """A copy of this source tree that calls itself version 0.0.1: the 'old install'."""
    old = tmp_path / "old-gq"
    for part in ("gq", "migrations"):
        shutil.copytree(ROOT / part, old / part, ignore=shutil.ignore_patterns("__pycache__"))
    init = old / "gq" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.1-old-'))
    return old


def test_a_host_of_another_version_is_drained_then_replaced(home, tmp_path):
    old = _older_gq(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(old))

    def old_gq(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gq", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    old_gq("daemon", "start", "--kill-wait", "1")
    script = write_script(tmp_path / "s.sh", "while [ ! -e go ]; do sleep 0.05; done\n")
    job_id = int(old_gq("submit", "--parsable", str(script)))
    pid = wait_for(
        lambda: json.loads(old_gq("show", "--json", str(job_id)))["pid"],
        20,
        what="the job on the old host",
    )
    old_host = live_hosts(home)
    os.kill(int((home / "daemon.pid").read_text()), 9)
    wait_for(lambda: gq("daemon", "status").code == 1, 10, what="the old daemon to die")
    gq_ok("daemon", "start", "--kill-wait", "1")  # this version
    assert live_hosts(home) == old_host  # kept, but draining: nothing new goes there
    later = submit(str(write_script(tmp_path / "t.sh", "echo new\n")))
    assert job(later)["state"] == "PENDING"
    assert "draining" in (home / "daemon.log").read_text()
    (tmp_path / "go").touch()
    info = wait_state(job_id, "COMPLETED", timeout=30)
    assert info["run_count"] == 1 and not pid_alive(pid)
    wait_state(later, "COMPLETED", timeout=30)  # on the new host
    assert live_hosts(home) and live_hosts(home) != old_host


def test_attaching_reads_past_what_a_host_says_before_answering_hello(tmp_path):
    """Regression: a host that sent progress as soon as a daemon connected made the daemon
    take the live host for a broken one and fail every job it ran."""
    import socket
    import threading

    from gq.daemon.devices import Device
    from gq.daemon.supervision.host_handles import HostHandle, HostSettings
    from gq.exec import protocol as wire
    from gq.exec.host import messages as host_messages
    from gq.home import Home

    home = Home(tmp_path / "home").ensure()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(home.hosts / "cpu.sock"))
    listener.listen(1)
    state = host_messages.State(
        version=host_messages.HOST_VERSION,
        pid=os.getpid(),
        device="cpu",
        lanes=1,
        policy=["fifo", "always", "100ms"],
        draining=False,
        residents=[],
        exited=[],
    )

    def chatty_host():
        sock, _ = listener.accept()
        sock.sendall(wire.encode(host_messages.Progress(jobs=[])))  # before any hello
        channel = wire.Channel(sock, wire.TO_HOST)
        assert isinstance(channel.receive_one(), host_messages.Hello)
        sock.sendall(wire.encode(state))
        sock.close()

    thread = threading.Thread(target=chatty_host)
    thread.start()
    device = Device(name="cpu", kind="cpu", index=None, memory_total=1 << 30, model="test")
    host, answer = HostHandle.attach(device, home, HostSettings(1, 1.0, "off"))
    thread.join(10)
    listener.close()
    assert isinstance(answer, host_messages.State) and answer.pid == os.getpid()
    assert host.pid == os.getpid() and host.process is None and host.current


def test_a_host_connection_that_drops_is_attached_again_and_keeps_its_jobs(daemon, tmp_path):
    """The daemon loses its link to a live host (here a second client says hello on the
    host's socket, and the host drops the daemon for it): it attaches again, and the job on
    that host runs on and ends as it would have, once."""
    import socket as socket_module

    from test_reliability import host_process

    script = write_script(tmp_path / "s.sh", "while [ ! -e go ]; do sleep 0.05; done\n")
    job_id = submit(str(script))
    wait_state(job_id, "RUNNING")
    host = host_process(daemon.pid())
    with socket_module.socket(socket_module.AF_UNIX) as other:
        other.connect(str(daemon.root / "hosts" / "cpu.sock"))
        other.sendall(b'{"op":"hello"}\n')  # as every daemon greets a host
        assert b'"kind":"state"' in other.recv(1 << 16)
    wait_for(
        lambda: "attaching the execution host of cpu again" in daemon.log(),
        20,
        what="the daemon to attach again",
    )
    (tmp_path / "go").touch()
    info = wait_state(job_id, "COMPLETED", timeout=30)
    assert info["run_count"] == 1 and host_process(daemon.pid()).pid == host.pid
