"""Steps counted in jobs gq's worker does not run (gq.exec.job.rank_progress): a shell script's
Python and torchrun's ranks show their lowest rank's steps; the file that carries them is
the job's to write, and whatever it holds costs the host and other jobs nothing."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

from gq.exec.job import rank_progress
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
    # Sent at most four times a second: while it waits there, some of its first 10 steps.
    halfway = wait_for(
        lambda: (info := job(job_id))["steps_done"] > 0 and info, 60, what="steps counted"
    )
    assert halfway["state"] == "RUNNING" and halfway["steps_done"] <= 10
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


# The little of torch the count uses (its global step hook), for the tests that need no
# real training: a process starts in milliseconds instead of seconds.
FAKE_TORCH = {
    "torch/__init__.py": "from torch import optim\n",
    "torch/optim/__init__.py": "from torch.optim.optimizer import Optimizer as SGD\n",
    "torch/optim/optimizer.py": (
        "_hooks = []\n"
        "def register_optimizer_step_post_hook(hook):\n"
        "    _hooks.append(hook)\n"
        "class Optimizer:\n"
        "    def step(self):\n"
        "        for hook in _hooks:\n"
        "            hook(self, (), {})\n"
    ),
}
# Steps of the fake torch's optimizer: argv[1] of them.
FAKE_TRAIN = (
    "import sys, torch\n"
    "opt = torch.optim.SGD()\n"
    "for _ in range(int(sys.argv[1])):\n"
    "    opt.step()\n"
)


def fake_torch(directory) -> None:
    for name, text in FAKE_TORCH.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)


# Datagrams a hostile job sends to its run's socket: garbage, counts past int64 or going
# back, then a flood that fills the socket's queue, then one plausible count.
HOSTILE = """
import os, socket, sys, time
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.connect(os.environ["GQ_PROGRESS_SOCKET"])
sock.send(b"7")
open("seven", "w").close()
while not os.path.exists("next"):
    time.sleep(0.02)
for bad in (b"abc", b"9" * 40, b"99999999999999999999", b"-5", b"1e9", b" 3", b"\\x00",
            b"\\xd9\\xa3", b"8" * 5000, b""):
    sock.send(bad)
sock.setblocking(False)
sent = 0
for _ in range(100_000):
    try:
        sock.send(b"8\\x00")
        sent += 1
    except BlockingIOError:
        break
time.sleep(1.5)  # the host drains the queue
sock.setblocking(True)
sock.send(b"9")
open("flooded", "w").write(str(sent))
while not os.path.exists("done"):
    time.sleep(0.02)
"""


def test_a_job_that_sends_garbage_to_its_progress_socket_costs_no_one_anything(daemon, tmp_path):
    """Garbage, counts past int64, one that goes back, a flood until its queue is full:
    the host believes only the plausible counts, never blocks, and a job beside it is
    counted as usual."""
    fake_torch(tmp_path)
    write_script(tmp_path / "train.py", FAKE_TRAIN)
    write_script(tmp_path / "hostile.py", HOSTILE)
    bad = submit(str(write_script(tmp_path / "hostile.sh", f"#!/bin/bash\n{PYTHON} hostile.py\n")))
    wait_for(lambda: job(bad)["steps_done"] == 7, 30, what="the plausible count")
    seen = set()
    (tmp_path / "next").touch()
    wait_for(
        lambda: seen.add(job(bad)["steps_done"]) or 9 in seen, 30, what="the last plausible count"
    )
    assert seen <= {7, 9}  # nothing past int64, nothing lower, nothing of the garbage
    assert int((tmp_path / "flooded").read_text()) < 100_000  # its own queue refused it
    script = write_script(tmp_path / "honest.sh", f"#!/bin/bash\n{PYTHON} train.py 6\n")
    honest = submit(str(script))
    assert wait_state(honest, "COMPLETED", timeout=60)["steps_done"] == 6
    (tmp_path / "done").touch()
    assert wait_state(bad, "COMPLETED", timeout=30)["steps_done"] == 9


# ----- the socket, as the host reads it --------------------------------------------------
def test_a_datagram_is_believed_only_as_a_plain_count():
    for data, expected in (
        (b"12", 12),
        (b"  12\n", 12),
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
        assert rank_progress.parse_count(data) == expected, data


def test_a_run_gets_a_fresh_socket_of_its_own_user_and_a_new_host_sweeps_old_ones(tmp_path):
    other = tmp_path / "gpu1.3.1"
    other.write_text("")  # another device's: left alone
    stale = tmp_path / "cpu.3.1"
    stale.write_text("")  # left by a host of this device that was killed
    runs = rank_progress.RankProgress(str(tmp_path), "cpu")
    assert not stale.exists() and other.exists()
    sock = runs.bind(3, 1, 54321, 54321)
    info = os.stat(stale)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (54321, 54321)
    runs.discard(sock)
    assert not stale.exists()
    assert rank_progress.RankProgress(None, "cpu").bind(3, 1, None, None) is None


def test_only_the_lowest_rank_counts_and_a_hidden_sitecustomize_still_loads(tmp_path):
    """A job's own sitecustomize (here a package) and its own gq module stay its own."""
    own = tmp_path / "own"
    (own / "sitecustomize").mkdir(parents=True)
    (own / "sitecustomize" / "__init__.py").write_text("from . import part\n")
    (own / "sitecustomize" / "part.py").write_text("LOADED = True\n")
    (own / "gq.py").write_text("MINE = True\n")
    fake_torch(own)
    code = "import gq, sitecustomize\nassert gq.MINE and sitecustomize.part.LOADED\n" + FAKE_TRAIN
    site = os.path.join(os.path.dirname(rank_progress.__file__), "rank_site")
    for rank, expected in (("0", b"3"), ("1", None), (None, b"3")):
        path = str(tmp_path / f"socket-{rank}")
        host_end = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        host_end.bind(path)
        host_end.setblocking(False)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID")}
        env.update(GQ_PROGRESS_SOCKET=path, PYTHONPATH=f"{site}:{own}")
        if rank is not None:
            env["RANK"] = rank
        subprocess.run([sys.executable, "-c", code, "3"], env=env, check=True, cwd=tmp_path)
        last = None
        while True:
            try:
                last = host_end.recv(64)
            except BlockingIOError:
                break
        host_end.close()
        assert last == expected, rank
