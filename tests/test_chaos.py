"""Chaos on a shared node: two users' hundred short jobs (shell scripts, gq.steps loops,
torch loops, an array, a dependency chain) while the system daemon is killed with SIGKILL
three times and restarted, and the execution host is killed once. Every job reaches a final
state, none runs twice (each appends a start marker), the killed host's jobs are FAILED or
requeued (--requeue), and every other job ends with its script's real exit code."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
from collections import Counter

import pytest
from test_shared_node import _script

from conftest import install_from_here, pid_alive, wait_for

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE"}
HOST_DEATH = ("execution host of cpu died", "node failure")
SHELL = "echo $GQ_JOB_ID >> starts\nsleep 0.$((RANDOM % 3))\nexit ${1:-0}\n"
STEPS = (
    "import gq, os, sys, time\n"
    "open('starts', 'a').write(os.environ['GQ_JOB_ID'] + '\\n')\n"
    "for _ in gq.steps(range(20)):\n    time.sleep(0.01)\n"
    "sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)\n"
)
# One job runs until the host has been killed under it (then its rerun ends at once).
UNTIL_HOST_KILLED = "echo $GQ_JOB_ID >> starts\nwhile [ ! -e host-killed ]; do sleep 0.05; done\n"
TORCH = (
    "import os, torch\n"
    "open('starts', 'a').write(os.environ['GQ_JOB_ID'] + '\\n')\n"
    "model = torch.nn.Linear(8, 1)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.01)\n"
    "for _ in range(30):\n"
    "    optimizer.zero_grad(); model(torch.randn(4, 8)).sum().backward(); optimizer.step()\n"
)


def _shown(shared_node, job_ids) -> dict[int, dict]:
    """Each job's ``gq show --json`` as root, from one interpreter that calls the CLI's entry
    point once a job: an interpreter started for each cost about 0.12 s of CPU and of wall,
    some 12 s of this test."""
    script = (
        "import sys\nfrom gq.cli.main import main\n"
        "for job in sys.argv[1:]:\n    if main(['show', '--json', job]):\n        sys.exit(1)\n"
    )
    ids = list(job_ids)
    done = subprocess.run(
        [shared_node.install.python, "-c", script, *map(str, ids)],
        env=shared_node.env,
        cwd=shared_node.root.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    decoder, shown, at = json.JSONDecoder(), [], 0
    while done.stdout[at:].strip():
        at = len(done.stdout) - len(done.stdout[at:].lstrip())
        history, at = decoder.raw_decode(done.stdout, at)
        shown.append(history if isinstance(history, dict) else history[0])
    assert len(shown) == len(ids), done.stdout[-2000:]
    return dict(zip(ids, shown, strict=True))


@pytest.fixture(scope="session")
def torch_for_all(shared_install):
    """torch in the interpreter every user can run (the shared install leaves it out)."""
    # (found, not imported: importing it costs about 2 s of CPU)
    found = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"
    with shared_install.building():
        probe = subprocess.run([shared_install.python, "-c", found], capture_output=True)
        if probe.returncode != 0:
            install_from_here(shared_install.python, ["torch"])
    return shared_install.python


@pytest.mark.long
def test_two_users_jobs_survive_daemon_kills_and_a_host_kill(shared_node, users, torch_for_all):
    rng = random.Random(20261122)
    alice, bob = users["alice"], users["bob"]
    scripts = {}
    for user in (alice, bob):
        scripts[user.name] = {
            "sh": _script(user, "job.sh", SHELL),
            "steps": _script(user, "steps.py", STEPS),
            "torch": _script(user, "train_linear.py", TORCH),
            "until": _script(user, "until.sh", UNTIL_HOST_KILLED),
        }

    def plan(user) -> list[list[str]]:
        """Each job's submit arguments; a script's first argument is its exit code."""
        mine = scripts[user.name]
        jobs = []
        for index in range(40):
            extra = ["--requeue"] if index % 5 == 0 else []
            jobs.append(
                [*extra, mine[rng.choice(["sh", "sh", "steps"])], str(rng.choice([0, 0, 0, 3]))]
            )
        if user is alice:
            jobs.insert(20, ["--requeue", mine["until"]])
        return jobs + [["--python", torch_for_all, mine["torch"]], ["--array", "0-4", mine["sh"]]]

    planned = {user.name: plan(user) for user in (alice, bob)}
    problems: list[BaseException] = []

    def submit(user, *args) -> int:
        """A submit whose answer a daemon kill lost fails (exit 1); the user tries again
        once the daemon answers (the first may have been queued: both are then jobs)."""
        for _ in range(5):
            result = shared_node.run(user, "submit", "--parsable", *args)
            if result.code == 0:
                return int(result.out)
            assert result.code == 1, result.err
        raise AssertionError(f"submit {args} kept failing: {result.err}")

    def submit_all(user):
        try:
            for args in planned[user.name]:
                if stopped.is_set():
                    return
                submit(user, *args)
            first = submit(user, scripts[user.name]["sh"], "0")
            second = submit(user, "--dependency", f"afterok:{first}", scripts[user.name]["sh"])
            submit(user, "--after", str(second), scripts[user.name]["sh"])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            problems.append(exc)

    def finished() -> int:
        assert not problems, problems
        jobs = json.loads(shared_node.ok(None, "status", "--all", "--limit", "0", "-r", "--json"))
        return sum(j["state"] in ENDED for j in jobs)

    def kill_daemon() -> None:
        os.kill(int((shared_node.root / "daemon.pid").read_text()), signal.SIGKILL)
        wait_for(
            lambda: shared_node.run(None, "daemon", "status").code == 1,
            10,
            what="the daemon to die",
        )
        shared_node.start()

    def kill_host() -> None:
        """While it runs the job that waits for it (the others may be too short to be
        caught running); that job's rerun then ends."""
        wait_for(
            lambda: any(
                j["state"] == "RUNNING" and j["name"] == "until.sh"
                for j in json.loads(shared_node.ok(None, "status", "--json"))
            ),
            120,
            interval=0.05,
            what="the job that waits for the host kill to run",
        )
        pid = int((shared_node.root / "hosts" / "cpu.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not pid_alive(pid), 10, what="the host to die")
        (alice.workdir / "host-killed").touch()

    stopped = threading.Event()  # a failing test stops its submitters with it
    threads = [
        threading.Thread(target=submit_all, args=(user,), daemon=True) for user in (alice, bob)
    ]
    for thread in threads:
        thread.start()
    try:
        for threshold, act in (
            (5, kill_daemon),
            (30, kill_host),
            (45, kill_daemon),
            (70, kill_daemon),
        ):
            wait_for(
                lambda t=threshold: finished() >= t,
                300,
                interval=0.3,
                what=f"{threshold} jobs to finish",
            )
            act()
        for thread in threads:
            thread.join(timeout=300)
    finally:
        stopped.set()
    assert not problems, problems
    total = len(json.loads(shared_node.ok(None, "status", "--all", "--limit", "0", "-r", "--json")))
    assert total >= 2 * 48 + 1  # 42 jobs, 5 array tasks and 3 in a chain each; one more
    wait_for(lambda: finished() == total, 300, interval=0.5, what="every job to end")

    jobs = {
        j["id"]: j
        for j in json.loads(shared_node.ok(None, "status", "--all", "--limit", "0", "-r", "--json"))
    }
    histories = _shown(shared_node, jobs)
    users_by_name = {user.name: user for user in (alice, bob)}
    starts = Counter()
    for user in (alice, bob):
        starts.update(int(line) for line in (user.workdir / "starts").read_text().split())
    host_victims = 0
    for job_id, info in jobs.items():
        assert info["state"] in ENDED, info
        assert info["user"] in users_by_name
        history = histories[job_id]
        reasons = " ".join(e["reason"] or "" for e in history["events"])
        # Never twice for one run; a run its host took down may have died before its mark.
        assert starts[job_id] <= info["run_count"], (job_id, starts[job_id], history["events"])
        if any(why in reasons for why in HOST_DEATH):
            host_victims += 1
            if info["requeue"]:
                assert info["run_count"] == 2 and "requeued" in reasons, history["events"]
            else:
                assert info["state"] == "FAILED" and info["reason"] in HOST_DEATH, info
            continue
        assert starts[job_id] == info["run_count"] <= 1, (job_id, history["events"])
        if info["dependency"] and info["state"] == "CANCELLED":
            assert info["reason"] == "DependencyNeverSatisfied", info
            continue
        code = int(history["args"][0]) if history["args"] else 0  # the script's exit code
        output = users_by_name[info["user"]].workdir / f"gq-{job_id}.out"
        assert (info["state"], info["exit_code"]) == (
            ("COMPLETED", 0) if code == 0 else ("FAILED", code)
        ), (info, output.read_text())
    assert host_victims >= 1, "the host was killed with no job on it"
