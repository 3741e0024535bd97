"""Loop shapes end to end: what gq reports while a job runs, and how jobs of a shape with
no optimizer share a lane (the boundary rule itself: tests/test_boundaries.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, gq_ok, job, start_together, submit, wait_for, wait_state, write_script

HAND_WRITTEN_SGD = str(ROOT / "tests" / "zoo" / "hand_written_sgd.py")


def test_a_long_iteration_shows_its_lane_held_and_its_service_growing(daemon, tmp_path):
    """Before, the daemon heard of a grant only at the iteration's end: a job inside a long
    iteration showed `waits` and 0 s of service until it left it."""
    script = write_script(
        tmp_path / "long.py", "import gq, time\nfor _ in gq.steps(range(2)):\n    time.sleep(12)\n"
    )
    job_id = submit(str(script))
    # Timed from the grant the daemon heard of, not from the launch: a loaded machine's
    # start-up is no part of what is measured.
    wait_for(lambda: job(job_id)["holds_lane"], 30, what="the lane granted")
    started = time.monotonic()
    seen = wait_for(
        lambda: (lambda info: info if info["holds_lane"] and info["attained"] >= 1.0 else None)(
            job(job_id)
        ),
        6,
        interval=0.1,
        what="the lane held and service counted inside the first iteration",
    )
    assert time.monotonic() - started < 7 and seen["steps_done"] == 0
    assert "holds" in gq_ok("status")
    later = wait_for(
        lambda: (lambda info: info if info["attained"] >= seen["attained"] + 1.0 else None)(
            job(job_id)
        ),
        5,
        interval=0.1,
        what="service to grow",
    )
    assert later["steps_done"] == 0 and later["holds_lane"]
    gq_ok("cancel", str(job_id))


def test_two_jobs_that_update_weights_by_hand_take_turns_under_rr(daemon, tmp_path):
    """Without an optimizer, the whole training phase was one iteration: the first job held
    the lane to its end and the second made no progress meanwhile. Each counts its 40
    training steps (a backward, then the model's next call), not its 10 evaluation
    batches after them."""
    gq_ok("policy", "set", "rr", "--quantum", "1it")
    # Declared memory: no probe, so both start in one pass; their loops start together, once
    # both have imported torch (under load one import can take seconds longer than the
    # other, and the first job would run most of its steps alone).
    go = tmp_path / "go"
    first, second = (submit("--gpu-mem", "1G", HAND_WRITTEN_SGD, "0.1", str(go)) for _ in range(2))
    start_together(go, 2)

    def both_progress():
        infos = [job(first), job(second)]
        if any(info["state"] not in ("PENDING", "RUNNING") for info in infos):
            return "ended"
        return all(info["steps_done"] >= 5 for info in infos)

    assert wait_for(both_progress, 60, interval=0.1, what="both jobs to make progress") is True
    for job_id in (first, second):
        info = wait_state(job_id, "COMPLETED", timeout=60)
        assert info["steps_done"] == 40 and info["exit_code"] == 0
        assert "hand-written sgd done" in (tmp_path / f"gq-{job_id}.out").read_text()


def _run_launchers(tmp_path) -> dict[str, str]:
    """Four shell launchers that find their files through $0, each edited after submit;
    what each printed."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.txt").write_text("lr=3e-4\n")
    body = (
        'HERE=$(cd "$(dirname "$0")" && pwd)\n'
        'echo "$0 $HERE $(cat "$HERE/config.txt") args=$*"\n'
        'echo "source=${BASH_SOURCE:-none}"\n'
    )
    firsts = {
        "plain.sh": "",
        "bash.sh": "#!/bin/bash\n",
        "env.sh": "#!/usr/bin/env bash\n",
        "sh.sh": "#!/bin/sh -e\n",
    }
    ids = {}
    for name, first in firsts.items():
        script = write_script(project / name, first + body)
        ids[name] = submit("-o", str(tmp_path / "%x.out"), str(script), "a b", "c")
        script.write_text("echo edited\n")
    printed = {}
    for name, job_id in ids.items():
        assert wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED", name
        first, source = (tmp_path / f"{name}.out").read_text().splitlines()
        assert first == f"{project / name} {project} lr=3e-4 args=a b c", name
        assert (project / name).read_text() == "echo edited\n"
        printed[name] = source
    assert str(project) not in open("/proc/self/mountinfo").read()
    return printed


def test_a_shell_launcher_finds_its_files_through_dollar_zero(daemon, tmp_path):
    """HERE=$(cd "$(dirname "$0")" && pwd): $0 named the spool copy, so launchers that
    find their files beside them failed; it names the submitted script now, whatever its
    first line, while the snapshot is what runs (an edit after submit changes nothing).
    BASH_SOURCE names it too where the host may show the snapshot there (a root host whose
    root mount is shared, see the next test), else /dev/fd/3."""
    from gq.exec.host.spawn import root_mount_shared

    project = tmp_path / "project"
    bound = os.geteuid() == 0 and root_mount_shared()
    expected = {
        name: f"source={project / name}" if bound else "source=/dev/fd/3"
        for name in ("plain.sh", "bash.sh", "env.sh")
    }
    assert _run_launchers(tmp_path) == {**expected, "sh.sh": "source=none"}  # dash has none


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
def test_a_root_host_with_a_shared_root_shows_the_snapshot_under_the_scripts_name(home, tmp_path):
    """As under systemd: the daemon and its hosts in a mount namespace whose root is shared.
    Each job's namespace is a slave of it, and the snapshot is bound over the script there:
    BASH_SOURCE names the script, and nothing outside the job sees the bind."""
    subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "shared",
            sys.executable,
            "-m",
            "gq",
            "daemon",
            "start",
            "--kill-wait",
            "1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    project = tmp_path / "project"
    assert _run_launchers(tmp_path) == {
        "plain.sh": f"source={project / 'plain.sh'}",
        "bash.sh": f"source={project / 'bash.sh'}",
        "env.sh": f"source={project / 'env.sh'}",
        "sh.sh": "source=none",
    }


def test_shells_named_by_a_first_line():
    from gq.daemon.supervision.launch_specs import shell_of

    assert shell_of("/bin/bash") == ["/bin/bash"]
    assert shell_of("/bin/bash -e") == ["/bin/bash", "-e"]
    assert shell_of(" /usr/bin/env bash ") == ["bash"]
    assert shell_of("/bin/sh -eu") == ["/bin/sh", "-eu"]
    assert shell_of("/usr/bin/env -S bash -e") is None  # the kernel runs it as it is
    assert shell_of("/usr/bin/perl -w") is None
    assert shell_of("/usr/bin/env python3") is None


def test_a_job_completed_by_a_resumed_run_shows_as_done(daemon, tmp_path):
    """A requeued job that resumes from its checkpoint counts only its last run's steps:
    it showed `Steps: 20/30` and a two-thirds bar once COMPLETED. It reached all 30."""
    checkpoint, waiting = tmp_path / "checkpoint", tmp_path / "waiting"
    script = write_script(
        tmp_path / "resume.py",
        (
            "import gq, os, sys, time\n"
            f"done = int(open({str(checkpoint)!r}).read()) if os.path.exists({str(checkpoint)!r})"
            " else 0\n"
            "for step in gq.steps(range(done, 30)):\n"
            f"    open({str(checkpoint)!r}, 'w').write(str(step + 1))\n"
            "    if step == 9 and done == 0:\n"
            f"        open({str(waiting)!r}, 'w').close()\n"
            "        time.sleep(300)\n"
        ),
    )
    job_id = submit("--steps", "30", str(script))
    wait_for(waiting.exists, 60, what="the first run to reach its checkpoint")
    gq_ok("requeue", str(job_id))
    info = wait_state(job_id, "COMPLETED", timeout=60)
    assert (info["steps_done"], info["steps_total"], info["run_count"]) == (30, 30, 2)
    assert info["runs"][1]["steps_done"] == 20  # its last run's own count
    assert "██████████ done (20 in run 2)" in gq_ok("status", "--all")
    assert "30/30 (the job completed; run 2 counted 20)" in gq_ok("show", str(job_id))
