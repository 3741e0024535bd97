"""Slurm habits through the real CLI and daemon: arrays, dependencies, hold, requeue,
update, #SBATCH scripts and export to sbatch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import (
    DaemonControl,
    all_jobs,
    gq,
    gq_ok,
    job,
    submit,
    wait_for,
    wait_state,
    write_script,
)


def test_array_never_runs_more_than_its_limit_and_each_task_sees_its_index(daemon, tmp_path):
    log = tmp_path / "running.log"
    script = write_script(
        tmp_path / "task.sh",
        (
            f"echo start $GQ_ARRAY_TASK_ID $(date +%s.%N) >> {log}\n"
            "echo task=$GQ_ARRAY_TASK_ID slurm=$SLURM_ARRAY_TASK_ID array=$GQ_ARRAY_JOB_ID "
            "sarray=$SLURM_ARRAY_JOB_ID jobid=$SLURM_JOB_ID\n"
            "sleep 0.3\n"
            f"echo end $GQ_ARRAY_TASK_ID $(date +%s.%N) >> {log}\n"
        ),
    )
    array_id = submit("--array", "0-9%2", "-o", "arr-%A_%a.out", str(script))
    status = gq_ok("status")
    assert f"{array_id}_[" in status and "%2]" in status
    tasks = [j for j in all_jobs() if j["array_job_id"] == array_id]
    assert sorted(t["array_task_id"] for t in tasks) == list(range(10))
    for task in tasks:
        wait_state(task["id"], "COMPLETED", timeout=60)
    running, peak = 0, 0
    events = sorted(
        (float(t), kind) for kind, _, t in (line.split() for line in log.read_text().splitlines())
    )
    for _, kind in events:
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak <= 2
    for task in tasks:
        index = task["array_task_id"]
        out = (tmp_path / f"arr-{array_id}_{index}.out").read_text()
        # Slurm's ids are gq's plus 10^10: no real cluster holds such an id.
        assert out.strip() == (
            f"task={index} slurm={index} array={array_id} "
            f"sarray={10**10 + array_id} jobid={10**10 + task['id']}"
        )
        assert task["job_id"] == f"{array_id}_{index}"


def test_cancel_one_task_or_the_whole_array(daemon, tmp_path):
    script = write_script(tmp_path / "s.sh", "sleep 300\n")
    array_id = submit("--array", "0-4%1", str(script))
    wait_for(lambda: any(j["state"] == "RUNNING" for j in all_jobs()), 10, what="a task")
    assert gq_ok("cancel", f"{array_id}_3").strip() == f"Cancelled job {array_id}_3"
    states = {j["array_task_id"]: j["state"] for j in all_jobs()}
    assert states[3] == "CANCELLED" and states[4] == "PENDING"
    gq_ok("cancel", str(array_id))
    wait_for(
        lambda: all(j["state"] == "CANCELLED" for j in all_jobs()), 10, what="every task cancelled"
    )


def test_afterok_chain_runs_in_order(daemon, tmp_path):
    log, go = tmp_path / "order.log", tmp_path / "go"
    script = write_script(
        tmp_path / "step.sh",
        (f"while [ ! -e {go} ]; do sleep 0.05; done\necho $GQ_JOB_NAME >> {log}\n"),
    )
    first = submit("-J", "one", str(script))
    second = submit("-J", "two", "--dependency", f"afterok:{first}", str(script))
    third = submit("-J", "three", "--after", str(second), str(script))
    assert job(third)["dependency"] == f"afterok:{second}"
    wait_for(lambda: job(second)["reason"] == "Dependency", 10, what="Dependency reason")
    go.touch()  # (until now the first runs: the second waits on it, whatever the load)
    wait_state(third, "COMPLETED", timeout=30)
    assert log.read_text().split() == ["one", "two", "three"]


def test_failing_head_cancels_the_chain_with_the_slurm_reason(daemon, tmp_path):
    failing = write_script(tmp_path / "fail.sh", "exit 1\n")
    fine = write_script(tmp_path / "fine.sh", "true\n")
    head = submit(str(failing))
    second = submit("--dependency", f"afterok:{head}", str(fine))
    third = submit("--dependency", f"afterok:{second}", str(fine))
    rescue = submit("--dependency", f"afternotok:{head}", str(fine))
    for dependant in (second, third):
        info = wait_state(dependant, "CANCELLED", timeout=30)
        assert info["reason"] == "DependencyNeverSatisfied"
        assert info["run_count"] == 0
    wait_state(rescue, "COMPLETED", timeout=30)


def test_hold_and_release(daemon, tmp_path):
    marker = tmp_path / "ran"
    script = write_script(tmp_path / "h.sh", f"touch {marker}\n")
    probe = write_script(tmp_path / "probe.sh", "true\n")
    held = submit("--hold", str(script))
    wait_state(submit(str(probe)), "COMPLETED")  # the daemon has scanned since: held stays
    info = job(held)
    assert info["state"] == "PENDING" and info["held"] and info["reason"] == "JobHeldUser"
    assert "JobHeldUser" in gq_ok("status")
    other = submit("--exclusive", str(write_script(tmp_path / "b.sh", "sleep 300\n")))
    wait_state(other, "RUNNING")
    queued = submit(str(script))
    assert gq_ok("hold", str(queued)).strip() == f"Held job {queued}"
    gq_ok("cancel", str(other))
    wait_state(other, "CANCELLED")
    wait_state(submit(str(probe)), "COMPLETED")  # the device was free, and still it waits
    assert job(queued)["state"] == "PENDING" and not marker.exists()
    assert gq_ok("release", str(held), str(queued)).split("\n")[0] == f"Released job {held}"
    wait_state(held, "COMPLETED")
    wait_state(queued, "COMPLETED")
    result = gq("hold", str(held))
    assert result.code == 2 and "only pending jobs can be held" in result.err


def test_requeue_of_a_completed_job_reruns_it_with_the_same_id(daemon, tmp_path):
    log = tmp_path / "runs.log"
    script = write_script(tmp_path / "r.sh", f"echo $GQ_JOB_ID >> {log}\n")
    job_id = submit(str(script))
    wait_state(job_id, "COMPLETED")
    assert gq_ok("requeue", str(job_id)).strip() == f"Requeued job {job_id}"
    wait_for(lambda: len(log.read_text().split()) == 2, 10, what="the second run")
    info = wait_state(job_id, "COMPLETED")
    assert info["run_count"] == 2 and log.read_text().split() == [str(job_id)] * 2
    assert ("COMPLETED", "PENDING", "requeued by user") in [
        (e["old_state"], e["new_state"], e["reason"]) for e in info["events"]
    ]


def test_requeue_of_a_running_job_restarts_it(daemon, tmp_path):
    script = write_script(tmp_path / "rr.sh", "sleep 300\n")
    job_id = submit(str(script))
    wait_state(job_id, "RUNNING")
    assert "Requeueing job" in gq_ok("requeue", str(job_id))
    wait_for(lambda: job(job_id)["run_count"] == 2, 15, what="the restart")
    assert job(job_id)["state"] == "RUNNING"
    gq_ok("cancel", str(job_id))
    wait_state(job_id, "CANCELLED")


def test_update_pending_and_running_jobs(daemon, tmp_path):
    script = write_script(tmp_path / "u.sh", "sleep 300\n")
    running = submit("--exclusive", str(script))
    wait_state(running, "RUNNING")
    pending = submit(str(script))
    gq_ok("update", str(pending), "--priority", "9", "--time", "5:00", "-J", "renamed")
    info = job(pending)
    assert (info["priority"], info["time_limit"], info["name"]) == (9, 300, "renamed")
    gq_ok("update", str(running), "--time", "0:01")  # a running job's limit, applied now
    info = wait_state(running, "TIMEOUT", timeout=15)
    assert info["time_limit"] == 1
    result = gq("update", str(running), "-J", "late")
    assert result.code == 2 and "only a pending job can have its name changed" in result.err
    gq_ok("cancel", str(pending))


def test_a_pending_jobs_command_line_is_edited_and_its_snapshot_stays(daemon, tmp_path):
    """As pueue edit: arguments, directory, outputs and dependency of a pending job."""
    script = write_script(tmp_path / "e.sh", 'echo "args: $*; in $(pwd)"\n')
    other = tmp_path / "other dir"
    other.mkdir()
    first = submit("--hold", str(script), "old")
    array = submit("--hold", "--array", "0-1", "-o", "arr-%a.out", str(script), "x")
    assert (
        gq_ok(
            "update",
            str(first),
            "--args",
            "--lr '3 e'",
            "-D",
            str(other),
            "-o",
            "%x-%j.txt",
            "-d",
            f"afterok:{array}",
        ).strip()
        == f"Updated job {first}"
    )
    refused = gq("update", f"{array}_1", "--args", "y")
    assert refused.code == 2 and "shares its arguments with the rest of its array" in refused.err
    gq_ok("update", str(array), "--args", "y z")
    script.write_text("echo edited\n")  # the snapshot stays as submitted
    gq_ok("release", str(first), str(array))
    wait_state(first, "COMPLETED", timeout=20)
    assert (other / f"e.sh-{first}.txt").read_text() == f"args: --lr 3 e; in {other}\n"
    assert job(first)["events"][-1]["time"] >= job(array)["end_time"]  # after its prerequisite
    for task in (0, 1):
        assert (tmp_path / f"arr-{task}.out").read_text() == f"args: y z; in {tmp_path}\n"
    for args, words in (
        (["--args", "'open"], "invalid --args"),
        (["-D", str(tmp_path / "nowhere")], "is not a directory"),
        (["-d", "afterok:99999"], "which does not exist"),
        (["-d", f"afterok:{first}"], "cannot depend on itself"),
    ):
        result = gq("update", str(first), *args)
        assert result.code == 2 and words in result.err, (args, result.err)
    ended = gq("update", str(first), "--args", "q")
    assert ended.code == 2 and "only a pending job can have its arguments changed" in ended.err
    separate = submit("--hold", "-o", "o-%j.out", "-e", "e-%j.err", str(script))
    gq_ok("update", str(separate), "-J", "renamed", "-o", "%x-%j.out")
    shown = job(separate)
    assert (Path(shown["stdout"]).name, Path(shown["stderr"]).name) == (
        f"renamed-{separate}.out",
        f"e-{separate}.err",
    )  # its own -e stays; %x the new name
    go = tmp_path / "go"
    gated = write_script(tmp_path / "g.sh", f"while [ ! -e {go} ]; do sleep 0.05; done\n")
    partly = submit("--hold", "--array", "0-1", str(gated))
    gq_ok("release", f"{partly}_0")
    wait_state(partly, "RUNNING")
    refused = gq("update", str(partly), "--args", "new")
    assert refused.code == 2 and "can change only while every task is pending" in refused.err
    go.touch()
    gq_ok("cancel", str(partly), str(separate))


def test_sbatch_script_runs_with_its_name_memory_and_time_limit(daemon, tmp_path):
    script = write_script(
        tmp_path / "slurm_job.sh",
        (
            "#!/bin/bash\n"
            "#SBATCH --job-name=from-slurm\n"
            "#SBATCH --mem=2G --gres=gpu:1\n"
            "#SBATCH --time=0:02\n"
            "#SBATCH --nodes=1 --ntasks=1\n"
            "#SBATCH --partition=gpu\n"
            "#SBATCH --output=slurm-%j.out\n"
            'echo "running as $GQ_JOB_NAME"\n'
            "sleep 30\n"
        ),
        0o755,
    )
    result = gq("submit", "--parsable", str(script))
    assert result.code == 0
    # -N 1 and -n 1 are what gq runs anyway; --partition is said, once.
    warnings = result.err.strip().splitlines()
    assert len(warnings) == 1 and "#SBATCH --partition is not used by gq" in warnings[0]
    job_id = int(result.out)
    info = wait_state(job_id, "TIMEOUT", timeout=15)
    # In #SBATCH lines --mem is host memory, as on a cluster: no device memory asked for.
    assert (info["name"], info["host_mem"], info["mem"], info["gpus"], info["time_limit"]) == (
        "from-slurm",
        2 << 30,
        None,
        1,
        2,
    )
    assert "running as from-slurm" in (tmp_path / f"slurm-{job_id}.out").read_text()


def test_gq_directives_win_over_sbatch_and_command_line_over_both(home, tmp_path):
    script = write_script(
        tmp_path / "both.sh",
        ("#SBATCH -J slurm-name --mem=1G --time=10 --gpus=2\n#GQ -J gq-name --gpu-mem 2G\ntrue\n"),
    )
    info = job(submit("--gpu-mem", "3G", "--gres", "gpu:1", str(script)))
    assert (info["name"], info["mem"], info["host_mem"], info["time_limit"], info["gpus"]) == (
        "gq-name",
        3 << 30,
        1 << 30,
        600,
        1,
    )


def test_export_slurm_inlines_the_snapshot_and_translates_options(home, tmp_path):
    script = write_script(tmp_path / "exp.py", "import sys\nprint('args', sys.argv[1:])\n")
    job_id = submit(
        "-J",
        "exported",
        "--gpu-mem",
        "512M",
        "--host-mem",
        "1G",
        "-t",
        "1:30:00",
        "--requeue",
        "-o",
        "%x-%j.out",
        str(script),
        "--lr",
        "3e-4",
    )
    script.write_text("print('edited later')\n")
    result = gq("export", "slurm", str(job_id))
    text = result.out
    assert result.code == 0 and text.startswith("#!/bin/bash\n")
    for line in (
        "#SBATCH --job-name=exported",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem=1024M",
        "# gq --gpu-mem 512.0M",
        "#SBATCH --time=1:30:00",
        "#SBATCH --requeue",
        "#SBATCH --output=%x-%j.out",
    ):
        assert line in text
    assert "changed since it was submitted; its snapshot is inlined" in result.err
    assert "print('args', sys.argv[1:])" in text and "edited later" not in text
    exported = tmp_path / "exported.sbatch"
    exported.write_text(text)
    run = subprocess.run(
        ["bash", str(exported)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)},
    )
    # sbatch would run it the same way: bash, on the cluster's python3.
    assert run.returncode == 0, run.stderr
    assert "args ['--lr', '3e-4']" in run.stdout


def test_dependency_on_missing_job_is_refused(home, tmp_path):
    script = write_script(tmp_path / "d.sh", "true\n")
    for args in (["--after", "42"], ["--dependency", "afterok:42"]):
        result = gq("submit", *args, str(script))
        assert result.code == 2 and "dependency on job 42, which does not exist" in result.err
    result = gq("submit", "--dependency", "whenever:1", str(script))
    assert result.code == 2 and "invalid dependency" in result.err
    result = gq("submit", "--array", "9-1", str(script))
    assert result.code == 2 and "empty range" in result.err
    assert all_jobs() == []


def test_sbatch_spellings_gq_takes_and_those_it_refuses(home, tmp_path):
    import socket
    import time

    DaemonControl(home).start("--cpu-devices", "2", "--device-model", "Fake GPU")
    script = write_script(tmp_path / "b.sh", "echo ran\n")
    asked = time.time()
    begun = submit(
        "--begin", "now+2", "-t", "UNLIMITED", "--host-mem", "0", "-o", "b-%N.out", str(script)
    )
    waiting = wait_for(
        lambda: job(begun)["reason"] == "BeginTime" and job(begun), 10, what="the BeginTime reason"
    )
    assert waiting["state"] == "PENDING" and waiting["time_limit"] is None
    assert waiting["host_mem"] is None  # --mem=0: no limit, as sbatch's
    info = wait_state(begun, "COMPLETED", timeout=20)
    from datetime import datetime

    assert datetime.fromisoformat(info["start_time"]).timestamp() >= asked + 1.5
    node = socket.gethostname().split(".")[0]
    assert (tmp_path / f"b-{node}.out").read_text() == "ran\n"
    result = gq("submit", "--mem", "64M", "--parsable", str(script))
    assert result.code == 0 and "write --gpu-mem" in result.err
    assert job(int(result.out))["gpu_mem"] == 64 << 20
    typed = job(submit("--gres", "gpu:fake:2", str(script)))
    assert (typed["gpus"], typed["gpu_type"]) == (2, "fake")
    before = len(all_jobs())
    for args, words in (
        (["--gpus", "a100:1"], "no device(s) of type 'a100' (its models: Fake GPU)"),
        (["--gres", "gpu:fake:3"], "--gpus 3 is more than this node has (2)"),
        (["-c", "1000"], "--cpus-per-task 1000 is more than this node has"),
        (["--gres", "gpu:1,tmpfs:1"], "gq has only gpu"),
        (["--gpus", "two"], "invalid --gpus two"),
        (["--begin", "soonish"], "invalid --begin 'soonish'"),
        (["--host-mem", "100T"], "is more than this node has"),
        (["-c", "0"], "invalid --cpus-per-task 0"),
    ):
        result = gq("submit", *args, str(script))
        assert result.code == 2 and words in result.err and len(result.err.splitlines()) == 1, (
            args,
            result.err,
        )
    assert len(all_jobs()) == before


def test_signal_before_the_time_limit_reaches_the_batch_shell_or_its_steps(daemon, tmp_path):
    """sbatch's --signal: B: to the job's main process alone; else to the tasks srun
    started, never to the batch shell, which would die of an untrapped USR2."""
    batch = write_script(
        tmp_path / "batch.sh",
        (
            "trap 'echo warned; exit 0' USR1\n"
            "for i in $(seq 1 300); do sleep 0.1; done\necho never\n"
        ),
    )
    step = write_script(
        tmp_path / "step.sh",
        (
            f'srun -n 2 {sys.executable} -c "import os, signal, sys, time\n'
            "signal.signal(signal.SIGUSR2, lambda *a: (os.write(1, b'step warned\\\\n'), "
            "sys.exit(0)))\n"
            'time.sleep(30)"\n'
            'echo "shell lived on: $?"\n'
        ),
    )
    # Warned 5 s after their start: by then srun's two interpreters have their handlers in
    # place, on a loaded machine too (2 s left that to chance).
    warned = submit("-t", "1", "--signal", "B:USR1@55", str(batch))
    stepped = submit("-t", "1", "--signal", "SIGUSR2@55", str(step))
    for job_id in (warned, stepped):
        assert (
            wait_state(job_id, "COMPLETED", "FAILED", "TIMEOUT", timeout=30)["state"] == "COMPLETED"
        )
    assert (tmp_path / f"gq-{warned}.out").read_text() == "warned\n"
    # Both tasks srun started were warned; srun itself passed the signal on and lived.
    assert (tmp_path / f"gq-{stepped}.out").read_text() == (
        "step warned\nstep warned\nshell lived on: 0\n"
    )
    assert "Signal: B:10@55" in gq_ok("show", str(warned))
    result = gq("submit", "--signal", "USR9@5", str(batch))
    assert result.code == 2 and "invalid --signal USR9@5" in result.err


def test_host_memory_is_reserved_on_the_node_until_the_job_ends(daemon, tmp_path):
    import psutil

    go = tmp_path / "go"
    script = write_script(tmp_path / "hold.sh", f"while [ ! -e {go} ]; do sleep 0.05; done\n")
    most = f"{psutil.virtual_memory().total * 6 // 10 >> 20}M"
    first = submit("--host-mem", most, str(script))
    second = submit("--host-mem", most, str(script))
    unlimited = submit(str(script))  # reserves nothing: never held by the two
    for job_id in (first, unlimited):
        wait_state(job_id, "RUNNING")
    waiting = wait_for(
        lambda: job(second)["reason"] is not None and job(second),
        10,
        what="the second job's reason",
    )
    assert waiting["state"] == "PENDING"
    assert waiting["reason"] == "Resources (the node's host memory or CPUs)"
    go.touch()
    for job_id in (first, second, unlimited):
        wait_state(job_id, "COMPLETED", timeout=20)


def test_retries_pinning_and_a_begin_time_moved_to_now(home, tmp_path):
    DaemonControl(home).start("--cpu-devices", "2")
    failing = write_script(
        tmp_path / "fail.sh",
        (
            'echo "run ${SLURM_RESTART_COUNT:-0} on $GQ_VISIBLE_DEVICES tasks $SLURM_NTASKS"\n'
            "exit 3\n"
        ),
    )
    retried = submit("--retries", "2", "--retry-delay", "1", "-w", "cpu1", "-n", "2", str(failing))
    info = wait_state(retried, "FAILED", timeout=30)
    assert (info["run_count"], info["exit_code"], info["device"]) == (3, 3, "cpu1")
    runs = (tmp_path / f"gq-{retried}.out").read_text().splitlines()
    assert runs == ["run 0 on 1 tasks 2", "run 1 on 1 tasks 2", "run 2 on 1 tasks 2"]
    starts = [e["time"] for e in job(retried)["events"] if e["new_state"] == "RUNNING"]
    from datetime import datetime

    gaps = [
        datetime.fromisoformat(b).timestamp() - datetime.fromisoformat(a).timestamp()
        for a, b in zip(starts, starts[1:])
    ]
    assert all(gap >= 0.9 for gap in gaps), gaps  # --retry-delay 1
    assert "Retries: 2 of 2 used" in gq_ok("show", str(retried))
    # gq requeue --state F: every failed job of the caller's, its retries counted again.
    assert gq_ok("requeue", "--state", "F").strip() == f"Requeued job {retried}"
    assert wait_state(retried, "FAILED", timeout=30)["run_count"] == 6
    later = submit("--begin", "now+1hour", str(failing))
    wait_for(lambda: job(later)["reason"] == "BeginTime", 10, what="BeginTime")
    assert gq_ok("update", str(later), "--begin", "now").strip() == f"Updated job {later}"
    wait_state(later, "FAILED", timeout=20)
    for args, words in (
        (["-w", "gpu7"], "--nodelist names no device gpu7"),
        (["-w", "cpu0", "-G", "2"], "leaves 1 device(s)"),
        (["--retry-delay", "5"], "--retry-delay applies with --retries"),
        (["--retries", "1000"], "invalid --retries 1000"),
    ):
        result = gq("submit", *args, str(failing))
        assert result.code == 2 and words in result.err, (args, result.err)
    result = gq("update", str(retried), "--begin", "now+1hour")
    assert result.code == 2 and "only a pending job can have its begin time changed" in result.err


def test_drain_stops_new_jobs_on_the_node_or_a_device_and_resume_undoes_it(home, tmp_path):
    DaemonControl(home).start("--cpu-devices", "2")
    go = tmp_path / "go"
    held = str(
        write_script(
            tmp_path / "held.py",
            "import os, time\n"  # (a shell job: alone)
            f"while not os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n",
        )
    )
    running = submit("--gpu-mem", "100M", held)
    wait_state(running, "RUNNING")
    assert "Draining the node (maintenance)" in gq_ok("drain", "--reason", "maintenance")
    queued = submit("--gpu-mem", "100M", held)
    waiting = wait_for(lambda: job(queued)["reason"] and job(queued), 10, what="a reason")
    assert waiting["reason"] == "ReqNodeNotAvail: draining (maintenance)"
    assert "node: draining (maintenance)" in gq_ok("info")
    assert job(running)["state"] == "RUNNING"  # what runs goes on
    gq_ok("resume")
    wait_state(queued, "RUNNING")
    gq_ok("drain", "cpu0", "cpu1", "--reason", "fan")
    pinned = submit("-w", "cpu1", "--gpu-mem", "100M", held)
    wait_for(
        lambda: job(pinned)["reason"] == "ReqNodeNotAvail: draining (fan)",
        10,
        what="the device's drain reason",
    )
    assert "draining (fan); no new job starts here; 'gq resume cpu1'" in gq_ok("info")
    gq_ok("resume", "cpu1")
    wait_state(pinned, "RUNNING")
    result = gq("drain", "gpu9")
    assert result.code == 2 and "no device gpu9 on this node" in result.err
    go.touch()
    for job_id in (running, queued, pinned):
        wait_state(job_id, "COMPLETED", timeout=20)


def test_notify_on_finish_and_mail_run_as_the_owner_once_the_job_ends(home, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mailed = tmp_path / "mailed.log"
    write_script(
        bin_dir / "mail", f'#!/bin/sh\necho "to=$3 subject=$2 body=$(cat)" >> {mailed}\n', 0o755
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")  # the node's mail command
    finished = tmp_path / "finished.log"
    DaemonControl(home).start(
        "--on-finish", f'echo "$GQ_JOB_ID $GQ_JOB_STATE $(id -u)" >> {finished}'
    )
    notified = tmp_path / "notified.log"
    script = write_script(tmp_path / "n.sh", "exit ${1:-0}\n")
    daemon_fds = Path(f"/proc/{DaemonControl(home).pid()}/fd")
    fds_before = len(list(daemon_fds.iterdir()))
    failing = submit(
        "--notify",
        f'echo "$GQ_JOB_ID $GQ_JOB_STATE exit=$GQ_JOB_EXIT_CODE out=$GQ_JOB_OUTPUT" >> {notified}',
        "--mail-type",
        "FAIL",
        "--mail-user",
        "ann@example.org",
        str(script),
        "3",
    )
    fine = submit("--mail-type", "BEGIN,END", str(script))
    held = submit("--hold", "--notify", "exit 4", str(script))  # a failing hook: logged
    gq_ok("cancel", str(held))
    for job_id in (failing, fine):
        wait_state(job_id, "COMPLETED", "FAILED")
    wait_for(
        lambda: finished.exists() and len(finished.read_text().splitlines()) == 3,
        15,
        what="three --on-finish hooks",
    )
    assert sorted(finished.read_text().splitlines()) == sorted(
        [
            f"{failing} FAILED {os.geteuid()}",
            f"{fine} COMPLETED {os.geteuid()}",
            f"{held} CANCELLED {os.geteuid()}",
        ]
    )
    wait_for(
        lambda: (
            notified.exists()
            and notified.read_text().endswith("\n")
            and mailed.exists()
            and len(mailed.read_text().splitlines()) == 3
        ),
        15,
        what="the hooks and mails",
    )
    assert notified.read_text() == (f"{failing} FAILED exit=3 out={tmp_path}/gq-{failing}.out\n")
    mails = sorted(mailed.read_text().splitlines())
    assert (
        f"to=ann@example.org subject=gq job {failing} (n.sh) FAILED body=gq job {failing} "
        f"(n.sh) of {job(failing)['user']}: FAILED, exit code 3" in mails[0]
    )
    user = job(fine)["user"]
    assert [m.split(" body=")[0] for m in mails[1:]] == sorted(
        [
            f"to={user} subject=gq job {fine} (n.sh) RUNNING",
            f"to={user} subject=gq job {fine} (n.sh) COMPLETED",
        ]
    )
    wait_for(
        lambda: (
            f"job {held}: its --notify hook failed (exit status 4)" in DaemonControl(home).log()
        ),
        10,
        what="the failed hook in the log",
    )
    for _ in range(8):  # hooks that succeed leave the daemon no descriptor
        submit("--notify", "true", str(script))
    wait_for(lambda: len(finished.read_text().splitlines()) == 11, 20, what="eight more hooks")
    wait_for(
        lambda: len(list(daemon_fds.iterdir())) <= fds_before + 2,
        10,
        what="the hooks' descriptors closed",
    )
    for args, words in (
        (["--mail-type", "SOMETIMES"], "invalid --mail-type 'SOMETIMES'"),
        (["--mail-user", "-E reboot"], "invalid --mail-user '-E reboot'"),
        (["--notify", " "], "--notify needs a command"),
    ):
        result = gq("submit", *args, str(script))
        assert result.code == 2 and words in result.err, (args, result.err)


def test_a_daemon_restarted_with_on_finish_runs_it_only_for_jobs_that_end_afterwards(
    home, tmp_path
):
    """Jobs that ended under a daemon without --on-finish (after the last hook it ran) are
    not taken for unread by a daemon restarted with it."""
    control = DaemonControl(home)
    control.start()
    script = write_script(tmp_path / "s.sh", "true\n")
    notified_log = tmp_path / "notified.log"
    notified = submit("--notify", f"echo $GQ_JOB_ID >> {notified_log}", str(script))
    earlier = [submit(str(script)) for _ in range(5)]
    for job_id in (notified, *earlier):
        wait_state(job_id, "COMPLETED")
    wait_for(notified_log.exists, 15, what="the --notify hook")  # the last hook it ran
    control.stop()
    finished = tmp_path / "finished.log"
    control.start("--on-finish", f'echo "$GQ_JOB_ID" >> {finished}')
    later = submit(str(script))
    wait_for(
        lambda: finished.exists() and finished.read_text().strip(),
        15,
        what="the --on-finish hook of the job that ended afterwards",
    )
    assert finished.read_text().split() == [str(later)]
    control.stop()


def test_a_suspended_job_holds_no_lane_and_its_time_limit_stops(daemon, tmp_path):
    """Under fifo a later job waits for the earlier one; suspended, the earlier one counts
    for nothing, so the later one runs (and ends) meanwhile; resumed, the earlier one ends
    within its time limit, which the suspension did not count against."""
    go = tmp_path / "go"
    loop = write_script(
        tmp_path / "loop.py",
        (
            "import os, sys, time\nimport gq\n"
            "for step in gq.steps(range(int(sys.argv[1])), total=int(sys.argv[1])):\n"
            "    time.sleep(0.03)\n"
            f"    while step == 5 and sys.argv[2:] and not os.path.exists({str(go)!r}):\n"
            "        time.sleep(0.02)  # inside its iteration: it holds the lane\n"
        ),
    )
    # The limit must outlast start-up, 30 iterations and a loaded machine's reports, while
    # the later job (9 s) keeps the first suspended for longer than it.
    first = submit("-t", "0:08", str(loop), "30", "gated")
    later = submit(str(loop), "300")
    wait_for(lambda: job(first)["steps_done"] >= 5, 20, what="the first job's steps")
    assert gq_ok("suspend", str(first)).strip() == f"Suspended job {first}"
    shown = job(first)
    assert (shown["state"], shown["suspended"]) == ("SUSPENDED", True)
    assert f"{first}  " in gq_ok("status") and " S " in gq_ok("status")
    wait_state(later, "COMPLETED", timeout=30)  # the lane was the later job's meanwhile
    assert job(first)["state"] == "SUSPENDED"
    assert gq_ok("resume", str(first)).strip() == f"Resumed job {first}"
    go.touch()
    info = wait_state(first, "COMPLETED", "TIMEOUT", timeout=30)
    assert info["state"] == "COMPLETED" and info["steps_done"] == 30
    from datetime import datetime

    wall = (
        datetime.fromisoformat(info["end_time"]).timestamp()
        - datetime.fromisoformat(info["start_time"]).timestamp()
    )
    assert wall > 8  # longer than its limit, suspended for part of it
    for verb, words in (
        ("suspend", "only a running job can be suspended"),
        ("resume", "is not suspended; nothing to resume"),
    ):
        result = gq(verb, str(first))
        assert result.code == 2 and words in result.err, (verb, result.err)
