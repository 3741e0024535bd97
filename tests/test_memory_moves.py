"""gq suspend frees the device: a suspended job's device memory moved to host memory at
its next iteration boundary, others admitted into what it freed, and brought back on
resume once it fits again. On the cpu device the driver's part is the fake
(``--checkpoint fake``); everything around it (the host's moves, the daemon's books and
its gated resume, gq show) is the real thing. Without it, the cpu device moves nothing and
says why."""

from __future__ import annotations

import os
import sqlite3

import psutil
import pytest

from gq.home import Home
from gq.queue import engine, lookups, scheduling_rows
from gq.queue.engine import HEAD_REVISION, Database, migrate
from gq.queue.states import JobState

from conftest import DaemonControl, gq_ok, job, submit, wait_for, wait_state, write_script


def _gated(tmp_path, name: str, steps: int):
    """A script that runs ``steps`` steps, slowly after its third until its gate exists."""
    gate = tmp_path / f"{name}.go"
    script = write_script(
        tmp_path / f"{name}.py",
        "import os, sys, time\nimport gq\n"
        f"gate = {str(gate)!r}\n"
        f"for step in gq.steps(range({steps}), total={steps}):\n"
        "    time.sleep(0.02 if step < 3 or os.path.exists(gate) else 0.1)\n",
    )
    return script, gate


def _until(gate) -> str:
    """A shell job's command: it runs until ``gate`` exists."""
    return f"while [ ! -e {gate} ]; do sleep 0.05; done"


def _fake_node(home, *options: str) -> DaemonControl:
    """A daemon of one 1G lane whose host moves memory with the driver's stand-in."""
    control = DaemonControl(home)
    control.start("--lanes", "1", "--checkpoint", "fake", "--cpu-memory", "1G", *options)
    return control


def _submit_the_fake_fails(how: str, *args: str) -> int:
    """A job whose environment has GQ_FAKE_CHECKPOINT_FAILS=``how``: the fake refuses its
    move out (as the driver refuses CUDA IPC memory), 'stuck' leaving it locked too."""
    os.environ["GQ_FAKE_CHECKPOINT_FAILS"] = how
    try:
        return submit(*args)
    finally:
        del os.environ["GQ_FAKE_CHECKPOINT_FAILS"]


def _memory(job_id: int) -> dict:
    return job(job_id)["device_memory"]


def test_a_suspended_jobs_memory_goes_to_the_host_and_others_use_the_device(home, tmp_path):
    control = _fake_node(home)
    first_script, first_go = _gated(tmp_path, "first", 200)
    second_script, second_go = _gated(tmp_path, "second", 200)
    first = submit("--gpu-mem", "600M", str(first_script))
    wait_for(lambda: job(first)["steps_done"] >= 3, 30, what="the first job's steps")
    second = submit("--gpu-mem", "600M", str(second_script))
    reason = wait_for(lambda: job(second)["reason"], 30, what="the second's reason")
    assert job(second)["state"] == "PENDING", reason  # 600M beside 600M does not fit in 1G

    assert gq_ok("suspend", str(first)).strip() == f"Suspended job {first}"
    moved = wait_for(
        lambda: (m := _memory(first))["place"] == "host" and m, 30, what="its memory moved"
    )
    assert moved["moved"] == 600 << 20 and moved["took"] is not None
    assert "600.0M in host memory, the device freed" in gq_ok("show", str(first))
    # What it freed is the second job's now.
    wait_state(second, "RUNNING")
    steps = job(second)["steps_done"]

    # Resumed while the second holds the memory: it comes back only once that is free.
    assert gq_ok("resume", str(first)).strip() == f"Resumed job {first}"
    wait_for(lambda: job(second)["steps_done"] >= steps + 5, 30, what="the second's steps")
    assert _memory(first)["place"] == "host"
    assert "it resumes once that much is free on its device" in gq_ok("show", str(first))
    held_at = job(first)["steps_done"]
    # A job submitted meanwhile does not take what the resumed one waits for.
    third = submit("--gpu-mem", "600M", "--wrap", "true")

    second_go.touch()
    wait_state(second, "COMPLETED", timeout=60)
    wait_for(lambda: _memory(first)["place"] == "device", 30, what="its memory back")
    assert "brought back from host memory" in gq_ok("show", str(first))
    first_go.touch()
    ended = wait_state(first, "COMPLETED", timeout=60)
    assert ended["steps_done"] == 200 and held_at < 200
    assert wait_state(third, "COMPLETED", timeout=60)["start_time"] >= ended["end_time"]
    control.stop()


def test_where_memory_cannot_move_the_job_is_frozen_holding_it_and_says_why(home, tmp_path):
    """The cpu device's own answer (nothing to move), and a move the driver refuses (the
    fake refuses a job whose environment names GQ_FAKE_CHECKPOINT_FAILS, as the driver
    refuses CUDA IPC memory): both jobs keep their memory, frozen, and go on when resumed."""
    control = DaemonControl(home)
    control.start("--lanes", "1", "--cpu-memory", "1G")
    script, go = _gated(tmp_path, "plain", 100)
    held = submit("--gpu-mem", "600M", str(script))
    wait_for(lambda: job(held)["steps_done"] >= 3, 30, what="its steps")
    gq_ok("suspend", str(held))
    memory = wait_for(lambda: (m := _memory(held))["held_why"] and m, 30, what="a reason")
    assert memory["place"] == "device"
    assert memory["held_why"] == "the cpu device holds no device memory to move"
    other = submit("--gpu-mem", "600M", "--wrap", "true")
    gq_ok("resume", str(held))
    go.touch()
    assert wait_state(held, "COMPLETED", timeout=60)["steps_done"] == 100
    wait_state(other, "COMPLETED", timeout=60)  # after it: its memory was never freed
    assert job(other)["start_time"] >= job(held)["end_time"]
    control.stop()

    control.start("--lanes", "1", "--checkpoint", "fake", "--cpu-memory", "1G")
    script, go = _gated(tmp_path, "refused", 100)
    refused = _submit_the_fake_fails("1", "--gpu-mem", "600M", str(script))
    wait_for(lambda: job(refused)["steps_done"] >= 3, 30, what="its steps")
    gq_ok("suspend", str(refused))
    memory = wait_for(lambda: (m := _memory(refused))["held_why"] and m, 30, what="a reason")
    assert memory["place"] == "device"
    assert "CUDA_ERROR_NOT_SUPPORTED" in memory["held_why"]
    assert "held on the device while suspended" in gq_ok("show", str(refused))
    gq_ok("resume", str(refused))
    go.touch()
    assert wait_state(refused, "COMPLETED", timeout=60)["steps_done"] == 100
    control.stop()


def test_a_job_the_driver_leaves_locked_ends_failed_saying_why(home, tmp_path):
    """The move out failed and could not be undone (the fake leaves the process locked
    where GQ_FAKE_CHECKPOINT_FAILS is 'stuck'): a locked process waits for ever, so the
    job ends FAILED with the driver's words, and the device goes to the next job."""
    control = _fake_node(home)
    script, go = _gated(tmp_path, "stuck", 100)
    stuck = _submit_the_fake_fails("stuck", "--gpu-mem", "600M", str(script))
    wait_for(lambda: job(stuck)["steps_done"] >= 3, 30, what="its steps")
    after = submit("--gpu-mem", "600M", "--wrap", "true")
    gq_ok("suspend", str(stuck))
    ended = wait_state(stuck, "FAILED", timeout=60)
    reason = ended["events"][-1]["reason"]
    assert reason.startswith("its device memory could not be brought back: "), reason
    assert "cuCheckpointProcessUnlock failed" in reason
    wait_state(after, "COMPLETED", timeout=60)
    control.stop()


def test_a_job_whose_memory_went_to_the_host_holds_no_resident_slot(home, tmp_path):
    control = _fake_node(home, "--max-resident", "1")
    script, go = _gated(tmp_path, "first", 100)
    first = submit("--gpu-mem", "100M", str(script))
    wait_for(lambda: job(first)["steps_done"] >= 3, 30, what="its steps")
    second = submit("--gpu-mem", "100M", "--wrap", "true")
    gq_ok("suspend", str(first))
    wait_for(lambda: _memory(first)["place"] == "host", 30, what="its memory moved")
    wait_state(second, "COMPLETED", timeout=60)  # in the slot the first left
    gq_ok("resume", str(first))
    go.touch()
    assert wait_state(first, "COMPLETED", timeout=60)["steps_done"] == 100
    control.stop()


@pytest.mark.long
def test_a_checkpoint_is_counted_against_the_nodes_memory_that_no_job_reserved(home, tmp_path):
    """A job without --host-mem puts its moved memory in what no other job reserved: while
    it is there, a job that reserves the rest of the node waits for the node's room, and
    starts once it is back; and where others' reservations leave too little, the
    checkpoint is not made: the job keeps its memory, frozen, and says why."""
    control = _fake_node(home)
    all_but = f"{(psutil.virtual_memory().total - (300 << 20)) >> 20}M"  # 300M left
    script, go = _gated(tmp_path, "moved", 400)
    moved = submit("--gpu-mem", "600M", str(script))
    wait_for(lambda: job(moved)["steps_done"] >= 3, 30, what="its steps")
    gq_ok("suspend", str(moved))
    wait_for(lambda: _memory(moved)["place"] == "host", 30, what="its memory moved")
    big = submit("--host-mem", all_but, "--gpu-mem", "100M", "--wrap", "true")
    reason = wait_for(lambda: job(big)["reason"], 30, what="the big job's reason")
    assert job(big)["state"] == "PENDING" and "host memory" in reason, reason
    gq_ok("resume", str(moved))
    wait_for(lambda: _memory(moved)["place"] == "device", 30, what="its memory back")
    wait_state(big, "COMPLETED", timeout=60)

    reserver_script, reserver_go = _gated(tmp_path, "reserver", 100)
    reserver = submit("--host-mem", all_but, "--gpu-mem", "100M", str(reserver_script))
    wait_state(reserver, "RUNNING")  # (its turns come after the moved one's, under fifo)
    gq_ok("suspend", str(moved))
    memory = wait_for(lambda: (m := _memory(moved))["held_why"] and m, 30, what="a reason")
    assert memory["place"] == "device"
    assert "host memory that other jobs have not reserved" in memory["held_why"]
    assert job(moved)["state"] == "SUSPENDED"
    gq_ok("resume", str(moved))
    go.touch()
    reserver_go.touch()
    assert wait_state(moved, "COMPLETED", timeout=60)["steps_done"] == 400
    assert wait_state(reserver, "COMPLETED", timeout=60)["steps_done"] == 100
    control.stop()


def test_a_high_job_that_does_not_fit_preempts_the_low_one_which_comes_back(home, tmp_path):
    """Under priority the low job's memory goes to the host for the high one (state S,
    Preempted, PREEMPTED in its history); once the high one has ended it comes back and
    completes every step."""
    control = _fake_node(home)
    gq_ok("policy", "set", "priority")
    script, go = _gated(tmp_path, "low", 150)
    low = submit("--priority", "1", "--gpu-mem", "600M", str(script))
    wait_for(lambda: job(low)["steps_done"] >= 3, 30, what="the low job's steps")
    # The high job runs until told to end: the low one comes back as soon as it has ended,
    # and a one-second job had, once, by the time this was read on a loaded machine.
    high_go = tmp_path / "high.go"
    high = submit("--priority", "10", "--gpu-mem", "600M", "--wrap", _until(high_go))
    wait_state(high, "RUNNING", timeout=60)
    shown = job(low)
    assert (shown["state"], shown["preempted"]) == ("SUSPENDED", True)
    assert shown["device_memory"]["place"] == "host"
    assert "Preempted: yes" in gq_ok("show", str(low))
    assert shown["reason"] == f"Preempted: its memory to host memory for job {high} (priority 10)"
    history = [e for e in shown["events"] if e["new_state"] == "PREEMPTED"]
    assert len(history) == 1 and f"for job {high} (priority 10)" in history[0]["reason"]

    high_go.touch()
    wait_state(high, "COMPLETED", timeout=60)
    wait_for(lambda: not job(low)["preempted"], 30, what="the low job brought back")
    assert job(low)["reason"] is None
    go.touch()
    assert wait_state(low, "COMPLETED", timeout=60)["steps_done"] == 150
    control.stop()


def test_upgrade_to_0021_keeps_running_jobs_and_none_is_preempted(tmp_path):
    home = Home(tmp_path / "old").ensure()
    migrate(home, "0020")
    connection = sqlite3.connect(home.db)
    connection.execute(
        "INSERT INTO payloads (id, env, args, spool_bytes) VALUES (1, '{}', '[]', 0)"
    )
    connection.execute(
        "INSERT INTO jobs (id, name, user, priority, gpus, exclusive, requeue, script, "
        "spool_path, workdir, stdout_path, stderr_path, submit_time, steps_done, attained, "
        "holds_lane, held, payload_id, uid, suspended, state, run_count) VALUES (4, 'a', "
        "'ann', 0, 1, 0, 0, '/w/s.sh', '', '/w', '/w/o', '/w/o', 1.0, 7, 0.5, 0, 0, 1, 1000, "
        "1, 'RUNNING', 1)"
    )
    connection.commit()
    connection.close()
    database = Database(home)
    assert engine.current_revision(home.db) == HEAD_REVISION
    with database.read() as session:
        (row,) = scheduling_rows.for_scheduling(session, JobState.RUNNING)
        kept = lookups.job(session, 4)
    assert (row.id, row.suspended, row.preempted, row.steps_done) == (4, True, False, 7)
    assert kept.preempted is False and kept.attained == 0.5
    database.close()


@pytest.mark.long
def test_resumed_jobs_that_do_not_fit_together_come_back_one_by_one(home, tmp_path):
    """Each waits for room beside the jobs told to come back before it, not beside every
    job still in host memory (two of them once waited for each other for ever)."""
    _fake_node(home)
    first, first_go = _gated(tmp_path, "a", 100)
    second, second_go = _gated(tmp_path, "b", 100)
    a = submit("--gpu-mem", "600M", str(first))
    wait_for(lambda: job(a)["steps_done"] >= 3, 30, what="a's steps")
    gq_ok("suspend", str(a))
    wait_for(lambda: _memory(a)["place"] == "host", 30, what="a moved out")
    b = submit("--gpu-mem", "600M", str(second))
    wait_for(lambda: job(b)["steps_done"] >= 3, 30, what="b's steps")
    gq_ok("suspend", str(b))
    wait_for(lambda: _memory(b)["place"] == "host", 30, what="b moved out")
    first_go.touch()
    second_go.touch()
    third, third_go = _gated(tmp_path, "c", 100)
    c = submit("--gpu-mem", "600M", str(third))  # in the room they left
    wait_for(lambda: job(c)["steps_done"] >= 3, 30, what="c's steps")
    gq_ok("resume", str(a))
    gq_ok("resume", str(b))
    steps = job(c)["steps_done"]  # both resumes seen by a pass while c holds the room:
    wait_for(lambda: job(c)["steps_done"] >= steps + 15, 30, what="c's next steps")
    third_go.touch()
    wait_state(c, "COMPLETED", timeout=60)
    assert wait_state(a, "COMPLETED", timeout=60)["steps_done"] == 100
    assert wait_state(b, "COMPLETED", timeout=60)["steps_done"] == 100


def test_a_preempted_job_comes_back_after_a_daemon_restart(home, tmp_path):
    control = _fake_node(home)
    gq_ok("policy", "set", "priority")
    script, go = _gated(tmp_path, "low", 60)
    low = submit("--priority", "1", "--gpu-mem", "600M", str(script))
    wait_for(lambda: job(low)["steps_done"] >= 3, 30, what="the low job's steps")
    high_go = tmp_path / "high.go"  # (it ends once the daemon is back: the low job is out)
    high = submit("--priority", "10", "--gpu-mem", "600M", "--wrap", _until(high_go))
    wait_state(high, "RUNNING", timeout=60)
    assert job(low)["preempted"]
    control.kill9()
    control.start()
    high_go.touch()
    wait_state(high, "COMPLETED", timeout=60)
    wait_for(lambda: not job(low)["preempted"], 30, what="the low job brought back")
    go.touch()
    assert wait_state(low, "COMPLETED", timeout=60)["steps_done"] == 60


def test_a_job_whose_memory_cannot_move_costs_the_others_no_preemption(home, tmp_path):
    """The least memory is tried first; where it cannot move (the fake refuses it), that
    job is let go on and left out, and the next one is moved: one job cannot turn
    preemption off for its device."""
    _fake_node(home)
    gq_ok("policy", "set", "priority")
    kept_script, kept_go = _gated(tmp_path, "kept", 100)
    os.environ["GQ_FAKE_CHECKPOINT_FAILS"] = "1"
    try:
        kept = submit("--priority", "1", "--gpu-mem", "400M", str(kept_script))
    finally:
        del os.environ["GQ_FAKE_CHECKPOINT_FAILS"]
    moved_script, moved_go = _gated(tmp_path, "moved", 100)
    moved = submit("--priority", "1", "--gpu-mem", "500M", str(moved_script))
    wait_for(lambda: job(moved)["steps_done"] >= 3 and job(kept)["steps_done"] >= 3, 30)
    high = submit("--priority", "10", "--gpu-mem", "500M", "--wrap", "true")
    wait_state(high, "COMPLETED", timeout=60)
    events = [e["new_state"] for e in job(moved)["events"]]
    assert "PREEMPTED" in events and not job(kept)["preempted"]
    kept_go.touch()
    moved_go.touch()
    wait_state(kept, "COMPLETED", timeout=60)
    wait_state(moved, "COMPLETED", timeout=60)


def test_a_high_job_waiting_for_the_nodes_cpus_preempts_no_one(home, tmp_path):
    """Moving memory out frees no CPU: a high job that waits for CPUs leaves the low one
    running to its end."""
    _fake_node(home)
    gq_ok("policy", "set", "priority")
    script, go = _gated(tmp_path, "low", 300)
    go.touch()  # at its full pace: 300 steps of 20 ms, several scheduling passes
    low = submit("--priority", "1", "--gpu-mem", "600M", "-c", str(os.cpu_count()), str(script))
    wait_for(lambda: job(low)["steps_done"] >= 3, 30, what="the low job's steps")
    high = submit("--priority", "10", "--gpu-mem", "600M", "-c", "1", "--wrap", "true")
    wait_for(lambda: "node" in (job(high)["reason"] or ""), 30, what="the high job's reason")
    assert wait_state(low, "COMPLETED", timeout=60)["steps_done"] == 300
    assert "PREEMPTED" not in [e["new_state"] for e in job(low)["events"]]
    wait_state(high, "COMPLETED", timeout=60)


def test_a_job_preempted_again_after_it_came_back_frees_the_device_again(home, tmp_path):
    """Its return left it counted as waiting to come back: preempted a second time, its
    memory went out but the device stayed booked for it, and the second high job waited."""
    _fake_node(home)
    gq_ok("policy", "set", "priority")
    script, _ = _gated(tmp_path, "low", 10_000)
    low = submit("--priority", "1", "--gpu-mem", "600M", str(script))
    wait_for(lambda: job(low)["steps_done"] >= 3, 30, what="the low job's steps")
    for _ in range(2):
        high = submit("--priority", "10", "--gpu-mem", "600M", "--wrap", "true")
        wait_state(high, "COMPLETED", timeout=30)
        wait_for(lambda: _memory(low)["place"] == "device", 30, what="the low job back")
    assert [e["new_state"] for e in job(low)["events"]].count("PREEMPTED") == 2
    gq_ok("cancel", str(low))
    wait_state(low, "CANCELLED")
