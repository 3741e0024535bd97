"""--rotate PERIOD: under fair and rr, when more jobs want to be resident than fit, residents
whose turn has lasted the period go to host memory and the jobs waiting come in, each in
its turn. The real daemon, host and CLI on the cpu device, its memory moved by the
driver's stand-in (--checkpoint fake); periods of a second."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import DaemonControl, gq, gq_ok, job, submit, wait_for, wait_state, write_script

ROTATED_OUT = "Rotated out: its memory to host memory after its turn of "


def _node(home, policy: str, *options: str) -> DaemonControl:
    """One 1G lane: room for two jobs of 400M."""
    control = DaemonControl(home)
    control.start(
        "--lanes", "1", "--checkpoint", "fake", "--cpu-memory", "1G", "--rotate", "1s", *options
    )
    gq_ok("policy", "set", policy)
    return control


def _steps(tmp_path, name: str, steps: int, pause: float = 0.02):
    return write_script(
        tmp_path / f"{name}.py",
        f"import time\nimport gq\nfor _ in gq.steps(range({steps}), total={steps}):\n"
        f"    time.sleep({pause})\n",
    )


def _events(job_id: int) -> list[dict]:
    return job(job_id)["events"]


def _out(job_id: int) -> list[str]:
    return [e["reason"] for e in _events(job_id) if e["new_state"] == "PREEMPTED"]


def _seen_out(ids: list[int]) -> tuple[int, str] | None:
    """One of the jobs and its gq show, where that page says it is out after its turn, its
    memory moved, and gq status lists a job rotated out too."""
    for job_id in ids:
        page = gq_ok("show", str(job_id))
        if "Preempted: yes: rotated out after its turn" in page and "400.0M in host memory" in page:
            if ROTATED_OUT in gq_ok("status"):
                return job_id, page
    return None


def test_three_jobs_with_room_for_two_take_turns_and_each_completes(home, tmp_path):
    """Under rr a job rotated out shows S, the reason, its memory in host memory and the
    move's cost, and comes back; the turns go on across a daemon restart, which keeps
    --rotate."""
    _node(home, "rr")
    assert "residents take turns of 1 second when more jobs want" in gq_ok("policy", "show")
    ids = [submit("--gpu-mem", "400M", str(_steps(tmp_path, f"j{n}", 100))) for n in range(3)]
    out = wait_for(
        lambda: next((j for j in map(job, ids) if j["state"] == "SUSPENDED"), None),
        30,
        what="a job rotated out",
    )
    assert out["preempted"] and out["reason"].startswith(ROTATED_OUT), out["reason"]
    # The first turn out was for the job that waited (a loaded machine's polls may first
    # see a later one: the events say which came first).
    first = min(
        (e for job_id in ids for e in _events(job_id) if e["new_state"] == "PREEMPTED"),
        key=lambda e: e["time"],
    )
    assert first["reason"].endswith(f"; job {ids[2]} in"), first
    # Seen while one is out, by gq show and gq status alike. Any of them: a loaded machine's
    # turn out can be over before one look, and that job may never go out again.
    rotated, shown = wait_for(lambda: _seen_out(ids), 30, what="a job seen rotated out")
    assert "400.0M in host memory, the device freed (the move took" in shown
    assert "RUNNING -> PREEMPTED  (Rotated out" in shown
    wait_for(lambda: any("Rotated in" in (e["reason"] or "") for e in _events(rotated)), 30)

    assert "restarted" in gq_ok("daemon", "restart")
    options = json.loads(gq_ok("info", "--json"))["options"]
    assert options[options.index("--rotate") + 1] == "1s"
    for job_id in ids:
        assert wait_state(job_id, "COMPLETED", timeout=90)["steps_done"] == 100
    assert all(_out(job_id) for job_id in ids[:2])  # each of the first two had its turn
    log = (home / "daemon.log").read_text()
    assert "moved out to host memory in" in log and "moved back to its device in" in log


@pytest.mark.parametrize("policy", ["fifo", "priority"])
def test_other_policies_rotate_nothing(home, tmp_path, policy):
    _node(home, policy)
    assert f"--rotate 1 second is idle under {policy}" in gq_ok("policy", "show")
    first, second = (
        submit("--gpu-mem", "400M", str(_steps(tmp_path, f"j{n}", 50))) for n in range(2)
    )
    third = submit("--gpu-mem", "400M", "--wrap", "true")
    ended = wait_state(third, "COMPLETED", timeout=60)
    done = [wait_state(j, "COMPLETED", timeout=60) for j in (first, second)]
    assert ended["start_time"] >= min(j["end_time"] for j in done)  # it waited for room
    assert not any(_out(j) for j in (first, second, third))


def test_a_job_whose_memory_cannot_move_is_never_rotated(home, tmp_path):
    """A plain process has no boundary to stop at: the Python job beside it goes out for
    the one waiting, though the plain one's turn is older."""
    _node(home, "fair")
    gate = tmp_path / "go"
    plain = submit("--gpu-mem", "400M", "--wrap", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    wait_state(plain, "RUNNING")
    python = submit("--gpu-mem", "400M", str(_steps(tmp_path, "py", 60)))
    waiting = submit("--gpu-mem", "400M", str(_steps(tmp_path, "waiting", 20)))
    wait_for(lambda: _out(python), 30, what="the Python job rotated out")
    wait_state(waiting, "COMPLETED", timeout=60)
    assert wait_state(python, "COMPLETED", timeout=60)["steps_done"] == 60
    gate.touch()
    wait_state(plain, "COMPLETED", timeout=30)
    assert not _out(plain)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", str(2**70), "garbage", "8days"])
def test_a_rotation_period_that_is_not_a_positive_time_is_refused(home, value):
    result = gq("daemon", "start", "--rotate", value)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert f"--rotate {value[:40]!r}: give a time of more than 0 and at most 7 days" in result.err
    assert not (home / "daemon.pid").exists()
    daemon = subprocess.run(
        [sys.executable, "-m", "gq.daemon", "--rotate", value],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert daemon.returncode == 2 and "give a time of more than 0" in daemon.stderr
