"""Co-located jobs never take each other down: caps from declarations, probes of jobs that
declare nothing, and runs that run out of memory going back to the queue with their figure
raised (or failing, where they must), their neighbours untouched. End to end on emulated
devices with a memory budget; the verdict and the worker's recognition as units."""

from __future__ import annotations

import json
import subprocess
from datetime import datetime

import pytest

from gq import defaults
from gq.daemon.supervision import memory_figures
from gq.exec.job import worker_memory
from gq.messages import OnOutOfMemory

from conftest import (
    PYTHON,
    ROOT,
    DaemonControl,
    all_jobs,
    cgroups_usable,
    gq,
    gq_ok,
    job,
    submit,
    wait_for,
    wait_state,
    write_script,
)

M = 1 << 20
G = 1 << 30

# A seeded training loop whose losses are its result: alone or beside a neighbour that runs
# out of memory, it must print the same ones. With --grow-mb it overshoots on its first run
# only (SLURM_RESTART_COUNT=0): "--how raise" raises the error CUDA's allocator raises (what
# it held and asked for in its message), "--how allocate" allocates past its cap for real.
# --no-torch (a plain-Python model, its steps marked with gq.steps) wherever torch is not the
# subject: the neighbours, and jobs killed for what they allocate.
LOOP = ROOT / "bench" / "jobs" / "memory_loop.py"


def _bare_losses(*args: str) -> list[float]:
    """The neighbour's result run bare, outside gq."""
    done = subprocess.run(
        [PYTHON, str(LOOP), *args], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _losses(tmp_path, job_id: int) -> list[float]:
    return json.loads((tmp_path / f"gq-{job_id}.out").read_text().strip().splitlines()[-1])


# ----- the verdict (pure) ---------------------------------------------------------------
def test_a_run_that_ran_out_is_requeued_with_its_figure_raised_to_what_it_asked_for():
    verdict = memory_figures.after_shortage(
        held=5 * G,
        wanted=7 * G + 100 * M,
        figure=4 * G,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=0,
        retries=None,
        free=5 * G,
        largest=16 * G,
    )
    assert verdict.requeue and verdict.figure == 7 * G + 100 * M
    assert verdict.reason == "OutOfMemory (needs 7.1G, 5.0G free)"


def test_a_run_that_did_not_say_what_it_asked_for_grows_its_figure():
    verdict = memory_figures.after_shortage(
        held=400 * M,
        wanted=None,
        figure=400 * M,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=0,
        retries=None,
        free=0,
        largest=G,
    )
    assert verdict.requeue and verdict.figure == int(400 * M * defaults.OOM_GROWTH)
    assert verdict.reason == "OutOfMemory (needs 600.0M, 0B free)"


@pytest.mark.parametrize(
    "on_oom, ooms, retries, largest, why",
    [
        (OnOutOfMemory.FAIL, 0, None, 16 * G, "--oom fail"),
        (OnOutOfMemory.REQUEUE, 0, None, 6 * G, "no device of this node offers 7.0G"),
        (OnOutOfMemory.REQUEUE, defaults.OOM_REQUEUES, None, 16 * G, "ran out of memory 4 times"),
        (OnOutOfMemory.REQUEUE, 1, 1, 16 * G, "ran out of memory 2 times"),
    ],
)
def test_a_run_that_ran_out_fails_where_it_must(on_oom, ooms, retries, largest, why):
    verdict = memory_figures.after_shortage(
        held=G,
        wanted=7 * G,
        figure=None,
        on_oom=on_oom,
        ooms=ooms,
        retries=retries,
        free=2 * G,
        largest=largest,
    )
    assert not verdict.requeue and verdict.figure == 7 * G
    assert (
        verdict.reason.startswith("OutOfMemory (needs 7.0G, 2.0G free); ") and why in verdict.reason
    )


def test_more_retries_allow_more_runs_out_of_memory():
    verdict = memory_figures.after_shortage(
        held=G,
        wanted=2 * G,
        figure=G,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=5,
        retries=10,
        free=G,
        largest=8 * G,
    )
    assert verdict.requeue


def test_a_run_out_of_memory_within_its_own_figure_still_grows_it():
    """Its allocator's cache or a neighbour over its own figure: raised all the same, and
    counted, so that runs out of memory end."""
    verdict = memory_figures.after_shortage(
        held=300 * M,
        wanted=500 * M,
        figure=G,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=0,
        retries=None,
        free=0,
        largest=8 * G,
    )
    assert verdict.requeue and verdict.figure == int(G * defaults.OOM_GROWTH)
    nothing = memory_figures.after_shortage(
        held=0,
        wanted=0,
        figure=None,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=0,
        retries=None,
        free=0,
        largest=8 * G,
    )
    assert nothing.figure >= 1  # a figure of 0 would be no cap at all


def test_no_retries_means_no_run_out_of_memory_is_retried():
    verdict = memory_figures.after_shortage(
        held=G,
        wanted=2 * G,
        figure=G,
        on_oom=OnOutOfMemory.REQUEUE,
        ooms=0,
        retries=0,
        free=G,
        largest=8 * G,
    )
    assert not verdict.requeue and "ran out of memory 1 times" in verdict.reason


def test_a_probed_figure_is_the_peak_and_its_margin():
    assert memory_figures.probed_figure(1000 * M) == int(1000 * M * (1 + defaults.MEMORY_MARGIN))


# ----- the worker's recognition ---------------------------------------------------------
def test_the_worker_knows_an_out_of_memory_error_and_what_it_asked_for():
    import torch

    cuda = worker_memory.shortage(
        torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 8 GiB"
        )
    )
    assert cuda is not None and cuda.wanted == cuda.held + 2 * G and cuda.held > 0
    cpu = worker_memory.shortage(
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1048576 bytes. Error code 12 (Cannot allocate memory)"
        )
    )
    assert cpu is not None and cpu.wanted == cpu.held + M
    plain = worker_memory.shortage(MemoryError())
    assert plain is not None and plain.wanted is None
    try:
        try:
            raise MemoryError
        except MemoryError as exc:
            raise ValueError("a loader gave up") from exc
    except ValueError as wrapped:
        assert worker_memory.shortage(wrapped) is not None  # its cause ran out
    assert worker_memory.shortage(ValueError("no")) is None
    assert worker_memory.shortage(RuntimeError("Tried to allocate nothing")) is None


def test_a_cpu_jobs_peak_counts_what_it_freed_before_its_release():
    """On the cpu device the worker's peak is the process's high-water mark: a transient
    allocation freed inside the iteration still counts (its resident memory at the release
    would not show it)."""
    before = worker_memory.sample()
    transient = bytearray(200 * M)
    transient[::4096] = b"x" * len(transient[::4096])
    del transient
    after = worker_memory.sample()
    assert after.persistent < before.persistent + 100 * M
    assert after.peak >= before.persistent + 190 * M


# ----- end to end -----------------------------------------------------------------------
@pytest.mark.long
def test_a_job_out_of_memory_waits_for_room_and_its_neighbour_finishes_as_alone(home, tmp_path):
    """One emulated device of 1G: a neighbour of 600M and a job of 400M that asks for 600M
    more on its third step. It goes back to the queue (not FAILED) with its figure raised
    to what it asked for, says how much it waits for, starts once the neighbour has ended,
    and completes; the neighbour's losses are those of its run alone."""
    alone = _bare_losses("--steps", "30", "--no-torch")
    DaemonControl(home).start("--cpu-devices", "1", "--cpu-memory", "1G")
    gq_ok("policy", "set", "fair")  # the two take turns (fifo would run the grower after)
    leave = tmp_path / "leave"
    neighbour = submit(
        "--gpu-mem", "600M", str(LOOP), "--steps", "30", "--leave", str(leave), "--no-torch"
    )
    wait_state(neighbour, "RUNNING")
    short = submit(
        "--gpu-mem", "400M", str(LOOP), "--steps", "20", "--grow-mb", "600", "--how", "raise"
    )
    waiting = wait_for(
        lambda: (
            (info := job(short))["reason"]
            and info["reason"].startswith("OutOfMemory")
            and info["state"] == "PENDING"
            and info
        ),
        60,
        what="the job to wait for room",
    )
    assert job(neighbour)["state"] == "RUNNING"
    assert waiting["reason"].startswith("OutOfMemory (needs ") and "free)" in waiting["reason"]
    leave.touch()
    assert waiting["mem"] > 600 * M and waiting["mem_basis"] == "raised"
    assert waiting["ooms"] == 1 and waiting["run_count"] == 1
    finished = wait_state(short, "COMPLETED", timeout=90)
    ended = wait_state(neighbour, "COMPLETED")
    assert _at(finished["start_time"]) >= _at(ended["end_time"])  # room: the neighbour left
    assert finished["run_count"] == 2 and finished["mem"] == waiting["mem"]
    assert _losses(tmp_path, neighbour) == alone
    shown = gq_ok("show", str(short))
    assert "raised to what it asked for when it ran out of memory" in shown
    assert "(1 run(s) ran out so far)" in shown


@pytest.mark.long
def test_a_job_killed_at_its_cgroup_cap_is_requeued_and_its_neighbour_lives(home, tmp_path):
    """The cap on an emulated device is its cgroup's memory limit: a job that allocates past
    its --gpu-mem is killed by the kernel in its own cgroup, not a neighbour's; with --oom
    fail it fails at once, saying what it held."""
    if not cgroups_usable("auto", memory=True):
        pytest.skip("no cgroup hierarchy to hold the cap here")
    alone = _bare_losses("--steps", "40", "--pause", "0.05", "--no-torch")
    DaemonControl(home).start("--cpu-devices", "1", "--cpu-memory", "4G")
    neighbour = submit(
        "--gpu-mem", "1G", str(LOOP), "--steps", "40", "--pause", "0.05", "--no-torch"
    )
    wait_state(neighbour, "RUNNING")
    over = submit("--gpu-mem", "600M", "--oom", "fail", str(LOOP), "--grow-mb", "900", "--no-torch")
    failed = wait_state(over, "FAILED", timeout=60)
    assert failed["reason"].startswith("OutOfMemory (needs 900.0M, ")
    assert failed["reason"].endswith("; --oom fail") and failed["ooms"] == 1
    assert failed["exit_code"] == 128 + 9  # the kernel's SIGKILL
    assert job(neighbour)["state"] in ("RUNNING", "COMPLETED")
    wait_state(neighbour, "COMPLETED", timeout=60)
    assert _losses(tmp_path, neighbour) == alone


def test_without_a_cgroup_the_host_ends_a_job_over_its_cap_at_a_boundary(home, tmp_path):
    """Where no cgroup holds a job (--cgroup off), its memory is measured at each boundary
    and a job over its cap is ended there: requeued with its figure raised to what it
    held, and run again until it completes."""
    DaemonControl(home).start("--cpu-devices", "1", "--cpu-memory", "8G", "--cgroup", "off")
    over = submit("--gpu-mem", "600M", str(LOOP), "--grow-mb", "700", "--no-torch")
    requeued = wait_for(
        lambda: (info := job(over))["ooms"] == 1 and info,
        60,
        what="the job to be ended for its memory",
    )
    assert requeued["mem"] > 700 * M  # what it held: its allocation and the interpreter
    assert requeued["mem_basis"] == "raised"
    finished = wait_state(over, "COMPLETED", timeout=60)
    assert finished["run_count"] == 2
    event = next(
        e for e in finished["events"] if e["old_state"] == "RUNNING" and e["new_state"] == "PENDING"
    )
    assert event["reason"].startswith("OutOfMemory (needs ")


def test_a_kill_at_its_host_memory_limit_is_no_device_shortage(home, tmp_path):
    """Where --host-mem is the smaller limit, a kill there fails the job as it always has:
    its device figure is not raised (it would grow with every run and take lane room)."""
    if not cgroups_usable("auto", memory=True):
        pytest.skip("no cgroup hierarchy to hold the limit here")
    DaemonControl(home).start("--cpu-devices", "1", "--cpu-memory", "4G")
    over = submit(
        "--gpu-mem", "1G", "--host-mem", "450M", str(LOOP), "--grow-mb", "600", "--no-torch"
    )
    failed = wait_state(over, "FAILED", timeout=60)
    assert failed["reason"] == "killed by signal SIGKILL" and failed["ooms"] == 0
    assert (failed["mem"], failed["mem_basis"], failed["run_count"]) == (G, "declared", 1)


@pytest.mark.parametrize("kind", ["v2", "off"])
def test_host_mem_holds_where_no_cgroup_can_hold_it(home, tmp_path, kind):
    """Where a job's cgroup has no memory controller (v2's not passed on to gq's cgroups: a
    service cgroup that holds other processes, as the GPU node this was found on) or it has
    no cgroup at all, its host sums its processes' resident memory every second: a job over
    its --host-mem fails saying so (it ran on to completion before, its limit only logged),
    one within it completes, and gq show has the memory its processes hold."""
    if kind == "v2" and not cgroups_usable("v2"):
        pytest.skip("no cgroup v2 hierarchy this process may use")
    DaemonControl(home).start("--cgroup", kind)
    info = gq_ok("info")
    if kind == "v2" and "without its memory controller" not in info:
        pytest.skip("v2's memory controller holds the limit here: the kernel enforces it")
    assert "(--host-mem checked every 1 s)" in info
    grow = write_script(
        tmp_path / "grow.py",
        (
            "import os, sys, time\n"
            "held = bytearray(int(sys.argv[1]) << 20)\n"
            "held[::4096] = b'x' * len(held[::4096])\n"
            "open(f\"grown-{os.environ['GQ_JOB_ID']}\", 'w').close()\n"
            "while not os.path.exists('leave'):\n    time.sleep(0.05)\n"
        ),
    )
    over = submit("--gpu-mem", "1G", "--host-mem", "200M", str(grow), "400")
    within = submit("--gpu-mem", "1G", "--host-mem", "2G", str(grow), "300")
    failed = wait_state(over, "FAILED", timeout=30)
    assert failed["reason"].startswith("over its --host-mem of 200.0M (its processes held ")
    assert (failed["ooms"], failed["mem"], failed["run_count"]) == (0, G, 1)
    wait_for(lambda: (tmp_path / f"grown-{within}").exists(), 30, what="the other's growth")
    if kind == "v2":
        held = wait_for(
            lambda: (job(within)["host_memory"] or 0) > 300 * M and job(within)["host_memory"],
            10,
            what="its processes' memory",
        )
        assert held < 2 * G
    (tmp_path / "leave").touch()
    assert wait_state(within, "COMPLETED", timeout=30)["exit_code"] == 0


def test_a_job_that_asks_more_than_any_device_offers_fails_at_once(daemon, tmp_path):
    script = write_script(tmp_path / "huge.py", "import torch\ntorch.empty(1 << 48)\n")
    failed = wait_state(submit(str(script)), "FAILED", timeout=60)
    assert failed["reason"].startswith("OutOfMemory (needs ")
    assert "no device of this node offers" in failed["reason"] and failed["run_count"] == 1
    assert "can't allocate memory" in (tmp_path / f"gq-{failed['id']}.out").read_text()


def test_a_job_that_declares_nothing_is_probed_before_another_joins_it(home, tmp_path):
    """Its first iterations run with the lane to itself; their peak and a margin become its
    figure (gq show says so), and only then does a second job start beside it. On the cpu
    and emulated devices the figure is no cap (a probe sees the worker's resident memory at
    its boundaries, not all its cgroup counts): growing past it later is flagged, MEM! in gq
    status and gq show and the daemon's log, and the job goes on."""
    slow = write_script(
        tmp_path / "slow.py",
        (
            "import os, sys, time, gq\n"
            "kept = []\n"
            "for step in gq.steps(range(int(sys.argv[1]))):\n"
            "    time.sleep(0.3)\n"
            "    if step == 6 and len(sys.argv) > 2:\n"
            "        kept.append(bytearray(300 << 20))\n"
            "        kept[-1][::4096] = b'x' * len(kept[-1][::4096])\n"
            "while len(sys.argv) > 2 and not os.path.exists('leave'):\n"
            "    time.sleep(0.05)\n"
        ),
    )
    control = DaemonControl(home)
    control.start("--cpu-devices", "1", "--cpu-memory", "8G")
    probed = submit(str(slow), "10", "grow")
    started = wait_state(probed, "RUNNING")
    second = submit("--gpu-mem", "1G", str(slow), "2")
    waiting = job(second)
    assert waiting["state"] == "PENDING" and job(probed)["steps_done"] < defaults.PROBE_ITERATIONS
    joined = wait_state(second, "RUNNING", "COMPLETED", timeout=60)
    assert (
        _at(joined["start_time"]) - _at(started["start_time"])
        >= defaults.PROBE_ITERATIONS * 0.3 * 0.9
    )
    figure = wait_for(
        lambda: (
            (info := job(probed))["mem_basis"] == "measured" and info["mem_persistent"] and info
        ),
        30,
        what="the probe's figure",
    )
    assert figure["mem"] >= figure["mem_persistent"] > 0
    assert "(measured: the peak of its first iterations and 10%)" in gq_ok("show", str(probed))
    over = wait_for(
        lambda: (info := job(probed))["mem_over"] and info,
        30,
        what="the job measured over its figure",
    )
    assert over["mem_peak"] > over["mem"]
    status = gq_ok("status")
    assert any(line.split()[0] == str(probed) and "MEM!" in line for line in status.splitlines())
    assert "MEM! its worker claims" in gq_ok("show", str(probed))
    wait_for(lambda: "(MEM!)" in control.log(), 10, what="the daemon's log line")
    (tmp_path / "leave").touch()
    wait_state(probed, "COMPLETED", timeout=60)


def test_a_probe_that_measures_nothing_leaves_no_figure_and_opens_the_lane(home, tmp_path):
    """A Python job that runs no iteration is waited for --probe-wait at most: then it has
    no figure (none of 0, which would be no cap), and the next job joins it."""
    DaemonControl(home).start("--cpu-devices", "1", "--cpu-memory", "8G", "--probe-wait", "4s")
    idle = write_script(
        tmp_path / "idle.py",
        "import os, time\nwhile not os.path.exists('leave'):\n    time.sleep(0.05)\n",
    )
    quiet = submit(str(idle))
    started = wait_state(quiet, "RUNNING")
    other = submit("--gpu-mem", "100M", str(write_script(tmp_path / "s.py", "pass\n")))
    ended = wait_state(other, "COMPLETED", timeout=30)
    assert 2.5 <= _at(ended["start_time"]) - _at(started["start_time"]) < 30
    assert (job(quiet)["mem"], job(quiet)["mem_basis"]) == (None, None)
    (tmp_path / "leave").touch()
    wait_state(quiet, "COMPLETED")


def test_a_job_that_asks_for_no_device_starts_whatever_a_probe_is_doing(home, tmp_path):
    """A probed job has its lane to itself until its figures are known; a shell job that
    asks for no device (-G 0) needs no room there: it starts and ends meanwhile, and its
    gq show speaks of no device memory."""
    DaemonControl(home).start("--probe-wait", "1min")
    idle = write_script(
        tmp_path / "idle.py",
        "import os, time\nwhile not os.path.exists('leave'):\n    time.sleep(0.05)\n",
    )
    probed = submit(str(idle))
    wait_state(probed, "RUNNING")
    hello = submit("-G", "0", str(write_script(tmp_path / "hello.sh", "echo hi\n")))
    assert wait_state(hello, "COMPLETED", timeout=30)["state"] == "COMPLETED"
    assert job(probed)["state"] == "RUNNING" and job(probed)["mem"] is None  # still probed
    assert "GpuMem: - (asks for no device)" in gq_ok("show", str(hello))
    (tmp_path / "leave").touch()
    wait_state(probed, "COMPLETED")


def test_a_bad_oom_choice_is_refused_and_queues_nothing(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "true\n")
    result = gq("submit", "--oom", "explode", str(script))
    assert result.code != 0 and result.err.strip().count("\n") == 0
    assert "--oom 'explode': use requeue or fail" in result.err
    assert all_jobs() == []
    job_id = submit("--oom", "FAIL", "--hold", str(script))
    assert job(job_id)["on_oom"] == "fail"
    assert "OutOfMemory: fail" in gq_ok("show", str(job_id))
    directive = write_script(tmp_path / "d.sh", "#!/bin/sh\n#GQ --oom fail\ntrue\n")
    assert job(submit("--hold", str(directive)))["on_oom"] == "fail"


def test_a_worker_that_lies_about_its_memory_loses_only_its_own_job(daemon, tmp_path):
    """An out-of-memory report out of bounds is a protocol error: its job fails saying so."""
    liar = write_script(
        tmp_path / "liar.py",
        (
            "import os, socket\n"
            "s = socket.socket(fileno=4)  # its worker's socket to the host\n"
            's.sendall(b\'{"kind": "oom", "held": -5, "wanted": 1e400}\\n\')\n'
            "import time; time.sleep(30)\n"
        ),
    )
    failed = wait_state(submit(str(liar)), "FAILED", timeout=30)
    assert failed["reason"].startswith("protocol error") and "oom" in failed["reason"]
    absurd = write_script(
        tmp_path / "absurd.py",
        (
            "import socket, sys\n"
            "s = socket.socket(fileno=4)\n"
            's.sendall(b\'{"kind": "oom", "held": 1, "wanted": 9223372036854775807}\\n\')\n'
            "sys.exit(1)\n"
        ),
    )
    liar = wait_state(submit("--gpu-mem", "100M", str(absurd)), "FAILED", timeout=30)
    assert "no device of this node offers" in liar["reason"]
    assert liar["mem"] == 100 * M  # not the figure it claimed: a gq requeue brings back 100M
    ok = write_script(tmp_path / "ok.sh", "true\n")
    wait_state(submit(str(ok)), "COMPLETED")
