"""Cancel, time limits, and restart safety after kill -9 of the daemon."""

from __future__ import annotations

import os
import signal

import pytest

from conftest import (
    KERNEL_LOOP,
    all_jobs,
    cgroups_usable,
    gq,
    gq_ok,
    job,
    pid_alive,
    submit,
    wait_for,
    wait_for_words,
    wait_state,
    write_script,
)


def test_cancel_pending_job_is_immediate_and_it_never_runs(daemon, tmp_path):
    marker = tmp_path / "ran"
    script = write_script(tmp_path / "p.sh", f"touch {marker}\n")
    job_id = submit("--hold", str(script))
    result = gq("cancel", str(job_id))
    assert (result.code, result.out.strip(), result.err) == (0, f"Cancelled job {job_id}", "")
    info = job(job_id)
    assert info["state"] == "CANCELLED" and info["reason"] == "cancelled by user"
    after = submit(str(write_script(tmp_path / "q.sh", "true\n")))
    wait_state(after, "COMPLETED")  # the daemon has scanned the queue since the cancel
    assert job(job_id)["state"] == "CANCELLED" and job(job_id)["run_count"] == 0
    assert not marker.exists()


def test_cancel_running_job_kills_its_process_group(daemon, tmp_path):
    script = write_script(
        tmp_path / "tree.sh", ("sleep 300 &\necho child $! > children.txt\nsleep 300\n")
    )
    job_id = submit(str(script))
    info = wait_state(job_id, "RUNNING")
    child = int(wait_for_words(tmp_path / "children.txt", 2, what="the child to start")[1])
    assert pid_alive(child)
    assert "Cancelling job" in gq_ok("cancel", str(job_id))
    info = wait_state(job_id, "CANCELLED", timeout=10)
    assert info["reason"] == "cancelled by user"
    wait_for(lambda: not pid_alive(child), 5, what="the job's child to die")


def test_cancel_filters_by_name_user_and_state(daemon, tmp_path):
    script = write_script(tmp_path / "f.sh", "sleep 300\n")
    blocker = submit("--exclusive", "-J", "blocker", str(script))
    wait_state(blocker, "RUNNING")
    sweeps = [submit("--exclusive", "-J", "sweep", str(script)) for _ in range(3)]
    other = submit("--exclusive", "-J", "other", str(script))
    out = gq_ok("cancel", "--name", "sweep")
    assert out.count("Cancelled job") == 3
    assert all(job(i)["state"] == "CANCELLED" for i in sweeps)
    assert job(other)["state"] == "PENDING"
    gq_ok("cancel", "--state", "PD", "--user", job(other)["user"])
    assert job(other)["state"] == "CANCELLED"
    assert job(blocker)["state"] == "RUNNING"
    gq_ok("cancel", "--state", "R")
    wait_state(blocker, "CANCELLED")


def test_cancel_of_finished_job_is_refused_and_changes_nothing(daemon, tmp_path):
    script = write_script(tmp_path / "done.sh", "true\n")
    job_id = submit(str(script))
    wait_state(job_id, "COMPLETED")
    result = gq("cancel", str(job_id))
    assert (result.code, result.out, result.err) == (
        2,
        "",
        f"gq: error: job {job_id} already ended (COMPLETED); nothing to cancel\n",
    )
    assert job(job_id)["state"] == "COMPLETED"


def test_cancel_of_several_jobs_cancels_the_live_ones_and_refuses_the_ended(daemon, tmp_path):
    """As scancel: each job that can be cancelled is; one that had ended is an error (a
    line on stderr) and makes the exit non-zero."""
    ended = submit(str(write_script(tmp_path / "done.sh", "true\n")))
    wait_state(ended, "COMPLETED")
    sleeper = write_script(tmp_path / "sleep.sh", "sleep 300\n")
    running = submit(str(sleeper))
    wait_state(running, "RUNNING")
    pending = submit("--hold", str(sleeper))
    result = gq("cancel", str(pending), str(ended), str(running))
    assert result.code == 2
    assert result.out.splitlines() == [
        f"Cancelled job {pending}",
        f"Cancelling job {running} (running; it ends after SIGTERM)",
    ]
    assert result.err == f"gq: error: job {ended} already ended (COMPLETED); nothing to cancel\n"
    assert job(pending)["state"] == "CANCELLED"
    wait_state(running, "CANCELLED")
    assert job(ended)["state"] == "COMPLETED"


def test_cancel_of_an_array_is_refused_only_once_every_task_has_ended(daemon, tmp_path):
    script = write_script(tmp_path / "task.sh", 'test "$SLURM_ARRAY_TASK_ID" = 0 || sleep 300\n')
    array = submit("--array", "0-2%1", str(script))
    wait_state(array, "COMPLETED")  # task 0, whose job id is the array's
    wait_for(lambda: job(array + 1)["state"] == "RUNNING", 10, what="task 1 to run")
    result = gq("cancel", str(array))  # task 0's end is no error while the others live
    assert (result.code, result.err) == (0, "")
    assert result.out.splitlines() == [
        f"Cancelled job {array}_2",
        f"Cancelling job {array}_1 (running; it ends after SIGTERM)",
    ]
    wait_state(array + 1, "CANCELLED")
    again = gq("cancel", str(array))
    assert (again.code, again.out, again.err) == (
        2,
        "",
        f"gq: error: job {array} already ended (every task of the array); nothing to cancel\n",
    )
    task = gq("cancel", f"{array}_0")
    assert task.code == 2
    assert task.err == f"gq: error: job {array}_0 already ended (COMPLETED); nothing to cancel\n"
    assert [j["state"] for j in all_jobs()] == ["COMPLETED", "CANCELLED", "CANCELLED"]


# Three processes of one job that count their SIGTERMs and go on: its main process, a child
# in its process group, and a child in a session of its own (in the job's cgroup, not its
# group). Each says it is ready (with its pid) once its handler is set.
COUNTING_JOB = """\
import os, signal, time

def counting(name):
    try:  # woken at once, ahead of the machine's other work: a SIGTERM that came while the
        # previous one was still pending would be merged with it by the kernel, uncounted
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except OSError:
        pass  # not allowed here: the count is then only as sharp as the machine is idle
    def count(signum, frame):
        with open(name + ".terms", "a") as terms:
            terms.write("TERM\\n")

    signal.signal(signal.SIGTERM, count)
    with open(name + ".ready", "w") as ready:
        ready.write(str(os.getpid()))

if os.fork() == 0:
    counting("grouped")
elif os.fork() == 0:
    os.setsid()
    counting("apart")
else:
    counting("main")
while True:
    time.sleep(0.05)
"""


def test_each_process_of_a_cancelled_job_gets_sigterm_once(daemon, tmp_path):
    if not cgroups_usable("auto"):
        pytest.skip("needs cgroups: a process in a session of its own is in its job's cgroup")
    job_id = submit(str(write_script(tmp_path / "counting.py", COUNTING_JOB)))
    names = ("main", "grouped", "apart")
    pids = {
        name: int(wait_for_words(tmp_path / f"{name}.ready", 1, what=f"{name} to be ready")[0])
        for name in names
    }
    gq_ok("cancel", str(job_id))
    # None of them exits at SIGTERM: each lives on until the SIGKILL a second later, long
    # after a second SIGTERM (sent within a millisecond of the first) would have come.
    wait_state(job_id, "CANCELLED", timeout=15)
    for name in names:
        assert (tmp_path / f"{name}.terms").read_text() == "TERM\n", name
    wait_for(lambda: not any(map(pid_alive, pids.values())), 5, what="the job's processes to die")


def test_time_limit_ends_job_with_timeout(daemon, tmp_path):
    script = write_script(tmp_path / "long.sh", "echo started\nsleep 300\n")
    job_id = submit("-t", "0:01", str(script))
    info = wait_state(job_id, "TIMEOUT", timeout=10)
    assert info["reason"] == "time limit 0:01 reached"
    assert 0.9 <= info["run_time"] < 5
    assert info["exit_code"] == 128 + 15  # SIGTERM


def test_job_ignoring_sigterm_is_killed_after_kill_wait(daemon, tmp_path):
    script = write_script(
        tmp_path / "stubborn.py",
        (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: print('ignoring TERM', flush=True))\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    time.sleep(0.05)\n"
        ),
    )
    # Its limit is set to 1 s once it ignores SIGTERM: from its launch, a loaded machine's
    # start-up once took longer than that, and SIGTERM ended it.
    job_id = submit("-t", "1:00", str(script))
    out = tmp_path / f"gq-{job_id}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), 30, what="the job's handler")
    gq_ok("update", str(job_id), "--time", "0:01")
    info = wait_state(job_id, "TIMEOUT", timeout=15)
    assert info["exit_code"] == 128 + 9  # SIGKILL after the 1 s kill wait
    assert info["run_time"] >= 1.9
    assert "ignoring TERM" in out.read_text()


def test_node_failure_while_no_daemon_runs_fails_or_requeues_and_runs_pending(daemon, tmp_path):
    from conftest import live_hosts

    marker = tmp_path / "runs.log"
    long = write_script(tmp_path / "long.sh", f"echo $GQ_JOB_ID >> {marker}\nsleep 300\n")
    quick = write_script(tmp_path / "quick.sh", f"echo $GQ_JOB_ID >> {marker}\n")
    plain = submit(str(long))
    requeued = submit("--requeue", str(long))
    pending = submit("--hold", str(quick))
    wait_state(plain, "RUNNING")
    wait_state(requeued, "RUNNING")
    wait_for_words(marker, 2, what="2 runs")
    pids = [job(plain)["pid"], job(requeued)["pid"]]
    daemon.kill9()
    for host in live_hosts(daemon.root):  # the node fails: the host dies too
        os.kill(host, signal.SIGKILL)
    # Workers die with their host (PR_SET_PDEATHSIG).
    wait_for(lambda: not any(pid_alive(p) for p in pids), 10, what="jobs to die with the host")
    daemon.start()
    gq_ok("release", str(pending))
    info = wait_state(plain, "FAILED")
    assert info["reason"] == "node failure"
    wait_state(pending, "COMPLETED")
    again = wait_state(requeued, "RUNNING")
    assert again["run_count"] == 2
    events = [(e["old_state"], e["new_state"], e["reason"]) for e in again["events"]]
    assert ("RUNNING", "PENDING", "node failure; requeued") in events
    assert job(plain)["run_count"] == 1 and job(pending)["run_count"] == 1
    runs = marker.read_text().split()
    assert sorted(runs) == sorted([str(plain), str(requeued), str(pending), str(requeued)])
    gq_ok("cancel", str(requeued))
    wait_state(requeued, "CANCELLED")


def test_daemon_stop_ends_running_jobs_with_a_reason(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 300\n")
    plain, requeued = submit(str(script)), submit("--requeue", str(script))
    wait_state(plain, "RUNNING")
    wait_state(requeued, "RUNNING")
    gq_ok("daemon", "stop")
    # Asking again starts a fresh daemon, which finds what the stopped one recorded.
    assert job(plain)["state"] == "FAILED" and job(plain)["reason"] == "daemon stopped"
    events = [(e["old_state"], e["new_state"], e["reason"]) for e in job(requeued)["events"]]
    assert ("RUNNING", "PENDING", "daemon stopped; requeued") in events


def test_foreground_daemon_for_systemd(home, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    process = subprocess.Popen(
        [sys.executable, "-m", "gq", "daemon", "start", "--foreground"],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: gq("daemon", "status").code == 0, 20, what="the foreground daemon")
        assert gq_ok("daemon", "status").startswith(f"gq daemon is running (pid {process.pid}")
        script = write_script(tmp_path / "fg.sh", "true\n")
        wait_state(submit(str(script)), "COMPLETED")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(20) == 0
    assert gq("daemon", "status").code == 1


def test_cancel_and_time_limit_of_resident_jobs_waiting_for_their_lane(daemon, tmp_path):
    holder = submit(*KERNEL_LOOP, "--steps", "3000", "--iter-ms", "5")  # fifo: holds the lane
    waiter = submit(*KERNEL_LOOP, "--steps", "100", "--iter-ms", "5")
    limited = submit("-t", "0:03", *KERNEL_LOOP, "--steps", "100", "--iter-ms", "5")
    wait_for(lambda: job(holder)["steps_done"] > 0, 60, what="the holder to iterate")
    assert job(waiter)["state"] == "RUNNING" and job(waiter)["steps_done"] == 0
    gq_ok("cancel", str(waiter))
    assert wait_state(waiter, "CANCELLED", timeout=10)["steps_done"] == 0
    info = wait_state(limited, "TIMEOUT", timeout=20)
    assert info["steps_done"] == 0
    assert job(holder)["state"] == "RUNNING"
    gq_ok("cancel", str(holder))
    wait_state(holder, "CANCELLED")
