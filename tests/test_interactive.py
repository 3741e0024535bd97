"""gq run --pty: an interactive job on a real pseudo-terminal (pexpect drives gq as a person
at a terminal would), queued and placed like any job, its terminal handed from its host to
the submitter's gq."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pexpect
import pytest

from conftest import ROOT, DaemonControl, all_jobs, gq, gq_ok, job, submit, wait_for, wait_state

PROMPT = "gq> "  # bash's PS1 in these tests (root's default ends in '#')


def _spawn(*args: str, env: dict | None = None, **kwargs) -> pexpect.spawn:
    """``python -m gq ARGS`` on a pseudo-terminal of its own, this gq first on its path."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(ROOT), PS1=PROMPT)
    return pexpect.spawn(
        sys.executable, ["-m", "gq", *args], env=env, encoding="utf-8", timeout=15, **kwargs
    )


def _ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_pty_without_a_terminal_is_one_line_exit_2_and_queues_nothing(daemon):
    done = subprocess.run(
        [sys.executable, "-m", "gq", "run", "--pty", "--", "bash"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and "--pty needs a terminal" in done.stderr
    assert all_jobs() == []


@pytest.mark.parametrize(
    "args, said",
    [
        (["--array", "0-1"], "--pty runs one job on your terminal: it takes no --array"),
        (["--requeue"], "it takes no --requeue"),
        (["--retries", "2"], "it takes no --retries"),
        (["--wait"], "--pty waits for its job already"),
        (["--idle-timeout", "soon"], "--idle-timeout: invalid time limit 'soon'"),
        (["--idle-timeout", "-5"], "--idle-timeout: invalid time limit '-5'"),
        (["--idle-timeout", "9" * 30], "--idle-timeout: invalid time limit"),
    ],
)
def test_pty_refuses_what_would_run_it_again_and_queues_nothing(daemon, args, said):
    child = _spawn("run", "--pty", *args, "--", "bash")
    assert _ended(child) == 2
    lines = child.before.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gq: error: ") and said in lines[0], lines
    assert all_jobs() == []


def test_only_an_interactive_job_leaves_its_output_to_a_terminal(daemon, tmp_path):
    from gq import client, messages
    from gq.errors import UserError

    request = messages.Submit(
        script_path=str(tmp_path / "a.sh"),
        script=b"true\n",
        args=[],
        workdir=str(tmp_path),
        env={},
        umask=0o022,
        options=messages.SubmitOptions(output=None),
    )
    with pytest.raises(UserError, match="--output needs a file name"):
        client.ask(request)
    # Only an interactive job has idle time, whichever way the request came.
    request.options = messages.SubmitOptions(idle_timeout=60)
    with pytest.raises(UserError, match="--idle-timeout: only an interactive job has idle"):
        client.ask(request)
    for args in (
        ["submit", "--idle-timeout", "5", "--wrap", "true"],
        ["run", "--idle-timeout", "5", "--", "true"],
    ):
        refused = gq(*args)
        assert refused.code == 2 and refused.err == (
            "gq: error: --idle-timeout: only an interactive job has idle time (gq run --pty, "
            "gq kernel install)\n"
        ), refused
    assert gq("submit", "--pty", "--wrap", "true").err.startswith("gq: error: --pty is gq run's")
    assert all_jobs() == []


def test_pending_job_shows_its_reason_and_ctrl_c_cancels_it_leaving_nothing(daemon, tmp_path):
    held = submit("--hold", "--wrap", "true")
    child = _spawn("run", "--pty", "--after", str(held), "--", "bash", "--norc")
    child.expect(r"job (\d+) pending \(Dependency\); Ctrl-C cancels it")
    job_id = int(child.match.group(1))
    child.sendintr()
    child.expect(pexpect.EOF)
    # Nothing more is said: the status line is wiped, the ^C is the terminal's own echo.
    assert child.before.replace("\x1b[K", "").replace("^C", "").strip() == ""
    child.close()
    assert child.exitstatus == 130
    info = wait_state(job_id, "CANCELLED")
    assert info["start_time"] is None and info["interactive"]
    assert not list(tmp_path.glob("gq-*.out"))
    assert os.listdir(daemon.root / "terminals") == []


def test_bash_runs_on_the_terminal_with_its_size_signals_and_exit_status(daemon, tmp_path):
    child = _spawn("run", "--pty", "-G", "0", "--", "bash", "--norc")
    child.expect(PROMPT)
    child.sendline("echo $((6 * 7)) $GQ_JOB_ID; tty")
    child.expect(r"42 (\d+)\r\n/dev/pts/")
    job_id = int(child.match.group(1))
    child.expect(PROMPT)
    child.setwinsize(33, 101)  # the window follows this terminal (SIGWINCH)
    child.sendline("stty size")
    child.expect("33 101")
    child.expect(PROMPT)
    for key in ("c", "z"):  # to the job's foreground process (cat, once it echoes), not gq
        # Typed only once bash has left readline (which turns the terminal's echo off), so
        # that the terminal echoes it and cat prints it: 'ready' comes just before cat runs.
        child.sendline('echo rea""dy; cat')
        child.expect("ready\r\n")
        child.sendline("ping")
        child.expect("ping\r\nping\r\n")
        child.sendcontrol(key)
        if key == "z":  # job control: the shell stopped it
            child.expect("Stopped")
        child.expect(PROMPT)
    # fg waits for the killed job's end: a plain wait does not wait for a stopped job, and
    # under load bash could still count cat as stopped at the exit ("There are stopped jobs").
    child.sendline("kill -9 %1; fg >/dev/null 2>&1; echo done")
    child.expect("done")
    info = job(job_id)
    assert (info["state"], info["interactive"]) == ("RUNNING", True)
    assert " [pty] " in gq_ok("status")
    child.sendline("exit 7")
    assert _ended(child) == 7
    info = wait_state(job_id, "FAILED")
    assert (info["exit_code"], info["reason"]) == (7, "exit code 7")
    assert not list(tmp_path.glob("gq-*.out"))  # its output was the terminal's
    logs = gq("logs", str(job_id))
    assert logs.code == 2 and "its output went to its terminal" in logs.err
    again = gq("requeue", str(job_id))
    assert again.code == 2 and "run it again with gq run --pty" in again.err


def test_a_command_that_ends_before_gq_attaches_still_shows_its_output(daemon):
    child = _spawn("run", "--pty", "-G", "0", "--", "sh", "-c", "echo early; exit 5")
    child.expect("early")
    assert _ended(child) == 5


def test_output_goes_to_the_file_o_names_and_input_comes_from_the_terminal(daemon, tmp_path):
    child = _spawn(
        "run",
        "--pty",
        "-G",
        "0",
        "-o",
        "out.txt",
        "--",
        "sh",
        "-c",
        "read x; echo got $x",
        cwd=str(tmp_path),
    )
    child.sendline("hi")
    assert _ended(child) == 0
    assert (tmp_path / "out.txt").read_text() == "got hi\n"


def test_a_cancel_hangs_the_shell_up_and_its_terminal_says_so(daemon):
    child = _spawn("run", "--pty", "-G", "0", "--", "bash", "--norc")
    child.expect(PROMPT)
    child.sendline("echo $GQ_JOB_ID")
    child.expect(r"(\d+)\r\n")
    job_id = int(child.match.group(1))
    gq_ok("cancel", str(job_id))
    child.expect(f"gq: job {job_id} CANCELLED: cancelled by user")
    # A hang-up ends an interactive shell, which ignores the cancel's SIGTERM.
    assert _ended(child) == 128 + signal.SIGHUP


def test_python_repl_runs_under_gq_and_holds_the_lane_only_inside_a_statement(daemon):
    child = _spawn("run", "--pty", "--", "python")
    child.expect(">>> ")
    child.sendline("import gq, itertools, os, time; print(gq.in_job(), os.environ['GQ_JOB_ID'])")
    child.expect(r"True (\d+)")
    job_id = int(child.match.group(1))
    # A statement that enters an iteration and never leaves it: it holds the lane while it
    # runs, and its end gives the lane back.
    child.expect(">>> ")
    child.sendline("g = gq.steps(itertools.count()); next(g); time.sleep(30)")
    wait_for(lambda: job(job_id)["holds_lane"], 10, what="the statement to hold the lane")
    child.sendintr()
    child.expect("KeyboardInterrupt")
    child.expect(">>> ")
    wait_for(lambda: not job(job_id)["holds_lane"], 10, what="the lane back between statements")
    assert job(job_id)["state"] == "RUNNING"  # Ctrl-C did not end it
    child.sendline("raise SystemExit(7)")
    assert _ended(child) == 7
    assert wait_state(job_id, "FAILED")["exit_code"] == 7


def test_a_closed_terminal_hangs_the_job_up(daemon):
    child = _spawn("run", "--pty", "-G", "0", "--", "bash", "--norc")
    child.expect(PROMPT)
    child.sendline("echo $GQ_JOB_ID")
    child.expect(r"(\d+)\r\n")
    job_id = int(child.match.group(1))
    child.expect(PROMPT)
    child.close(force=True)  # the terminal goes away under gq
    info = wait_state(job_id, "FAILED")
    assert info["reason"] == "hung up: its terminal was closed", info
    assert info["exit_code"] == 128 + signal.SIGHUP


def test_a_terminal_no_gq_takes_hangs_its_job_up(home):
    daemon = DaemonControl(home)
    daemon.start("--kill-wait", "1", "--attach-wait", "1")
    held = submit("--hold", "--wrap", "true")
    child = _spawn("run", "--pty", "-G", "0", "--after", str(held), "--", "bash", "--norc")
    child.expect(r"job (\d+) pending")
    job_id = int(child.match.group(1))
    child.kill(signal.SIGKILL)  # gq dies while its job is pending
    child.close(force=True)
    gq_ok("release", str(held))
    info = wait_state(job_id, "FAILED")
    assert info["reason"] == "hung up: no gq took its terminal within 1 s", info
    assert os.listdir(home / "terminals") == []
    daemon.stop()


def test_the_job_runs_as_its_submitter_whose_terminal_no_one_else_can_take(shared_node, users):
    alice, bob = users["alice"], users["bob"]
    env = {**shared_node.env, "PS1": PROMPT}
    as_alice = [
        "runuser",
        "-u",
        alice.name,
        "--",
        "env",
        *[f"{k}={v}" for k, v in env.items()],
        shared_node.install.python,
        "-m",
        "gq",
    ]
    child = pexpect.spawn(
        as_alice[0],
        [*as_alice[1:], "run", "--pty", "-G", "0", "--", "bash", "--norc"],
        cwd=str(alice.workdir),
        encoding="utf-8",
        timeout=20,
    )
    child.expect(PROMPT)
    child.sendline("id -u; stat -c %U $(tty)")
    child.expect(rf"{alice.uid}\r\n{alice.name}\r\n")
    child.sendline("exit 3")
    assert _ended(child) == 3

    # Alice's gq dies while her job is pending: when it starts, its terminal's socket waits
    # for her, and no one else may take it.
    held = int(shared_node.ok(alice, "submit", "--parsable", "--hold", "--wrap", "true"))
    child = pexpect.spawn(
        as_alice[0],
        [*as_alice[1:], "run", "--pty", "-G", "0", "--after", str(held), "--", "bash", "--norc"],
        cwd=str(alice.workdir),
        encoding="utf-8",
        timeout=20,
    )
    child.expect(r"job (\d+) pending")
    job_id = int(child.match.group(1))
    child.kill(signal.SIGKILL)
    child.close(force=True)
    shared_node.ok(alice, "release", held)
    shared_node.wait_state(job_id, "RUNNING")
    path = shared_node.root / "terminals" / f"{job_id}.sock"
    wait_for(path.exists, 10, what="the job's terminal socket")
    assert (path.stat().st_uid, path.stat().st_mode & 0o777) == (alice.uid, 0o600)
    take = (
        "import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
        " line, fds, _, _ = socket.recv_fds(s, 4096, 1); print(len(fds), json.loads(line))"
    )
    refused = subprocess.run(
        ["runuser", "-u", bob.name, "--", shared_node.install.python, "-c", take, str(path)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "PermissionError" in refused.stderr
    with socket.socket(socket.AF_UNIX) as root_peer:  # root passes the file's mode, not
        root_peer.connect(str(path))  # the host's check of who is asking
        assert socket.recv_fds(root_peer, 4096, 1)[:2] == (b"", [])
    taken = subprocess.run(
        ["runuser", "-u", alice.name, "--", shared_node.install.python, "-c", take, str(path)],
        capture_output=True,
        text=True,
    )
    assert taken.stdout.startswith("1 {") and f"'job': {job_id}" in taken.stdout, taken
    info = shared_node.wait_state(job_id, "FAILED")  # the taker left: the job hung up
    assert (info["user"], info["reason"]) == (alice.name, "hung up: its terminal was closed")


def test_ctrl_c_while_a_statement_waits_for_the_lane_leaves_the_lane_to_others(daemon, tmp_path):
    """The interrupt comes once the lane is granted, and the statement's end gives it back:
    a grant lost between worker and host would leave the idle REPL holding the lane."""
    gq_ok("policy", "set", "fair")  # (fifo gives a later job no turn while the first runs)
    batch = tmp_path / "batch.py"
    batch.write_text("import gq, time\nfor _ in gq.steps(range(100000)):\n    time.sleep(1)\n")
    batch_id = submit("--gpu-mem", "64M", str(batch))
    wait_for(lambda: job(batch_id)["holds_lane"], 15, what="the batch job's iteration")
    child = _spawn("run", "--pty", "--gpu-mem", "64M", "--", "python")
    child.expect(">>> ")
    child.sendline(
        "import gq, itertools, os; print('asking', os.environ['GQ_JOB_ID']); "
        "g = gq.steps(itertools.count()); next(g)"
    )
    child.expect(r"asking (\d+)")
    repl_id = int(child.match.group(1))
    child.sendintr()  # while the batch job's 1 s iteration holds the lane
    child.expect("KeyboardInterrupt")
    child.expect(">>> ")
    steps = job(batch_id)["steps_done"]
    wait_for(
        lambda: job(batch_id)["steps_done"] > steps + 1,
        15,
        what="the batch job to go on while the REPL is idle",
    )
    assert not job(repl_id)["holds_lane"] and job(repl_id)["state"] == "RUNNING"
    child.sendeof()
    assert _ended(child) == 0


def _repl_beside_batch(tmp_path, iteration: float) -> tuple[int, pexpect.spawn]:
    """Under fifo, a batch job of ``iteration`` s sleeps, running, and a REPL beside it at
    its first prompt."""
    gq_ok("policy", "set", "fifo")
    batch = tmp_path / "batch.py"
    batch.write_text(
        f"import gq, time\nfor _ in gq.steps(range(100000)):\n    time.sleep({iteration})\n"
    )
    batch_id = submit("--gpu-mem", "64M", str(batch))
    wait_for(lambda: job(batch_id)["steps_done"] > 0, 15, what="the batch job's iterations")
    child = _spawn("run", "--pty", "--gpu-mem", "64M", "--", "python")
    child.expect(">>> ")
    return batch_id, child


def test_a_statement_goes_before_batch_iterations_which_still_get_every_other_turn(
    daemon, tmp_path
):
    """People first, under fifo too: a REPL's statement is granted after at most the batch
    iteration in progress, not after the batch job's end; while it computes on in steps
    longer than the batch job's, the batch job still gets a turn between each of them."""
    batch_id, child = _repl_beside_batch(tmp_path, 0.5)
    child.sendline("import gq, itertools, os, time; print('job', os.environ['GQ_JOB_ID'])")
    child.expect(r"job (\d+)")
    repl_id = int(child.match.group(1))
    assert job(repl_id)["device"] == job(batch_id)["device"]
    child.expect(">>> ")
    child.sendline(
        "g = gq.steps(itertools.count()); t = time.monotonic(); next(g); "
        "print('granted after %.1f s' % (time.monotonic() - t))"
    )
    child.expect(r"granted after (\d+\.\d) s", timeout=10)
    assert float(child.match.group(1)) < 3.0  # a 0.5 s batch iteration, not the batch job
    child.expect(">>> ")
    before = job(batch_id)["steps_done"]
    child.sendline("for _ in range(4): next(g); time.sleep(0.6)\n")
    child.sendline("print('looped')")
    child.expect("\r\nlooped", timeout=20)
    assert job(batch_id)["steps_done"] - before >= 3  # a batch turn between the REPL's
    child.sendeof()
    assert _ended(child) == 0
    gq_ok("cancel", str(batch_id))


def test_a_statement_of_short_steps_alternates_with_batch_iterations_by_lane_time(daemon, tmp_path):
    """A person's turns last as long as the batch iteration before them did: a statement of
    100 steps of 10 ms beside a batch job of 0.2 s iterations gets about half the lane, not
    one step a batch iteration (which would take 100 x 0.21 s = 21 s); and the batch job
    still gets its turns between."""
    batch_id, child = _repl_beside_batch(tmp_path, 0.2)
    child.sendline("import gq, itertools, time; g = gq.steps(itertools.count())")
    child.expect(">>> ")
    before = job(batch_id)["steps_done"]
    child.sendline(
        "t = time.monotonic()\nfor _ in range(100): next(g); time.sleep(0.01)\n\n"
        "print('took %.1f s' % (time.monotonic() - t))"
    )
    child.expect(r"took (\d+\.\d) s", timeout=40)
    assert float(child.match.group(1)) < 10.0  # 1 s of its own steps, 1 s of the batch's
    assert job(batch_id)["steps_done"] - before >= 2  # the batch job's turns between
    child.sendeof()
    assert _ended(child) == 0
    gq_ok("cancel", str(batch_id))


@pytest.mark.long
def test_an_idle_repl_shows_its_idle_time_and_its_idle_timeout_ends_it(daemon):
    """Idle is no typing, no output and no statement computing: a statement that runs past
    the --idle-timeout is not idle; once the REPL sits at its prompt that long, the job is
    ended as Jupyter's culler ends a kernel, and the terminal says why. (8 s: the idle time
    shows a report after the prompt, and a loaded machine's reads took most of 4 s.)"""
    child = _spawn("run", "--pty", "--idle-timeout", "0:08", "--", "python")
    child.expect(">>> ")
    child.sendline("import os, time; print('job', os.environ['GQ_JOB_ID'])")
    child.expect(r"job (\d+)")
    job_id = int(child.match.group(1))
    child.expect(">>> ")
    began = time.monotonic()
    child.sendline("time.sleep(10); print('slept')")  # computing past the timeout, silent
    child.expect("slept", timeout=30)
    child.expect(">>> ")
    assert time.monotonic() - began >= 10 and job(job_id)["state"] == "RUNNING"
    info = wait_for(
        lambda: (lambda j: j if j["idle"] and j["idle"] >= 1 else None)(job(job_id)),
        10,
        what="the REPL's idle time to show",
    )
    assert info["idle_timeout"] == 8 and info["interactive"]
    assert "ended when idle 0:08 (--idle-timeout)" in gq_ok("show", str(job_id))
    child.expect(
        rf"gq: job {job_id} TIMEOUT: idle timeout: no activity for 0:(0[89]|1[01])", timeout=30
    )
    assert _ended(child) == 128 + signal.SIGHUP
    ended = wait_state(job_id, "TIMEOUT")
    assert ended["reason"].startswith("idle timeout: no activity for 0:"), ended
    assert ended["idle"] is None  # idle time is a running job's


def test_ipython_runs_under_gq_with_its_cells_holding_the_lane(daemon):
    """``gq run --pty -- ipython``: IPython's own terminal shell, run by gq's worker on the
    interpreter ipython is installed for, each cell ending its iteration."""
    pytest.importorskip("IPython")
    child = _spawn(
        "run",
        "--pty",
        "--",
        "ipython",
        "--no-banner",
        "--colors=NoColor",
        "--no-confirm-exit",
        "--simple-prompt",
    )
    child.expect(r"In \[1\]: ")
    child.sendline("import gq, itertools, os, time; print(gq.in_job(), os.environ['GQ_JOB_ID'])")
    child.expect(r"True (\d+)")
    job_id = int(child.match.group(1))
    assert job(job_id)["name"] == "ipython" and job(job_id)["worker"]
    child.expect(r"In \[2\]: ")
    child.sendline("g = gq.steps(itertools.count()); next(g); time.sleep(30)")
    wait_for(lambda: job(job_id)["holds_lane"], 10, what="the cell to hold the lane")
    child.sendintr()
    child.expect("KeyboardInterrupt")
    child.expect(r"In \[3\]: ")
    wait_for(lambda: not job(job_id)["holds_lane"], 10, what="the lane back between cells")
    child.sendline("exit")
    assert _ended(child) == 0
    assert wait_state(job_id, "COMPLETED")["exit_code"] == 0


def test_ipython_is_run_by_the_python_its_script_names_and_else_as_it_is(tmp_path, monkeypatch):
    from gq.cli import command_lines
    from gq.errors import UserError

    python = os.path.realpath(sys.executable)
    scripts = {
        "ipython": f"#!{python}\n",
        "ipython3": "#!/usr/bin/env python3\n",
        "ipython4": f"#!{python} -E\n",
        "ipython5": "#!/bin/bash\nexec python3\n",
        "ipython6": "",
    }
    for name, text in scripts.items():
        (tmp_path / name).write_text(text + "from IPython import start_ipython\n")
        (tmp_path / name).chmod(0o755)
    os.symlink(python, tmp_path / "python3")
    monkeypatch.setenv("PATH", str(tmp_path))
    for name, interpreter in (("ipython", python), ("ipython3", str(tmp_path / "python3"))):
        queued = command_lines.from_argv([name, "--no-banner"], interactive=True)
        assert (queued.interpreter, queued.args, queued.name) == (
            interpreter,
            ["--no-banner"],
            "ipython",
        ), name
    for name in ("ipython4", "ipython5", "ipython6"):  # no plain Python named: as it is
        assert command_lines.from_argv([name], interactive=True).interpreter is None, name
    assert command_lines.from_argv(["ipython"]).interpreter is None  # a batch job: as it is
    queued = command_lines.from_argv(["python3", "-m", "IPython", "-i"], interactive=True)
    assert (queued.interpreter, queued.args) == (str(tmp_path / "python3"), ["-i"])
    with pytest.raises(UserError, match="ipython9: not found on your PATH"):
        command_lines.from_argv(["ipython9"], interactive=True)


def test_terminal_times_a_job_sets_before_1970_cost_no_one_else_anything(daemon, tmp_path):
    """A job owns its terminal and may set its times to 1969: taken as its last activity,
    the host sent the daemon a time the wire refuses, and the daemon dropped the host's
    every report, other users' jobs on the device with them."""
    batch = tmp_path / "batch.py"
    batch.write_text("import gq, time\nfor _ in gq.steps(range(100000)):\n    time.sleep(0.05)\n")
    batch_id = submit("--gpu-mem", "64M", str(batch))
    wait_for(lambda: job(batch_id)["steps_done"] > 0, 15, what="the batch job's steps")
    child = _spawn(
        "run",
        "--pty",
        "--gpu-mem",
        "64M",
        "--",
        sys.executable,
        "-c",
        "import os, time; os.utime(os.ttyname(0), (-100, -100)); time.sleep(2.5)",
    )
    assert _ended(child) == 0
    steps = job(batch_id)["steps_done"]
    wait_for(
        lambda: job(batch_id)["steps_done"] > steps + 5,
        10,
        what="the batch job's progress to go on reaching the daemon",
    )
    log = (daemon.root / "daemon.log").read_text()
    assert "out of range" not in log and "protocol" not in log, log[-2000:]
    gq_ok("cancel", str(batch_id))
