"""The CLI as people use it, and defects found by reading the code (each test here failed
before its fix)."""

from __future__ import annotations

import fcntl
import json
import shutil
import threading
import time

import psutil
import pytest

from conftest import all_jobs, gq, gq_ok, job, pid_alive, submit, wait_for, wait_state, write_script


def assert_one_line_refusal(result, fragment: str) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.err.count("\n") == 1 and fragment in result.err, result.err


def test_version_short_help_completion_and_bare_policy(home):
    from gq import __version__, defaults

    assert gq_ok("--version").strip() == f"gq {__version__} (protocol {defaults.PROTOCOL_VERSION})"
    assert "Usage: gq" in gq_ok("-h")
    assert "--install-completion" in gq_ok("--help")
    assert "Usage: gq submit" in gq_ok("submit", "-h")
    assert gq_ok("policy").startswith("fifo:")  # bare 'gq policy' shows it


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_an_unusable_gq_home_is_one_line_and_exit_2(tmp_path, monkeypatch, kind):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setenv("GQ_HOME", str(blocker if kind == "file" else blocker / "home"))
    result = gq("status")
    assert_one_line_refusal(result, "cannot use GQ_HOME")


def test_piped_status_cuts_nothing(daemon, tmp_path):
    name = "a-rather-long-job-name-that-squeue-would-cut"
    job_id = submit("-J", name, "--hold", str(write_script(tmp_path / "s.sh", "true\n")))
    text = gq_ok("status")  # captured: piped, as `gq status | grep` sees it
    row = next(line for line in text.splitlines() if line.startswith(str(job_id)))
    assert name in row and "JobHeldUser" in row


def test_array_tasks_are_spelled_one_way_everywhere(daemon, tmp_path):
    array = submit("--array", "0-2", str(write_script(tmp_path / "a.sh", "true\n")))
    shown = json.loads(gq_ok("show", "--json", str(array)))
    assert [t["job_id"] for t in shown] == [f"{array}_{i}" for i in range(3)]
    for task in shown:
        wait_state(task["id"], "COMPLETED")
    history = gq_ok("history")
    assert all(f"{array}_{i} " in history for i in range(3)), history
    assert "JobId: " + f"{array}_1" in gq_ok("show", f"{array}_1")


def test_cancel_of_a_pending_job_says_one_thing(daemon, tmp_path):
    job_id = submit("--hold", str(write_script(tmp_path / "s.sh", "true\n")))
    result = gq("cancel", str(job_id))
    assert (result.code, result.out, result.err) == (0, f"Cancelled job {job_id}\n", "")


def test_a_held_job_never_starts_even_if_admission_read_it_before(tmp_path):
    from gq.home import Home
    from gq.queue import job_updates, submissions, transitions
    from gq.queue.engine import Database

    db = Database(Home(tmp_path / "h").ensure())
    try:
        new = submissions.NewJob(
            name="j",
            user="u",
            uid=1,
            gid=1,
            script="/x.sh",
            args=[],
            interpreter=None,
            workdir="/tmp",
            output_pattern="o",
            error_pattern="o",
            env={},
        )
        with db.write() as session:
            job_id = submissions.submit(session, new, lambda p, i, a, t: p)[0]
        with db.write() as session:  # 'gq hold' wins the race against admission
            assert job_updates.set_held(session, [job_id], True) == [job_id]
        with db.write() as session:
            assert not transitions.start(session, job_id, "cpu", 0)
    finally:
        db.close()


def test_a_requeued_job_does_not_keep_its_old_start_time(daemon, tmp_path):
    job_id = submit(str(write_script(tmp_path / "s.sh", "sleep 300\n")))
    wait_state(job_id, "RUNNING")
    gq_ok("hold", str(submit("--hold", str(tmp_path / "s.sh"))))  # keep the device busy
    gq_ok("requeue", str(job_id))

    def requeued():
        events = [e["reason"] for e in job(job_id)["events"]]
        return "requeued by user" in events

    wait_for(requeued, 20, what="the requeue")
    info = job(job_id)
    assert info["state"] == "RUNNING" or info["start_time"] is None
    if info["state"] == "RUNNING":  # started again: its start time is the new run's
        requeue_time = next(e["time"] for e in info["events"] if e["reason"] == "requeued by user")
        assert info["start_time"] >= requeue_time
    gq_ok("cancel", "--state", "R")


def test_mem_is_checked_against_one_lane_when_there_are_several(home, tmp_path):
    gq_ok("daemon", "start", "--lanes", "2", "--cpu-memory", "2G", "--kill-wait", "1")
    script = str(write_script(tmp_path / "s.sh", "true\n"))
    assert_one_line_refusal(gq("submit", "--mem", "1.5G", script), "per lane (2 lanes)")
    assert all_jobs() == []
    assert wait_state(submit("--mem", "1G", script), "COMPLETED")


def test_export_never_asks_slurm_for_an_administrators_nice(daemon, tmp_path):
    script = str(write_script(tmp_path / "s.sh", "true\n"))
    high = gq_ok("export", "slurm", str(submit("--hold", "--priority", "5", script)))
    low = gq_ok("export", "slurm", str(submit("--hold", "--priority", "-3", script)))
    assert "--nice" not in high and "# gq --priority 5:" in high
    assert "#SBATCH --nice=3" in low


def test_daemon_stop_never_signals_a_pid_that_is_not_the_daemons(home):
    home.mkdir()
    with open(home / "daemon.pid", "w") as pidfile:  # locked, still empty: a daemon starting
        fcntl.flock(pidfile, fcntl.LOCK_EX)
        result = gq("daemon", "stop")
    assert result.code == 0 and "not running" in result.out  # and this process still lives


def test_a_stopping_daemon_does_not_spin(daemon, tmp_path):
    script = write_script(
        tmp_path / "stubborn.py",
        (
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(300)\n"
        ),
    )
    gq_ok("daemon", "stop")
    daemon.start("--kill-wait", "3")
    job_id = submit(str(script))
    wait_for(
        lambda: (
            "ready" in (tmp_path / f"gq-{job_id}.out").read_text()
            if (tmp_path / f"gq-{job_id}.out").exists()
            else False
        ),
        60,
        what="the job",
    )
    process = psutil.Process(daemon.pid())
    before = sum(process.cpu_times()[:2])
    outcome = []
    stopper = threading.Thread(target=lambda: outcome.append(gq("daemon", "stop")))
    started = time.monotonic()
    stopper.start()
    time.sleep(2.0)  # inside the 3 s kill wait: the daemon only waits for the job's exit
    spent = sum(process.cpu_times()[:2]) - before
    stopper.join(30)
    assert time.monotonic() - started >= 2.0 and spent < 0.5, f"{spent:.2f} s of CPU"
    assert outcome and outcome[0].code == 0, outcome
    wait_for(lambda: not pid_alive(process.pid), 10, what="the daemon to exit")


def test_another_interpreter_gets_gq_and_none_of_the_daemons_packages(daemon, tmp_path):
    other = shutil.which("python3", path="/usr/bin")
    if other is None:
        pytest.skip("needs /usr/bin/python3")
    script = write_script(
        tmp_path / "probe.py",
        (
            "import importlib.util, gq\n"
            "print('gq', gq.__version__, 'typer', importlib.util.find_spec('typer') is not None)\n"
        ),
    )
    job_id = submit("--python", other, str(script))
    assert wait_state(job_id, "COMPLETED")["exit_code"] == 0
    from gq import __version__

    assert (tmp_path / f"gq-{job_id}.out").read_text() == f"gq {__version__} typer False\n"


def test_squeue_formats_and_sort_keys():
    from msgspec.structs import replace

    from gq.cli import formats
    from gq.errors import UserError
    from gq.messages import JobInfo

    base = JobInfo(
        id=1,
        label="1",
        name="train",
        user="ann",
        uid=1,
        state="RUNNING",
        reason=None,
        priority=1,
        gpus=1,
        mem=None,
        time_limit=3600,
        deadline=None,
        steps_total=None,
        exclusive=False,
        requeue=False,
        dependency=None,
        held=False,
        array_job_id=None,
        array_task_id=None,
        array_max_running=None,
        script=None,
        args=None,
        workdir=None,
        stdout=None,
        stderr=None,
        device="gpu0",
        lane=0,
        pid=None,
        submit_time=1.0,
        start_time=None,
        end_time=None,
        exit_code=None,
        run_count=1,
        steps_done=0,
        attained=0.0,
        mean_iteration=None,
        mem_persistent=None,
        mem_peak=None,
        holds_lane=False,
    )
    jobs = [
        base,
        replace(base, id=2, label="2", name="eval", priority=5, state="PENDING", device=None),
        replace(base, id=3, label="3", priority=5),
    ]
    ordered = formats.sort("-p,-i", jobs)
    assert [job.id for job in ordered] == [3, 2, 1]
    text = formats.table("%.4i %-6j %t %l|%N", [(j.label, j, "Resources") for j in ordered])
    assert text.splitlines() == [
        "JOBI NAME   ST TIME_LIMIT|DEVICE",
        "   3 train  R 1:00:00|gpu0",
        "   2 eval   PD 1:00:00|",
        "   1 train  R 1:00:00|gpu0",
    ]
    for bad in ("%z", "plain text", "-q"):
        with pytest.raises(UserError):
            formats.table(bad, []) if bad != "-q" else formats.sort(bad, jobs)
