"""sbatch's --signal through real jobs: without B: it reaches the job's steps (what srun
started) or, where there are none, the job's main process alone; never the processes a
step or the main process forked for itself (DataLoader workers, spawned or forked)."""

from __future__ import annotations

import sys

import pytest

from conftest import gq_ok, submit, wait_for, wait_state, write_script

# A training loop whose DataLoader has two workers (started by ``fork`` or ``spawn``, the
# first argument): SIGUSR1 writes a checkpoint line (the writer's pid, the step it saw and
# how many workers were alive) and ends the loop early, as a time-limit handler does.
TRAIN = """\
import multiprocessing, os, signal, sys, time
import torch
from torch.utils.data import DataLoader, Dataset


class Numbers(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.tensor([float(index)])


step, stop = 0, False


def checkpoint(signum, frame):
    global stop
    with open(f"ckpt-{os.environ['GQ_JOB_ID']}", "a") as out:
        out.write(f"{os.getpid()} {step} {len(multiprocessing.active_children())}\\n")
    stop = True


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, checkpoint)
    print("main", os.getpid(), flush=True)
    loader = DataLoader(Numbers(), batch_size=4, num_workers=2,
                        multiprocessing_context=sys.argv[1])
    for batch in loader:
        step += 1
        if step == 1:  # its workers are up
            open(f"ready-{os.environ['GQ_JOB_ID']}", "w").close()
        if stop:
            break
    print("stopped", flush=True)
"""


@pytest.mark.long
def test_signal_reaches_the_main_process_or_the_srun_step_never_dataloader_workers(
    daemon, tmp_path
):
    """Once every job's workers are up, their limit is lowered to bring the signal on: the
    main process (or the task srun started) writes the checkpoint with the step it reached
    and both its workers alive; no worker writes one (fork workers inherit the handler) or
    dies of it (spawn workers keep SIGUSR1's default action), and each job completes early
    instead of failing or timing out."""
    train = write_script(tmp_path / "train.py", TRAIN)
    step = write_script(
        tmp_path / "step.sh", (f'srun {sys.executable} {train} fork\necho "shell lived on: $?"\n')
    )
    # Due 60 s in, unless the limit is lowered; declared, so that they start together
    # (jobs that declare nothing start one after another, each probed alone).
    limit = ("-t", "5", "--signal", "USR1@240", "--gpu-mem", "2G")
    jobs = {
        "fork": submit(*limit, str(train), "fork"),
        "spawn": submit(*limit, str(train), "spawn"),
        "srun": submit(*limit, str(step)),
    }
    for job_id in jobs.values():
        wait_for(
            lambda job_id=job_id: (tmp_path / f"ready-{job_id}").exists(),
            60,
            what=f"job {job_id}'s DataLoader workers",
        )
    gq_ok("update", *map(str, jobs.values()), "-t", "4:05")  # the signal is due at once
    ended = {
        kind: wait_state(job_id, "COMPLETED", "FAILED", "TIMEOUT", timeout=30)["state"]
        for kind, job_id in jobs.items()
    }
    for kind, job_id in jobs.items():
        out = (tmp_path / f"gq-{job_id}.out").read_text()
        assert ended[kind] == "COMPLETED", (kind, ended, out)
        lines = out.splitlines()
        main = int(lines[0].split()[1])
        # (A spawned worker may yet crash in torch's own shutdown of it under load, after the
        # loop: "terminate called without an active exception". Not of the signal, which
        # would have killed it as "User defined signal 1".)
        assert "stopped" in lines[1:], (kind, out)
        assert "User defined signal" not in out, (kind, out)
        written = (tmp_path / f"ckpt-{job_id}").read_text().splitlines()
        assert len(written) == 1, (kind, written)  # no worker wrote one
        pid, reached, workers = map(int, written[0].split())
        assert (pid, workers) == (main, 2), (kind, written)
        assert reached > 0, (kind, written)
        if kind == "srun":  # the batch shell was not signalled (it traps nothing)
            assert lines[-1] == "shell lived on: 0", out


def test_root_reads_a_bounded_part_of_a_job_s_environment_and_finds_only_whole_values():
    """The host reads job processes' environments as root to find srun's tasks: a job can
    point its environ at gigabytes (prctl PR_SET_MM needs no privilege), and a root read
    of all of it took 87 s and 9 GB. Only the first ENVIRON_READ_LIMIT bytes are read, a
    value cut off there is no value, and a gone or impossible process has none."""
    import subprocess

    from gq.exec.host.process_groups import ENVIRON_READ_LIMIT, environ_value, step_tasks

    padding = {f"PAD{n}": "x" * (100 << 10) for n in range(ENVIRON_READ_LIMIT // (100 << 10) + 1)}
    past = subprocess.Popen(["sleep", "30"], env={**padding, "SLURM_TASK_PID": "1"})
    plain = subprocess.Popen(["sleep", "30"], env={"SLURM_TASK_PID": "12", "B": "two"})
    try:
        wait_for(lambda: environ_value(plain.pid, b"B") == b"two", 10, what="its environ")
        assert environ_value(plain.pid, b"SLURM_TASK_PID") == b"12"
        assert environ_value(plain.pid, b"SLURM_TASK") is None  # a name, not a prefix
        assert environ_value(past.pid, b"PAD0") == b"x" * (100 << 10)
        assert environ_value(past.pid, b"SLURM_TASK_PID") is None  # past the bound
        assert step_tasks({past.pid, plain.pid}) == set()  # neither names itself
        for impossible in (2**70, -1, 0):
            assert environ_value(impossible, b"B") is None
    finally:
        for process in (past, plain):
            process.kill()
            process.wait()
    assert environ_value(plain.pid, b"B") is None  # gone
