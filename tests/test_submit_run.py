"""Submitting through the real CLI and running on the real daemon, host and workers."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from conftest import (
    PYTHON,
    all_jobs,
    gq,
    gq_ok,
    job,
    pid_alive,
    submit,
    wait_for,
    wait_state,
    write_script,
)


def test_job_runs_in_submit_dir_with_gq_environment(daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("SUBMITTER_VAR", "from-submitter")
    script = write_script(
        tmp_path / "env.py",
        (
            "import os, sys\n"
            "for key in ('GQ_JOB_ID', 'GQ_JOB_NAME', 'GQ_DEVICE', 'CUDA_VISIBLE_DEVICES',\n"
            "            'SUBMITTER_VAR'):\n"
            "    print(f'{key}={os.environ.get(key)!r}')\n"
            "print('cwd', os.getcwd())\n"
            "print('argv', sys.argv[1:])\n"
        ),
    )
    job_id = submit(str(script), "--lr", "3e-4", "-J", "not-a-gq-option")
    info = wait_state(job_id, "COMPLETED")
    assert info["exit_code"] == 0
    output = (tmp_path / f"gq-{job_id}.out").read_text()
    assert f"GQ_JOB_ID='{job_id}'" in output
    assert "GQ_JOB_NAME='env.py'" in output
    if info["device"] == "cpu":
        assert "GQ_DEVICE='cpu'" in output and "CUDA_VISIBLE_DEVICES=''" in output
    else:  # a GPU node: its GPU, named by UUID
        assert "GQ_DEVICE='cuda:0'" in output and "CUDA_VISIBLE_DEVICES='GPU-" in output
    assert "SUBMITTER_VAR='from-submitter'" in output
    assert f"cwd {tmp_path}" in output
    assert "argv ['--lr', '3e-4', '-J', 'not-a-gq-option']" in output
    assert info["name"] == "env.py" and info["user"] and info["device"] == "cpu"
    assert info["run_count"] == 1


def test_submit_prints_id_and_parsable_prints_only_id(daemon, tmp_path):
    script = write_script(tmp_path / "ok.sh", "true\n")
    out = gq_ok("submit", str(script))
    assert out.startswith("Submitted job ") and out.strip().split()[-1].isdigit()
    assert gq_ok("submit", "--parsable", str(script)).strip().isdigit()


def test_failing_job_records_exit_code(daemon, tmp_path):
    script = write_script(tmp_path / "fail.py", "import sys\nprint('boom')\nsys.exit(3)\n")
    info = wait_state(submit(str(script)), "FAILED")
    assert info["exit_code"] == 3
    assert info["reason"] == "exit code 3"
    assert info["end_time"] and info["start_time"]


def test_exception_in_python_job_fails_it(daemon, tmp_path):
    script = write_script(tmp_path / "raise.py", "raise RuntimeError('bad things')\n")
    job_id = submit(str(script))
    info = wait_state(job_id, "FAILED")
    assert info["exit_code"] == 1
    assert "RuntimeError: bad things" in (tmp_path / f"gq-{job_id}.out").read_text()


def test_shell_script_runs_via_shebang_or_bash(daemon, tmp_path):
    with_shebang = write_script(tmp_path / "a.sh", "#!/bin/sh\necho shebang $0\n", 0o755)
    without = write_script(tmp_path / "b.job", "echo plain bash ${BASH_VERSION:+yes}\n")
    first, second = submit(str(with_shebang)), submit(str(without))
    wait_state(first, "COMPLETED")
    wait_state(second, "COMPLETED")
    assert "shebang" in (tmp_path / f"gq-{first}.out").read_text()
    assert "plain bash yes" in (tmp_path / f"gq-{second}.out").read_text()


def test_output_patterns_and_chdir(daemon, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = write_script(tmp_path / "out.sh", "echo to-stdout\necho to-stderr >&2\npwd\n")
    job_id = submit(
        "-J", "named", "-D", str(workdir), "-o", "%x-%j.log", "-e", "err-%j.log", str(script)
    )
    wait_state(job_id, "COMPLETED")
    out = (workdir / f"named-{job_id}.log").read_text()
    assert "to-stdout" in out and str(workdir) in out and "to-stderr" not in out
    assert (workdir / f"err-{job_id}.log").read_text().strip() == "to-stderr"
    info = job(job_id)
    assert info["stdout"] == str(workdir / f"named-{job_id}.log")


def test_directives_apply_and_command_line_wins(daemon, tmp_path):
    script = write_script(
        tmp_path / "directed.sh",
        (
            "#!/bin/bash\n"
            "# a comment before the directives\n"
            "#GQ -J from-directive\n"
            "#GQ --time 0:05 --priority 7\n"
            "#GQ --mem 1G\n"
            "echo body\n"
            "#GQ --priority 99\n"  # after the first comment block: not a directive
        ),
        0o755,
    )
    job_id = submit("--priority", "3", str(script))
    info = wait_state(job_id, "COMPLETED")
    assert info["name"] == "from-directive"
    assert info["time_limit"] == 5
    assert info["priority"] == 3
    assert info["mem"] == 1 << 30


def test_script_is_snapshotted_at_submit(home, tmp_path):
    edited = write_script(tmp_path / "snap.sh", "echo original\n")
    deleted = write_script(tmp_path / "gone.sh", "echo still here\n")
    first, second = submit(str(edited)), submit(str(deleted))  # no daemon yet: both wait
    edited.write_text("echo edited\n")
    deleted.unlink()
    gq_ok("daemon", "start", "--kill-wait", "1")
    try:
        wait_state(first, "COMPLETED")
        wait_state(second, "COMPLETED")
        assert (tmp_path / f"gq-{first}.out").read_text().strip() == "original"
        assert (tmp_path / f"gq-{second}.out").read_text().strip() == "still here"
    finally:
        gq_ok("daemon", "stop")


def test_first_command_starts_the_personal_daemon_and_says_so_on_stderr(home, tmp_path):
    assert gq("daemon", "status").code == 1
    script = write_script(tmp_path / "q.sh", "echo ran\n")
    result = gq("submit", "--parsable", str(script))
    pid = int((home / "daemon.pid").read_text())
    assert (result.code, result.err) == (
        0,
        f"gq: started a personal daemon (pid {pid}, state in {home}); it runs in the "
        "background until 'gq daemon stop'\n",
    )
    job_id = int(result.out)  # stdout is the script's to parse, as it was
    assert gq("daemon", "status").code == 0
    again = gq("status")
    assert again.code == 0 and again.err == ""  # said once: by the command that started it
    info = wait_state(job_id, "COMPLETED")
    assert info["run_count"] == 1
    assert (tmp_path / f"gq-{job_id}.out").read_text() == "ran\n"


def test_concurrent_first_commands_start_one_daemon_and_lose_no_job(home, tmp_path):
    import subprocess

    script = write_script(tmp_path / "q.sh", "true\n")
    clients = [
        subprocess.Popen(
            [PYTHON, "-m", "gq", "submit", "--parsable", "--hold", str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    outcomes = [(c.wait(60), *c.communicate()) for c in clients]
    assert all(code == 0 for code, _, _ in outcomes), outcomes
    # Only the command whose daemon won the lock says it started one.
    said = sorted(err for _, _, err in outcomes)
    pid = int((home / "daemon.pid").read_text())
    assert said == [""] * 7 + [
        f"gq: started a personal daemon (pid {pid}, state in {home}); it runs in the "
        "background until 'gq daemon stop'\n"
    ], outcomes
    ids = sorted(int(out) for _, out, _ in outcomes)
    assert ids == list(range(1, 9))
    assert sorted(j["id"] for j in all_jobs()) == ids
    daemons = [
        p
        for p in psutil.process_iter(["cmdline", "environ"])
        if "run_module('gq.daemon'" in " ".join(p.info["cmdline"] or [])
        and (p.info["environ"] or {}).get("GQ_HOME") == str(home)
    ]
    assert len(daemons) == 1, daemons


def test_stop_returns_once_the_daemon_has_exited_and_leaves_no_pidfile(home, tmp_path):
    """Started as gq starts it (a Python of its own, which takes a moment to finish after
    it lets its lock go), with a job running that the stop ends."""
    import subprocess

    pidfile = home / "daemon.pid"
    subprocess.run([PYTHON, "-m", "gq", "daemon", "start"], check=True, capture_output=True)
    pid = int(pidfile.read_text())
    job_id = submit(str(write_script(tmp_path / "s.sh", "sleep 300\n")))
    wait_state(job_id, "RUNNING")
    said = gq_ok("daemon", "stop").splitlines()
    assert not pid_alive(pid), "gq daemon stop returned while the daemon still ran"
    assert said[-1] == f"gq daemon stopped (pid {pid})"
    assert not pidfile.exists()
    assert gq("daemon", "status").code == 1
    again = gq("submit", "--parsable", str(tmp_path / "s.sh"))  # starts a daemon afresh
    assert again.code == 0 and "gq: started a personal daemon" in again.err
    second = int(pidfile.read_text())
    assert second != pid and pid_alive(second)
    wait_state(int(again.out), "RUNNING")
    os.kill(second, signal.SIGKILL)  # one killed leaves its pidfile: it names no daemon
    wait_for(lambda: not pid_alive(second), 10, what="the killed daemon to die")
    assert pidfile.read_text().split() == [str(second)]
    assert gq("daemon", "status").code == 1
    assert gq("status").code == 0 and int(pidfile.read_text()) not in (pid, second)
    gq_ok("daemon", "stop")
    assert not pidfile.exists()


def test_start_latency_on_idle_node_uses_the_poke(daemon, tmp_path):
    # The poll fallback is 1 s; starting well within it shows the socket poke works.
    script = write_script(tmp_path / "quick.sh", "true\n")
    submit(str(script))
    wait_state(1, "COMPLETED")
    job_id = submit(str(script))
    info = wait_state(job_id, "COMPLETED", "RUNNING")
    from datetime import datetime

    waited = (
        datetime.fromisoformat(info["start_time"]) - datetime.fromisoformat(info["submit_time"])
    ).total_seconds()
    assert waited < 0.9, f"job waited {waited:.3f}s on an idle node"


def test_second_daemon_start_says_already_running(daemon):
    result = gq("daemon", "start")
    assert result.code == 0
    assert f"already running (pid {daemon.pid()})" in result.out
    assert gq("daemon", "status").out.startswith(
        f"gq daemon is running (pid {daemon.pid()}, personal mode"
    )


def test_unwritable_output_path_fails_job_naming_the_path(daemon, tmp_path):
    script = write_script(tmp_path / "o.sh", "echo hi\n")
    target = tmp_path / "no-such-dir" / "out.log"
    info = wait_state(submit("-o", str(target), str(script)), "FAILED")
    assert str(target) in info["reason"]


def test_status_filters_and_json_fields(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 30\n")
    running = submit("--exclusive", str(script))
    wait_state(running, "RUNNING")
    pending = submit("--exclusive", "-J", "waiting", str(script))
    jobs = {j["id"]: j for j in all_jobs()}
    required = {
        "id",
        "name",
        "user",
        "state",
        "priority",
        "device",
        "submit_time",
        "start_time",
        "end_time",
        "exit_code",
        "steps_done",
        "steps_total",
        "reason",
    }
    assert required <= set(jobs[running])
    assert (
        jobs[running]["submit_time"].endswith(("+00:00", "Z"))
        or "+" in jobs[running]["submit_time"]
        or "-" in jobs[running]["submit_time"][19:]
    )
    import json

    only_pending = json.loads(gq_ok("status", "--json", "--state", "PD"))
    assert [j["id"] for j in only_pending] == [pending]
    assert json.loads(gq_ok("status", "--json", "--user", "nobody-else")) == []
    text = gq_ok("status")
    assert "waiting" in text and " PD " in text and " R " in text
    assert gq_ok("status", "-S", "-i", "-o", "%i:%t:%R").splitlines() == [
        "JOBID:ST:REASON",
        f"{pending}:PD:Resources",
        f"{running}:R:",
    ]
    gq_ok("cancel", str(running), str(pending))
    wait_state(running, "CANCELLED")


def test_history_reports_wait_run_and_jct(daemon, tmp_path):
    import json

    script = write_script(tmp_path / "h.sh", "sleep 0.3\n")
    job_id = submit(str(script))
    wait_state(job_id, "COMPLETED")
    rows = json.loads(gq_ok("history", "--json"))
    row = next(r for r in rows if r["id"] == job_id)
    assert row["run_time"] >= 0.3
    assert row["jct"] >= row["run_time"]
    assert abs(row["jct"] - (row["wait_time"] + row["run_time"])) < 0.05
    assert str(job_id) in gq_ok("history")
    assert [r["id"] for r in json.loads(gq_ok("history", "--json", "--since", "1hour"))] == [job_id]
    assert json.loads(gq_ok("history", "--json", "--since", "2099-01-01")) == []


def test_show_has_state_history(daemon, tmp_path):
    script = write_script(tmp_path / "e.sh", "true\n")
    job_id = submit(str(script))
    info = wait_state(job_id, "COMPLETED")
    assert [(e["old_state"], e["new_state"]) for e in info["events"]] == [
        (None, "PENDING"),
        ("PENDING", "RUNNING"),
        ("RUNNING", "COMPLETED"),
    ]
    text = gq_ok("show", str(job_id))
    assert "PENDING -> RUNNING" in text and "ExitCode: 0" in text


def test_logs_and_follow(daemon, tmp_path):
    script = write_script(tmp_path / "l.sh", "for i in 1 2 3; do echo line $i; sleep 0.2; done\n")
    job_id = submit(str(script))
    followed = gq_ok("logs", "-f", str(job_id))
    assert followed == "line 1\nline 2\nline 3\n"
    assert job(job_id)["state"] == "COMPLETED"
    assert gq_ok("logs", str(job_id)) == followed


def test_info_reports_cpu_device_without_nvidia(daemon):
    import json

    from gq.daemon.devices import discover

    if discover()[1] is None:
        pytest.skip("this node has an NVIDIA GPU")
    text = gq_ok("info")
    assert "no NVIDIA GPU found" in text
    assert "cpu:" in text and f"personal mode, pid {daemon.pid()}" in text
    data = json.loads(gq_ok("info", "--json"))
    assert [d["name"] for d in data["devices"]] == ["cpu"]
    assert (data["pid"], data["mode"]) == (daemon.pid(), "personal")


def test_policy_set_and_show(home):
    assert gq_ok("policy", "show").startswith("fifo")
    assert gq_ok("policy", "set", "srtf").strip() == "Policy set to srtf"
    assert gq_ok("policy", "show").startswith("srtf")
    gq_ok("policy", "set", "priority", "--fill", "gapfit")
    assert gq_ok("policy", "show").startswith("priority (fill gapfit)")


def test_many_jobs_each_run_exactly_once(daemon, tmp_path):
    marker = tmp_path / "runs.txt"
    script = write_script(tmp_path / "once.sh", f"echo $GQ_JOB_ID >> {marker}\n")
    ids = [submit(str(script)) for _ in range(12)]
    wait_for(lambda: all(job(i)["state"] == "COMPLETED" for i in ids), 60, what="12 jobs")
    runs = marker.read_text().split()
    assert sorted(map(int, runs)) == ids
    time.sleep(0.5)
    assert len(marker.read_text().split()) == 12
    assert all(job(i)["run_count"] == 1 for i in ids)


def test_python_interpreter_option(daemon, tmp_path):
    import sys

    script = write_script(tmp_path / "which.py", "import sys\nprint(sys.executable)\n")
    job_id = submit("--python", sys.executable, str(script))
    wait_state(job_id, "COMPLETED")
    assert (tmp_path / f"gq-{job_id}.out").read_text().strip() == os.path.realpath(
        sys.executable
    ) or sys.executable in (tmp_path / f"gq-{job_id}.out").read_text()


def test_a_command_line_instead_of_a_script(daemon, tmp_path, monkeypatch):
    """gq run -- CMD and gq submit --wrap: a Python command is a Python job (its steps
    counted, by the python on the submitter's PATH); any other runs as it is."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("import sys\nprint('module', sys.argv[1:])\n")
    write_script(
        tmp_path / "train.py",
        (
            "import sys\nimport gq\nfor _ in gq.steps(range(3), total=3):\n    pass\n"
            "print('train', sys.argv[1:])\n"
        ),
    )
    python = os.path.basename(PYTHON)
    jobs = {
        "script": submit_via("run", "--", python, "train.py", "--lr", "3e-4"),
        "module": submit_via("run", "-J", "mod", "--", python, "-m", "pkg", "a b"),
        "plain": submit_via("run", "--", "printf", "%s|", "one two", "three"),
        "wrapped": submit_via("submit", "--wrap", f"{python} train.py --wrapped"),
        "shell": submit_via("submit", "--wrap", "echo $SLURM_JOB_NAME; echo done"),
    }
    for job_id in jobs.values():
        wait_state(job_id, "COMPLETED", timeout=30)
    out = {name: (tmp_path / f"gq-{job_id}.out").read_text() for name, job_id in jobs.items()}
    assert out == {
        "script": "train ['--lr', '3e-4']\n",
        "module": "module ['a b']\n",
        "plain": "one two|three|",
        "wrapped": "train ['--wrapped']\n",
        "shell": "wrap\ndone\n",
    }
    shown = {name: job(job_id) for name, job_id in jobs.items()}
    assert (shown["script"]["steps_done"], shown["wrapped"]["steps_done"]) == (3, 3)
    assert [shown[n]["name"] for n in ("script", "module", "plain", "shell")] == [
        "train.py",
        "mod",
        "printf",
        "wrap",
    ]
    count = len(all_jobs())
    for args, words in (
        (["run"], "give the command to run"),
        (["submit", "--wrap", "true", "train.py"], "either a SCRIPT or --wrap"),
        (["run", "--", "python9.9", "train.py"], "python9.9: not found on your"),
        (["run", "--wrap", "x", "--", "true"], "--wrap is gq submit's"),
    ):
        result = gq(*args)
        assert result.code == 2 and words in result.err and len(result.err.splitlines()) == 1
    assert len(all_jobs()) == count


def submit_via(*args: str) -> int:
    result = gq(*args[:1], "--parsable", *args[1:])
    assert result.code == 0, result.err
    return int(result.out)


def test_wait_blocks_on_one_connection_until_the_jobs_end(daemon, tmp_path):
    import subprocess
    import sys

    go = tmp_path / "go"
    held = write_script(
        tmp_path / "held.sh", f"while [ ! -e {go} ]; do sleep 0.05; done\nexit ${{1:-0}}\n"
    )
    first, second = submit(str(held)), submit(str(held), "7")
    waiter = subprocess.Popen(
        [sys.executable, "-m", "gq", "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_state(first, "RUNNING")
    timed_out = gq("wait", str(first), "--timeout", "0.2")
    assert timed_out.code == 124 and "had not all ended after 0.2 s" in timed_out.err
    assert waiter.poll() is None  # both still run: the waiter has had no answer
    wait_for(
        lambda: "waits for 2 job(s) to end" in daemon.log(), 30, what="the waiter to be waiting"
    )  # it may start slowly on a busy machine
    go.touch()
    out, err = waiter.communicate(timeout=30)
    assert waiter.returncode == 7, err  # the first failure's exit code
    assert out.splitlines() == [
        f"Job {first} COMPLETED (exit code 0)",
        f"Job {second} FAILED (exit code 7)",
    ]
    done = gq("submit", "--wait", str(held), "3")
    assert done.code == 3 and done.out.splitlines()[-1].endswith("FAILED (exit code 3)")
    assert gq("wait", str(first)).code == 0  # already ended: answered at once
    nothing = gq("wait")
    assert nothing.code == 2 and "no pending or running job to wait for" in nothing.err


def test_a_launcher_of_processes_runs_as_a_plain_command(daemon, monkeypatch):
    """``python -m torch.distributed.run`` starts the training in processes of its own,
    which the worker would not see: queued as a plain command (on a GPU: a device of its
    own), while another module is a Python job."""
    monkeypatch.setenv("PATH", f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}")
    python = os.path.basename(PYTHON)
    launched = submit_via(
        "run",
        "--hold",
        "--",
        python,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "train.py",
    )
    module = submit_via("run", "--hold", "--", python, "-m", "pkg")
    assert (job(launched)["worker"], job(module)["worker"]) == (False, True)
    gq_ok("cancel", str(launched), str(module))
