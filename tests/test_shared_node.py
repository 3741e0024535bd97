"""One node, many users: a system daemon run by root, the CLI run as throwaway users, jobs
run as their submitters. Skipped (with the reason) when not root."""

from __future__ import annotations

import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import pid_alive, wait_for, write_script


def _script(user, name: str, body: str):
    path = write_script(user.workdir / name, body)
    os.chown(path, user.uid, user.gid)
    return path


def _submit(node, user, *args) -> int:
    return int(node.ok(user, "submit", "--parsable", *args).strip())


def assert_refused(result, *fragments: str) -> None:
    assert result.code == 2, (result.code, result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gq: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_job_runs_as_its_submitter_with_its_groups_umask_and_home(shared_node, users):
    alice = users["alice"]
    script = _script(
        alice,
        "who.sh",
        "id -u; id -g; umask; echo $HOME $USER; pwd; touch made\n"
        "srun id -u; echo $SLURM_JOB_USER $SLURM_JOB_UID\n",
    )
    job_id = _submit(shared_node, alice, "--notify", "id -u > hooked; echo $HOME >> hooked", script)
    info = shared_node.wait_state(job_id, "COMPLETED")
    assert (info["user"], info["uid"]) == (alice.name, alice.uid)
    hooked = alice.workdir / "hooked"  # its --notify ran as alice, in her directory
    wait_for(
        lambda: hooked.exists() and len(hooked.read_text().splitlines()) == 2,
        15,
        what="the --notify hook",
    )
    assert hooked.read_text().split() == [str(alice.uid), str(alice.workdir.parent)]
    assert hooked.stat().st_uid == alice.uid
    out = alice.workdir / f"gq-{job_id}.out"
    lines = out.read_text().split("\n")
    assert lines[0] == str(alice.uid) and lines[1] == str(alice.gid)
    assert lines[2] == "0022"
    assert lines[3] == f"{alice.workdir.parent} {alice.name}"  # the home useradd made
    assert lines[4] == str(alice.workdir)
    # gq's srun, which every user's job reaches, runs as the job's user too.
    assert lines[5:7] == [str(alice.uid), f"{alice.name} {alice.uid}"]
    for made in (out, alice.workdir / "made"):
        assert (made.stat().st_uid, made.stat().st_gid) == (alice.uid, alice.gid)


def test_system_state_permissions(shared_node, users):
    alice = users["alice"]
    first = shared_node.run(
        alice, "submit", "--parsable", "--hold", _script(alice, "s.sh", "true\n")
    )
    assert (first.code, first.err) == (0, "")  # no personal daemon started, none said
    job_id = int(first.out)
    root = shared_node.root
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(root) == 0o755 and mode(root / "gq.db") == 0o600
    assert mode(root / "gq.sock") == 0o666 and mode(root / "spool") == 0o711
    snapshot = root / "spool" / str(job_id) / "s.sh"
    # root's, in a directory closed to all: the job gets it as a descriptor from its host
    assert mode(snapshot) == 0o555 and snapshot.stat().st_uid == 0
    assert (root / "spool" / str(job_id)).stat().st_uid == 0
    assert mode(root / "spool" / str(job_id)) == 0o700
    shared_node.ok(None, "cancel", job_id)


def test_others_cannot_act_on_a_job_but_its_owner_operators_and_root_can(shared_node, users):
    alice, bob, carol = users["alice"], users["bob"], users["carol"]
    job_id = _submit(
        shared_node, alice, "--priority", "1", _script(alice, "long.sh", "sleep 300\n")
    )
    shared_node.wait_state(job_id, "RUNNING")
    for args, verb in (
        (["cancel", job_id], "cancel"),
        (["hold", job_id], "hold"),
        (["update", job_id, "--priority", "0"], "update"),
        (["requeue", job_id], "requeue"),
        (["logs", job_id], "read the logs of"),
        (["export", "slurm", job_id], "export"),
    ):
        result = shared_node.run(bob, *args)
        assert_refused(result, f"job {job_id} belongs to {alice.name}", verb)
    assert_refused(shared_node.run(bob, "cancel", "--user", alice.name), "only an operator")
    shared_node.run(bob, "cancel", "--state", "R")  # a filter reaches only bob's own jobs
    info = shared_node.job(job_id)
    assert (info["state"], info["priority"], info["run_count"]) == ("RUNNING", 1, 1)
    assert str(job_id) in shared_node.ok(bob, "status")  # anyone may list the queue
    assert "long.sh" in shared_node.ok(alice, "export", "slurm", job_id)  # her script, in place
    shared_node.ok(carol, "update", job_id, "--priority", "3")  # an operator by group
    assert shared_node.job(job_id)["priority"] == 3
    shared_node.ok(None, "cancel", job_id)  # root
    assert shared_node.wait_state(job_id, "CANCELLED")["reason"] == "cancelled by user"


def test_an_operators_stop_returns_once_the_system_daemon_has_exited(shared_node, users):
    pidfile = shared_node.root / "daemon.pid"
    pid = int(pidfile.read_text())
    said = shared_node.ok(users["carol"], "daemon", "stop").splitlines()  # its lock is root's
    assert not pid_alive(pid), "gq daemon stop returned while the daemon still ran"
    assert said[-1] == f"gq daemon stopped (pid {pid})" and not pidfile.exists()
    assert shared_node.run(None, "daemon", "status").code == 1


def test_only_operators_change_the_node_and_raise_priorities(shared_node, users):
    alice, bob = users["alice"], users["bob"]
    assert_refused(shared_node.run(bob, "policy", "set", "srtf"), "only an operator")
    assert shared_node.ok(bob, "policy").startswith("fifo")
    assert_refused(shared_node.run(bob, "daemon", "stop"), "only an operator")
    assert_refused(shared_node.run(bob, "drain", "--reason", "mine"), "only an operator")
    assert_refused(shared_node.run(bob, "resume"), "only an operator")
    assert_refused(shared_node.run(bob, "suspend", "1"), "only an operator")
    assert shared_node.run(None, "daemon", "status").code == 0
    script = _script(alice, "p.sh", "true\n")
    assert_refused(shared_node.run(alice, "submit", "--priority", "9", script), "cap of 5")
    assert "[]" == shared_node.ok(None, "status", "--all", "--json").strip()
    job_id = _submit(shared_node, alice, "--hold", "--priority", "5", script)
    shared_node.ok(alice, "update", job_id, "--priority", "2")  # lowering is always allowed
    assert_refused(
        shared_node.run(alice, "update", job_id, "--priority", "7"), "only an operator may raise"
    )
    assert shared_node.job(job_id)["priority"] == 2
    shared_node.ok(None, "update", job_id, "--priority", "50")  # root may
    shared_node.ok(None, "policy", "set", "srtf")
    assert shared_node.ok(alice, "policy").startswith("srtf")
    shared_node.ok(alice, "cancel", job_id)


def test_the_daemon_never_reads_a_users_path_with_roots_rights(shared_node, users):
    bob = users["bob"]
    secret = shared_node.root.parent / "secret.sh"
    write_script(secret, "echo root-only\n", mode=0o600)
    for path in ("/etc/shadow", str(secret)):
        assert_refused(shared_node.run(bob, "submit", path), "cannot read script")
    assert shared_node.ok(None, "status", "--all", "--json").strip() == "[]"


def test_a_link_planted_at_the_output_path_is_not_followed(shared_node, users):
    alice = users["alice"]
    victim = shared_node.root.parent / "victim.txt"
    victim.write_text("untouched\n")
    victim.chmod(0o666)  # even a file alice could write is not reached through the link
    (alice.workdir / "out.txt").symlink_to(victim)
    job_id = _submit(shared_node, alice, "-o", "out.txt", _script(alice, "w.sh", "echo pwned\n"))
    info = shared_node.wait_state(job_id, "FAILED")
    assert "symbolic link" in info["reason"], info["reason"]
    assert victim.read_text() == "untouched\n"


@pytest.mark.long
def test_two_users_hundred_concurrent_submits_each_lose_nothing(shared_node, users):
    alice, bob = users["alice"], users["bob"]
    scripts = {u.name: _script(u, "n.sh", "true\n") for u in (alice, bob)}

    def one(user):
        return user.name, _submit(shared_node, user, "--hold", scripts[user.name])

    with ThreadPoolExecutor(max_workers=12) as pool:
        submitted = list(pool.map(one, [alice, bob] * 100))
    ids = [job_id for _, job_id in submitted]
    assert len(set(ids)) == 200
    import json

    jobs = {j["id"]: j for j in json.loads(shared_node.ok(None, "status", "--json"))}
    assert sorted(jobs) == sorted(ids)
    assert all(jobs[job_id]["user"] == name for name, job_id in submitted)
    assert sum(j["user"] == alice.name for j in jobs.values()) == 100
    shared_node.ok(None, "cancel", "--state", "PD")
    assert shared_node.ok(None, "status").strip().count("\n") == 0


@pytest.mark.long
def test_fair_shares_the_node_between_kernel_reported_users(shared_node, users):
    """Two jobs of alice and one of bob under fair: bob's one job gets as much device time
    as alice's two together, because the users come from SO_PEERCRED."""
    alice, bob = users["alice"], users["bob"]
    shared_node.ok(None, "policy", "set", "fair")
    # Each job writes when each of its iterations ran: the shares are read from what ran,
    # not from progress sampled through status calls, which a loaded machine spaces out.
    body = (
        "import gq, json, os, time\n"
        "while not os.path.exists('go'): time.sleep(0.01)\n"
        "spans = []\n"
        "for _ in gq.steps(range(500), total=500):\n"
        "    begin = time.monotonic()\n"
        "    time.sleep(0.004)\n"
        "    spans.append((begin, time.monotonic()))\n"
        "with open(f\"spans-{os.environ['GQ_JOB_ID']}\", 'w') as out:\n"
        "    json.dump(spans, out)\n"
    )
    start = {u.name: u.workdir / "go" for u in (alice, bob)}
    owners = [alice, alice, bob]
    # Declared: a job that declares nothing has its lane to itself until its probe ends,
    # and each waits for its start file before its first iteration.
    ids = [
        _submit(shared_node, owner, "--gpu-mem", "200M", _script(owner, "f.py", body))
        for owner in owners
    ]
    for job_id in ids:
        shared_node.wait_state(job_id, "RUNNING")
    for path in start.values():
        path.touch()
    for job_id in ids:
        assert shared_node.wait_state(job_id, "COMPLETED", timeout=60)["attained"] >= 1.8
    spans = [
        json.loads((owner.workdir / f"spans-{job_id}").read_text())
        for owner, job_id in zip(owners, ids)
    ]
    # While all three ran (from the last one's first iteration to the first one's end):
    # bob's one job had as much of the lane as alice's two together.
    since, until = max(s[0][0] for s in spans), min(s[-1][1] for s in spans)
    assert until - since > 1.0, (since, until)  # 500 x 4 ms each: about 4 s of the 6

    def inside(job_spans) -> float:
        return sum(max(0.0, min(end, until) - max(begin, since)) for begin, end in job_spans)

    a, b = inside(spans[0]) + inside(spans[1]), inside(spans[2])
    assert abs(a - b) <= 0.25 * max(a, b) + 0.01, (a, b)  # within two iterations and 25 %


def test_system_daemon_kill9_keeps_users_jobs_and_a_cancel_waits_for_its_return(shared_node, users):
    alice = users["alice"]
    train = _script(
        alice,
        "t.py",
        "import gq, time\n"
        "for _ in gq.steps(range(150), total=150):\n    time.sleep(0.01)\n"
        "print('trained', flush=True)\n",
    )
    trained = _submit(shared_node, alice, train)
    sleeper = _submit(shared_node, alice, _script(alice, "s.sh", "sleep 300\n"))
    worker = wait_for(lambda: shared_node.job(trained)["pid"], 30, what="the training job")
    wait_for(lambda: shared_node.job(sleeper)["pid"], 30, what="the sleeping job")
    os.kill(int((shared_node.root / "daemon.pid").read_text()), 9)
    wait_for(
        lambda: shared_node.run(None, "daemon", "status").code == 1,
        10,
        what="the system daemon to die",
    )
    with ThreadPoolExecutor(max_workers=1) as pool:
        cancel = pool.submit(shared_node.run, alice, "cancel", sleeper)  # waits for the daemon
        shared_node.start()
        result = cancel.result(timeout=60)
    assert result.code == 0 and f"Cancelling job {sleeper}" in result.out, result.err
    assert shared_node.wait_state(sleeper, "CANCELLED")["run_count"] == 1
    info = shared_node.wait_state(trained, "COMPLETED", timeout=60)
    assert (info["run_count"], info["pid"], info["steps_done"]) == (1, worker, 150)
    assert (info["user"], info["uid"]) == (alice.name, alice.uid)
    assert (alice.workdir / f"gq-{trained}.out").read_text() == "trained\n"
