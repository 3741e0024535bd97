"""One user cannot hurt the node, on a shared node: a root system daemon, throwaway users,
the CLI run as them. Files are opened with their owner's rights, never root's; limits and
promises hold against the owners themselves; nothing runs as root by accident."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess

from test_shared_node import _script, _submit, assert_refused

from conftest import wait_for


def test_logs_open_output_with_the_owners_rights_never_roots(shared_node, users):
    alice, carol = users["alice"], users["carol"]
    closed = shared_node.root.parent / "closed"
    closed.mkdir(mode=0o700)
    (closed / "exists.out").write_text("root's secret\n")
    script = _script(alice, "w.sh", "echo mine\n")
    jobs = {
        name: _submit(shared_node, alice, "-o", str(closed / name), script)
        for name in ("exists.out", "missing.out")
    }
    for job_id in jobs.values():
        info = shared_node.wait_state(job_id, "FAILED")
        assert "Permission denied" in info["reason"], info["reason"]
        for reader in (alice, carol):  # the owner, and an operator acting for her
            result = shared_node.run(reader, "logs", job_id)
            assert_refused(result, "Permission denied")  # the same whether it exists or not
            assert "secret" not in result.out + result.err
    readable = _submit(shared_node, alice, script)
    shared_node.wait_state(readable, "COMPLETED")
    assert shared_node.ok(carol, "logs", readable) == "mine\n"  # opened as alice, passed on
    assert shared_node.ok(alice, "logs", readable) == "mine\n"  # opened by alice herself


def test_only_operators_raise_a_time_limit_or_a_priority(shared_node, users):
    alice, carol = users["alice"], users["carol"]
    job_id = _submit(
        shared_node,
        alice,
        "--hold",
        "-t",
        "10:00",
        "--priority",
        "2",
        _script(alice, "s.sh", "true\n"),
    )
    assert_refused(
        shared_node.run(alice, "update", job_id, "-t", "20:00"),
        "only an operator may raise",
        "--time",
    )
    assert_refused(
        shared_node.run(alice, "update", job_id, "--priority", "3"),
        "only an operator may raise",
        "--priority",
    )
    shared_node.ok(alice, "update", job_id, "-t", "5:00", "--priority", "1")  # lowering
    assert (shared_node.job(job_id)["time_limit"], shared_node.job(job_id)["priority"]) == (300, 1)
    shared_node.ok(carol, "update", job_id, "-t", "1:00:00", "--priority", "4")
    assert (shared_node.job(job_id)["time_limit"], shared_node.job(job_id)["priority"]) == (3600, 4)
    shared_node.ok(alice, "cancel", job_id)


def test_a_job_that_names_no_owner_is_never_run_as_root(shared_node, users):
    alice = users["alice"]
    marker = shared_node.root.parent / "ran-as-root"
    job_id = _submit(shared_node, alice, "--hold", _script(alice, "m.sh", f"touch {marker}\n"))
    db = sqlite3.connect(shared_node.root / "gq.db", timeout=30, isolation_level=None)
    db.execute("UPDATE jobs SET uid = NULL WHERE id = ?", (job_id,))  # an older gq's row
    db.close()
    shared_node.ok(None, "release", job_id)
    info = shared_node.wait_state(job_id, "FAILED")
    assert "names no submitter uid and gid; refusing to run it as root" in info["reason"]
    assert not marker.exists()


def test_nobody_but_root_can_hold_the_daemons_lock(shared_node, users):
    alice = users["alice"]
    pidfile = shared_node.root / "daemon.pid"
    assert stat.S_IMODE(pidfile.stat().st_mode) == 0o600
    grab = (
        "import fcntl, sys\n"
        "try:\n    f = open(sys.argv[1])\nexcept PermissionError:\n    sys.exit(7)\n"
        "fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
    )
    tried = subprocess.run(
        ["runuser", "-u", alice.name, "--", shared_node.install.python, "-c", grab, str(pidfile)],
        capture_output=True,
    )
    assert tried.returncode == 7, tried.stderr
    result = shared_node.run(alice, "daemon", "status")  # answered by the daemon itself
    assert result.code == 0 and "is running" in result.out


def test_one_users_idle_connections_cost_another_user_nothing(shared_node, users):
    alice, bob = users["alice"], users["bob"]
    shared_node.run(None, "daemon", "stop")
    shared_node.start("--max-connections-per-user", "8")
    hold = (
        "import socket, sys, time\n"
        "socks = []\n"
        "for _ in range(40):\n"
        "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); socks.append(s)\n"
        "print('connected', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [
            "runuser",
            "-u",
            alice.name,
            "--",
            shared_node.install.python,
            "-c",
            hold,
            str(shared_node.root / "gq.sock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "connected"
        refused = shared_node.run(alice, "status")
        assert refused.code == 1 and "has 8 connections to the daemon open" in refused.err
        assert shared_node.ok(bob, "status").startswith("JOBID")
        info = json.loads(shared_node.ok(bob, "info", "--json"))
        assert info["limits"]["max_connections_per_user"] == 8
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    wait_for(
        lambda: shared_node.run(alice, "status").code == 0,
        15,
        what="alice to be served once her connections closed",
    )
    assert os.path.exists(shared_node.root / "gq.sock")


def test_an_operators_hold_is_released_by_an_operator_only(shared_node, users):
    """As Slurm's admin hold: carol (an operator) holds alice's job; alice cannot release
    it, carol can. Alice's own hold stays hers to release."""
    alice, carol = users["alice"], users["carol"]
    mine = _submit(shared_node, alice, "--hold", _script(alice, "h.sh", "true\n"))
    assert shared_node.job(mine)["reason"] == "JobHeldUser"
    held = _submit(shared_node, alice, "--hold", _script(alice, "h2.sh", "true\n"))
    shared_node.ok(carol, "hold", held)  # held by alice already: now an operator's hold
    assert shared_node.job(held)["reason"] == "JobHeldAdmin"
    assert_refused(shared_node.run(alice, "release", held), "held by an operator")
    shared_node.ok(alice, "hold", held)  # her own hold on it changes nothing
    assert shared_node.job(held)["reason"] == "JobHeldAdmin"
    assert_refused(shared_node.run(alice, "release", held), "held by an operator")
    assert shared_node.job(held)["held"] is True
    shared_node.ok(alice, "release", mine)
    shared_node.ok(carol, "release", held)
    for job_id in (mine, held):
        shared_node.wait_state(job_id, "COMPLETED")


def test_a_snapshot_is_roots_out_of_reach_of_its_user_and_read_by_the_job(shared_node, users):
    """A snapshot its user owned could be made writable and grown after submit, to
    gigabytes on the node's state disk, past --max-spool; and another user who guessed its
    path could read it. Now it is root's, in a directory closed to everyone, and the job
    reads it through the descriptor its host opened: Python and shell jobs alike, with
    their script named as submitted."""
    alice, bob = users["alice"], users["bob"]
    shell = _script(alice, "launch.sh", '#!/bin/bash\ncd "$(dirname "$0")" && cat beside.txt\n')
    (alice.workdir / "beside.txt").write_text("found beside\n")
    python = _script(alice, "t.py", "import sys; print('argv0', sys.argv[0])\n")
    held = _submit(shared_node, alice, "--hold", str(shell))
    snapshot = shared_node.root / "spool" / str(held) / "launch.sh"
    assert snapshot.stat().st_uid == 0 and stat.S_IMODE(snapshot.parent.stat().st_mode) == 0o700
    for user in (alice, bob):
        tried = subprocess.run(
            [
                "runuser",
                "-u",
                user.name,
                "--",
                "sh",
                "-c",
                f"echo more >> {snapshot} || cat {snapshot}",
            ],
            capture_output=True,
            text=True,
        )
        assert tried.returncode != 0 and "Permission denied" in tried.stderr
    assert snapshot.read_text() == shell.read_text()
    shared_node.ok(alice, "release", held)
    assert shared_node.wait_state(held, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (alice.workdir / f"gq-{held}.out").read_text() == "found beside\n"
    ran = _submit(shared_node, alice, str(python))
    assert shared_node.wait_state(ran, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (alice.workdir / f"gq-{ran}.out").read_text() == f"argv0 {python}\n"
