"""Nodes with several devices (emulated with --cpu-devices): placement by load, EASY
backfill, and rr time slicing, end to end."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime

from conftest import (
    DECLARED,
    KERNEL_LOOP,
    ROOT,
    DaemonControl,
    all_jobs,
    gq,
    gq_ok,
    job,
    start_together,
    submit,
    submit_resident,
    wait_for,
    wait_state,
    write_script,
)


def ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_four_one_device_jobs_land_on_four_devices(home, tmp_path):
    gq_ok("daemon", "start", "--cpu-devices", "4", "--cpu-memory", "8G", "--kill-wait", "1")
    info = json.loads(gq_ok("info", "--json"))
    assert [d["name"] for d in info["devices"]] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert all(d["memory_total"] == 2 << 30 for d in info["devices"])
    script = write_script(tmp_path / "s.sh", "echo $GQ_VISIBLE_DEVICES $GQ_DEVICE; sleep 300\n")
    ids = [submit(str(script)) for _ in range(4)]
    devices = [wait_state(i, "RUNNING")["device"] for i in ids]
    assert sorted(devices) == ["cpu0", "cpu1", "cpu2", "cpu3"]
    for job_id, device in zip(ids, devices):
        out = tmp_path / f"gq-{job_id}.out"
        wait_for(out.exists, 10, what="the job's output")
        wait_for(lambda out=out: out.read_text().strip(), 10, what="the job's line")
        assert out.read_text().split() == [device.removeprefix("cpu"), "cpu"]
    two = submit("-G", "2", str(script))  # no device is empty: waits for two of them
    assert wait_for(lambda: job(two)["reason"], 10, what="a reason") == "Resources"
    gq_ok("cancel", *map(str, ids[1:3]))
    assert wait_state(two, "RUNNING")["device"] == "cpu1,cpu2"
    gq_ok("cancel", "--state", "R")


def test_backfill_runs_a_short_job_in_the_hole_without_delaying_the_blocked_one(home, tmp_path):
    gq_ok("daemon", "start", "--cpu-devices", "2", "--kill-wait", "1")

    def sleep(seconds: int) -> str:
        return str(write_script(tmp_path / f"sleep{seconds}.sh", f"sleep {seconds}\n"))

    # One device until told to end, within 30 s at the latest (a sleep of 4 s had ended,
    # once, before a loaded machine had read the others' reasons).
    go = tmp_path / "go"
    gated = write_script(tmp_path / "gated.sh", f"while [ ! -e {go} ]; do sleep 0.05; done\n")
    first = submit("-t", "0:30", str(gated))
    wait_state(first, "RUNNING")
    blocked = submit("-G", "2", sleep(0.2))  # needs both: reserved from first's limit
    short = submit("-t", "0:03", sleep(0.5))  # ends before that: runs in the hole
    long = submit("-t", "1:00", sleep(0.5))  # would not: waits
    unlimited = submit(sleep(0.5))  # no limit: never backfilled
    assert wait_state(short, "COMPLETED")["device"] != job(first)["device"]
    assert job(long)["reason"] == "Priority" and job(long)["state"] == "PENDING"
    assert job(unlimited)["reason"] == "Priority (no --time: not backfilled)"
    assert job(blocked)["reason"] == "Resources"
    go.touch()
    first_info = wait_state(first, "COMPLETED")
    blocked_info = wait_state(blocked, "COMPLETED", timeout=30)
    # It started as soon as the devices were free (not delayed by the short job) ...
    assert ts(blocked_info["start_time"]) - ts(first_info["end_time"]) < 3
    # ... and before the long job, which had to wait for it.
    long_info = wait_state(long, "COMPLETED", timeout=30)
    assert ts(long_info["start_time"]) >= ts(blocked_info["start_time"])
    wait_state(unlimited, "COMPLETED", timeout=30)


def test_rr_gives_resident_jobs_turns_within_one_quantum(daemon, tmp_path):
    gq_ok("policy", "set", "rr", "--quantum", "50ms")
    assert gq_ok("policy").startswith("rr (quantum 50ms)")
    go = tmp_path / "go"
    ids = submit_resident(go, 2, *KERNEL_LOOP, "--steps", "400", "--iter-ms", "4")
    go.touch()
    samples = []

    def sample():
        rows = {r["id"]: r for r in json.loads(gq_ok("status", "--json"))}
        # Past their warm-up (a first iteration can take many times the others) and
        # before either loop is over (the other then runs alone).
        if not all(20 <= rows.get(i, {}).get("steps_done", 0) < 380 for i in ids):
            return len(rows) < 2 or any(rows[i]["steps_done"] >= 380 for i in ids)
        paces = [rows[i]["mean_iteration"] or 0.0 for i in ids]
        samples.append((*(rows[i]["attained"] for i in ids), max(paces)))
        return False

    wait_for(sample, 60, interval=0.1, what="both jobs to iterate")
    assert samples, "never saw both jobs iterating"
    for a, b, pace in samples:  # one quantum, and an iteration or two of granularity
        assert abs(a - b) <= 0.05 + 2 * pace + 0.01, samples
    for job_id in ids:
        wait_state(job_id, "COMPLETED", timeout=60)


def test_deadlines_met_missed_and_impossible(daemon, tmp_path):
    gq_ok("policy", "set", "deadline")
    go = tmp_path / "go"
    relaxed = submit(
        *DECLARED,
        "--deadline",
        "now+10minutes",
        "--steps",
        "300",
        *KERNEL_LOOP,
        "--steps",
        "300",
        "--iter-ms",
        "4",
        "--start-file",
        str(go),
    )
    urgent = submit(
        *DECLARED,
        "--deadline",
        "now+2minutes",
        "--steps",
        "100",
        *KERNEL_LOOP,
        "--steps",
        "100",
        "--iter-ms",
        "4",
        "--start-file",
        str(go),
    )
    start_together(go, 2)
    urgent_info = wait_state(urgent, "COMPLETED", timeout=60)
    relaxed_info = wait_state(relaxed, "COMPLETED", timeout=60)
    assert ts(urgent_info["end_time"]) < ts(relaxed_info["end_time"])  # earliest deadline first
    assert urgent_info["missed_by"] is None and relaxed_info["missed_by"] is None
    # Running past its deadline: ended at it, state DEADLINE (Slurm's DL).
    late = submit("--deadline", "now+2", str(write_script(tmp_path / "s.sh", "sleep 60\n")))
    info = wait_state(late, "DEADLINE", timeout=30)
    assert info["reason"] == "deadline reached"
    assert ts(info["end_time"]) - ts(info["deadline"]) < 2.0
    # Pending, with a time limit that ends after its deadline: removed at once.
    hopeless = submit("--deadline", "now+30", "-t", "5:00", str(tmp_path / "s.sh"))
    info = wait_state(hopeless, "DEADLINE")
    assert info["run_count"] == 0 and "cannot end before its deadline" in info["reason"]
    history = gq_ok("history")
    assert "MISSED BY" in history and f"{late} " in history
    shown = gq_ok("show", str(urgent))
    assert "Deadline: " in shown


def test_deadline_spellings_and_refusals(daemon, tmp_path):
    script = str(write_script(tmp_path / "s.sh", "true\n"))
    for bad, message in (("soon", "invalid --deadline 'soon'"), ("2001-01-01", "has passed")):
        result = gq("submit", "--deadline", bad, script)
        assert result.code == 2 and message in result.err, result.err
    job_id = submit("--hold", "--deadline", "now+1hour", script)
    assert abs(ts(job(job_id)["deadline"]) - ts(job(job_id)["submit_time"]) - 3600) < 5
    directive = write_script(tmp_path / "d.sh", "#!/bin/sh\n#SBATCH --deadline=now+2hours\ntrue\n")
    other = submit("--hold", str(directive))
    assert abs(ts(job(other)["deadline"]) - ts(job(other)["submit_time"]) - 7200) < 5


def test_a_job_bound_behind_a_long_one_moves_to_the_device_that_frees_first(home, tmp_path):
    """fifo on two devices: a job bound before anyone's pace was known, behind the long job,
    moves (its worker restarted, the run not counted) once the other device's short job is
    seen to end first; the jobs that run iterations stay where they are."""
    DaemonControl(home).start("--cpu-devices", "2", "--move-margin", "1")
    loop = write_script(
        tmp_path / "loop.py",
        (
            "import os, sys, time\nimport gq\n"
            "while len(sys.argv) > 2 and not os.path.exists(sys.argv[2]):\n"
            "    time.sleep(0.01)\n"
            "for _ in gq.steps(range(int(sys.argv[1])), total=int(sys.argv[1])):\n"
            "    time.sleep(0.05)\n"
        ),
    )
    # Each declares its memory: a job that declares none has its lane to itself until it
    # has been measured, and nothing would bind behind it.
    # (The long one's 6 s leave it more than the margin to go once the short one has ended,
    # on a loaded machine too: with 3 s, it once had less by the time that was seen.)
    long = submit("--gpu-mem", "200M", str(loop), "120")
    short = submit("--gpu-mem", "1G", str(loop), "20")  # less room left there: early goes
    # early asks for the lane once long holds it, not before: on a loaded machine long's
    # start-up once took so long that early ran all its steps first, and had no need to move.
    go = tmp_path / "go"
    early = submit("--gpu-mem", "200M", str(loop), "10", str(go))  # behind long, by the keys
    first = job(early)["device"] or wait_state(early, "RUNNING")["device"]
    assert first == job(long)["device"]  # no pace known yet: bound by the usual keys
    wait_for(lambda: job(long)["steps_done"] > 0, 60, what=f"job {long} to hold its lane")
    go.touch()
    info = wait_state(early, "COMPLETED", timeout=60)
    assert info["device"] == job(short)["device"] != job(long)["device"]
    assert "moved: another device starts it sooner" in [e["reason"] for e in info["events"]]
    assert info["run_count"] == 1  # the run that ran no iteration is not counted
    ended = wait_state(long, "COMPLETED", timeout=60)
    assert info["end_time"] < ended["end_time"]
    assert all("moved" not in (e["reason"] or "") for j in (long, short) for e in job(j)["events"])


def test_a_job_pinned_to_its_device_is_never_moved_off_it(home, tmp_path):
    """The same node, but the job behind the long one named its device (-w): the device
    that frees first is not one it may use, so it waits there, moved by no pass (it was
    moved, placed back and moved again every second, never starting, as a GPU job was
    moved toward the cpu device of a GPU node)."""
    DaemonControl(home).start("--cpu-devices", "2", "--move-margin", "1")
    loop = write_script(
        tmp_path / "loop.py",
        (
            "import sys, time\nimport gq\n"
            "for _ in gq.steps(range(int(sys.argv[1])), total=int(sys.argv[1])):\n"
            "    time.sleep(0.05)\n"
        ),
    )
    long = submit("--gpu-mem", "200M", "-w", "cpu0", str(loop), "60")
    short = submit("--gpu-mem", "200M", "-w", "cpu1", str(loop), "10")
    pinned = submit("--gpu-mem", "200M", "-w", "cpu0", str(loop), "5")
    assert wait_state(pinned, "RUNNING")["device"] == "cpu0"
    wait_state(short, "COMPLETED", timeout=60)  # cpu1 is free long before cpu0
    info = wait_state(pinned, "COMPLETED", timeout=60)
    assert info["device"] == "cpu0" and info["run_count"] == 1
    # resident, bound there all along (beside the long job, or taking turns with it)
    long_end = job(long)["end_time"]
    assert long_end is None or info["start_time"] < long_end
    assert all("moved" not in (e["reason"] or "") for e in info["events"])


def test_a_shell_job_that_asks_for_a_device_has_it_alone(home, tmp_path):
    """A shell script's processes (``python train.py`` among them) use the device outside
    any lane: gq finds no iteration in them, so beside a lane's holder their kernels would
    run at once with its. A shell job that asks for a device (here an emulated GPU) has it
    to itself, as --exclusive; a Python job shares as before."""
    gq_ok("daemon", "start", "--cpu-devices", "2", "--kill-wait", "1")
    shell = write_script(tmp_path / "s.sh", "sleep 300\n")
    python = write_script(tmp_path / "p.py", "import time\ntime.sleep(300)\n")
    first = submit(str(shell))
    alone = wait_state(first, "RUNNING")["device"]
    beside = submit("--gpu-mem", "100M", str(python))
    shared = wait_state(beside, "RUNNING")["device"]
    assert shared != alone
    second = submit(str(shell))  # no device is empty: it waits
    assert wait_for(lambda: job(second)["reason"], 10, what="a reason") == "Resources"
    assert job(second)["state"] == "PENDING"
    another = submit("--gpu-mem", "100M", str(python))  # a Python job joins the Python job's device
    assert wait_state(another, "RUNNING")["device"] == shared
    gq_ok("cancel", str(beside), str(another))
    assert wait_state(second, "RUNNING")["device"] == shared
    gq_ok("cancel", "--state", "R")


def test_a_shell_on_a_terminal_that_asks_for_a_shared_gpu_is_refused(home, tmp_path):
    """A batch shell job takes its device alone; a shell on a terminal would hold a whole
    device for as long as a person keeps it open. It is refused, saying what to give, and
    queues nothing; -G 0, --exclusive or a Python REPL are queued."""
    import pexpect

    gq_ok("daemon", "start", "--cpu-devices", "2", "--kill-wait", "1")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = pexpect.spawn(
        sys.executable,
        ["-m", "gq", "run", "--pty", "--", "bash", "--norc"],
        env=env,
        encoding="utf-8",
        timeout=15,
    )
    child.expect(pexpect.EOF)
    child.close()
    said = child.before.strip().splitlines()
    assert child.exitstatus == 2 and len(said) == 1, said
    assert said[0] == (
        "gq: error: a shell on a terminal would use its device outside gq's "
        "lanes: give -G 0 for none, --exclusive for a device of its own, or run "
        "python or ipython, whose statements hold a shared device only while "
        "they run"
    )
    assert all_jobs() == []
    for args in (["-G", "0"], ["--exclusive"]):
        child = pexpect.spawn(
            sys.executable,
            ["-m", "gq", "run", "--pty", *args, "--", "sh", "-c", "echo on $GQ_JOB_ID"],
            env=env,
            encoding="utf-8",
            timeout=15,
        )
        child.expect(r"on (\d+)")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0, args
    gq_ok("daemon", "stop")
