"""Steps counted in jobs gq's worker does not run (gq.exec.rank_progress): a shell script's
Python and torchrun's ranks show their lowest rank's steps; the file that carries them is
the job's to write, and whatever it holds costs the host and other jobs nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from gq.exec import rank_progress
from gq.validation import INT64_MAX

from conftest import PYTHON, gq_ok, job, submit, wait_for, wait_state, write_script

# Two optimizers a step, as a GAN has: one iteration each step. With a pause file, it waits
# there once half its steps are done.
TRAIN = """
import os, sys, time, torch
steps, pause = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None
torch.manual_seed(0)
gen, disc = torch.nn.Linear(8, 1), torch.nn.Linear(8, 1)
g_opt = torch.optim.SGD(gen.parameters(), lr=0.01)
d_opt = torch.optim.SGD(disc.parameters(), lr=0.01)
for step in range(steps):
    for model, opt in ((gen, g_opt), (disc, d_opt)):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    if pause and step + 1 == steps // 2:
        while not os.path.exists(pause):
            time.sleep(0.02)
print("trained", steps)
"""

# Each rank steps a different number of times: rank 0 twelve, rank 1 seventeen.
RANKS = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1]) + 5 * dist.get_rank()):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
print("rank", dist.get_rank(), "done", flush=True)
dist.destroy_process_group()
"""


def test_a_shell_jobs_python_shows_its_steps_while_it_runs(daemon, tmp_path):
    write_script(tmp_path / "train.py", TRAIN)
    script = write_script(tmp_path / "job.sh", f"#!/bin/bash\n{PYTHON} train.py 20 go\n")
    job_id = submit(str(script))
    halfway = wait_for(
        lambda: (info := job(job_id))["steps_done"] == 10 and info, 60, what="10 steps counted"
    )
    assert halfway["state"] == "RUNNING"
    (tmp_path / "go").touch()
    info = wait_state(job_id, "COMPLETED", timeout=60)
    assert info["steps_done"] == 20  # two optimizers a step: 20 iterations, not 40
    assert (
        "PROGRESS" in gq_ok("status", "--all")
        and "trained 20" in (tmp_path / f"gq-{job_id}.out").read_text()
    )


def test_torchrun_shows_its_lowest_ranks_steps(daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}")
    write_script(tmp_path / "ranks.py", RANKS)
    job_id = int(
        gq_ok(
            "run",
            "--parsable",
            "--",
            os.path.basename(PYTHON),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "ranks.py",
            "12",
        ).strip()
    )
    info = wait_state(job_id, "COMPLETED", timeout=120)
    output = (tmp_path / f"gq-{job_id}.out").read_text()
    assert "rank 0 done" in output and "rank 1 done" in output
    assert (info["worker"], info["steps_done"]) == (False, 12)


def test_a_job_that_scribbles_on_its_progress_file_costs_no_one_anything(daemon, tmp_path):
    """Garbage, a count past int64, one that goes back, and finally a FIFO in the file's
    place (a personal daemon's directory is the user's own): the host believes only the
    plausible counts, never blocks, and a job beside it is counted as usual."""
    write_script(tmp_path / "train.py", TRAIN)
    hostile = write_script(
        tmp_path / "hostile.sh",
        "#!/bin/bash\n"
        'printf "      7\\n" > "$GQ_PROGRESS_FILE"; touch seven\n'
        "while [ ! -e next ]; do sleep 0.02; done\n"
        'for bad in abc 99999999999999999999999 -5 "1e9" " 3" "$(printf "\\x01")"; do\n'
        '  printf %s "$bad" > "$GQ_PROGRESS_FILE"; sleep 0.3\n'
        "done\n"
        'printf 9 > "$GQ_PROGRESS_FILE"\n'
        "while [ ! -e fifo ]; do sleep 0.02; done\n"
        'rm -f "$GQ_PROGRESS_FILE"; mkfifo "$GQ_PROGRESS_FILE"; touch fifo-made\n'
        "while [ ! -e done ]; do sleep 0.02; done\n",
    )
    bad = submit(str(hostile))
    wait_for(lambda: job(bad)["steps_done"] == 7, 30, what="the plausible count")
    seen = set()
    (tmp_path / "next").touch()
    wait_for(
        lambda: seen.add(job(bad)["steps_done"]) or 9 in seen, 30, what="the last plausible count"
    )
    assert seen <= {7, 9}  # nothing in between, nothing past int64, nothing lower
    (tmp_path / "fifo").touch()
    wait_for(lambda: (tmp_path / "fifo-made").exists(), 10, what="the FIFO")
    script = write_script(tmp_path / "honest.sh", f"#!/bin/bash\n{PYTHON} train.py 6\n")
    honest = submit(str(script))
    assert wait_state(honest, "COMPLETED", timeout=60)["steps_done"] == 6
    (tmp_path / "done").touch()
    info = wait_state(bad, "COMPLETED", timeout=30)
    assert info["steps_done"] == 9


# ----- the file, as the host reads it ----------------------------------------------------
def test_a_progress_file_is_believed_only_as_a_plain_count_of_its_users(tmp_path):
    path = tmp_path / "1.1"
    for content, expected in (
        (b"                  12\n", 12),
        (b"0", 0),
        (str(INT64_MAX).encode(), INT64_MAX),
        (str(INT64_MAX + 1).encode(), None),
        (b"9" * 40, None),
        (b"", None),
        (b"abc", None),
        (b"-5", None),
        (b"1e9", None),
        (b"\xd9\xa3", None),  # a digit, but not an ASCII one
        (b"12\x0034", None),
        (b"\x00" * 8, None),
    ):
        path.write_bytes(content)
        assert rank_progress.read_count(str(path), os.getuid()) == expected, content
    assert rank_progress.read_count(str(path), os.getuid() + 1) is None  # another user's
    link = tmp_path / "link"
    path.write_bytes(b"5")
    link.symlink_to(path)
    assert rank_progress.read_count(str(link), os.getuid()) is None  # never followed
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert rank_progress.read_count(str(fifo), os.getuid()) is None  # not waited on
    assert rank_progress.read_count(str(tmp_path / "missing"), None) is None


def test_a_run_gets_a_fresh_file_of_its_own_user_that_no_one_else_may_touch(tmp_path):
    files = rank_progress.RankProgress(str(tmp_path))
    stale = tmp_path / "3.1"
    stale.write_text("99")  # left by a run the host was killed in
    path = files.create(3, 1, 54321, 54321)
    info = os.stat(path)
    assert path == str(stale) and info.st_size == 0
    assert stat.S_IMODE(info.st_mode) == 0o600
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (54321, 54321)
    files.remove(path)
    assert not os.path.exists(path)
    assert rank_progress.RankProgress(None).create(3, 1, None, None) is None


def test_a_process_that_is_not_the_lowest_rank_counts_nothing(tmp_path):
    path = tmp_path / "progress"
    path.write_bytes(b"")
    code = (
        "import torch\n"
        "model = torch.nn.Linear(2, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.ones(1, 2)).sum().backward(); opt.step()\n"
    )
    site = os.path.join(os.path.dirname(rank_progress.__file__), "rank_site")
    root = os.path.dirname(os.path.dirname(os.path.dirname(rank_progress.__file__)))
    for rank, expected in (("0", b"3"), ("1", b""), (None, b"3")):
        path.write_bytes(b"")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
        env.update(GQ_PROGRESS_FILE=str(path), PYTHONPATH=f"{site}:{root}")
        if rank is not None:
            env["RANK"] = rank
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        assert path.read_bytes().strip() == expected, rank
