"""--max-pids: each job's cgroup holds at most that many tasks (processes and threads), so a
fork bomb's forks fail in its own job and nobody else on the node notices. On a shared node
(a root system daemon, throwaway users); where no pids controller serves the jobs' cgroups,
gq info and the daemon's log say that the limit is not enforced."""

from __future__ import annotations

import json
import time

import psutil
import pytest
from test_shared_node import _script, _submit

from conftest import DaemonControl, cgroups_usable, gq, gq_ok, wait_for

LIMIT = 64
MARKER = "gq-test-fork-bomb"  # in the bomb's command line: its processes are found by it
# Every process forks on without end; a fork the kernel refuses (EAGAIN) is said once per
# process and tried again a little later (the pause spares the test machine's few cores: the
# bomb still holds every task its limit allows, and asks for more five times a second).
BOMB = (
    "import errno, os, time\n"
    "told = False\n"
    "while True:\n"
    "    try:\n"
    "        os.fork()\n"
    "    except OSError as error:\n"
    "        if error.errno != errno.EAGAIN:\n"
    "            raise\n"
    "        if not told:\n"
    "            told = True\n"
    "            os.write(1, b'fork refused: EAGAIN\\n')\n"
    "        time.sleep(0.2)\n"
)


def _shown(node, user, job_id: int) -> dict:
    """The job as its owner's gq show --json has it, its tasks never over the limit."""
    info = json.loads(node.ok(user, "show", "--json", job_id))
    if info["pids_current"] is not None:
        assert info["pids_max"] == LIMIT, info
        assert info["pids_current"] <= LIMIT, info
    return info


def _bomb_processes(uid: int) -> list[int]:
    found = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        uids, cmdline = process.info["uids"], process.info["cmdline"] or []
        if uids is not None and uids.real == uid and MARKER in cmdline:
            found.append(process.pid)
    return found


def test_a_fork_bomb_ends_only_its_own_job(shared_node, users):
    alice, bob = users["alice"], users["bob"]
    shared_node.run(None, "daemon", "stop")
    shared_node.ok(
        None, "daemon", "start", "--system", "--kill-wait", "1", "--max-pids", str(LIMIT)
    )
    if json.loads(shared_node.ok(bob, "info", "--json"))["limits"]["max_pids"] is None:
        pytest.skip("no pids controller serves the jobs' cgroups here")
    assert f"at most {LIMIT} tasks each" in shared_node.ok(bob, "info")
    bomb = _submit(
        shared_node,
        alice,
        _script(alice, "bomb.sh", f'exec /usr/bin/python3 -I -S -c "{BOMB}" {MARKER}\n'),
    )
    hit = wait_for(
        lambda: (info := _shown(shared_node, alice, bomb))["pids_refused"] and info,
        30,
        what="the bomb to reach its limit",
    )
    assert hit["state"] == "RUNNING" and hit["pids_current"] > LIMIT // 2
    # While the bomb holds every task it may: the daemon answers, another user's job starts
    # (its host forks it) and forks as it pleases.
    began = time.monotonic()
    assert shared_node.ok(bob, "status").startswith("JOBID")
    assert time.monotonic() - began < 10
    forks = "total=0\nfor i in $(seq 1 30); do total=$(expr $total + $i); done\n"
    honest = _submit(shared_node, bob, _script(bob, "sum.sh", forks + "echo sum=$total\n"))
    done = shared_node.wait_state(honest, "COMPLETED", "FAILED", "CANCELLED", timeout=60)
    assert (done["state"], done["exit_code"]) == ("COMPLETED", 0)
    assert (bob.workdir / f"gq-{honest}.out").read_text() == "sum=465\n"
    still = _shown(shared_node, alice, bomb)
    assert still["state"] == "RUNNING" and still["pids_refused"] >= hit["pids_refused"]
    assert "forks refused at the limit" in shared_node.ok(alice, "show", bomb)
    assert _bomb_processes(alice.uid)

    shared_node.ok(alice, "cancel", bomb)
    assert shared_node.wait_state(bomb, "CANCELLED", timeout=30)["state"] == "CANCELLED"
    wait_for(lambda: not _bomb_processes(alice.uid), 15, what="the bomb's processes to go")
    said = (alice.workdir / f"gq-{bomb}.out").read_text().splitlines()
    assert "fork refused: EAGAIN" in said


def test_bad_max_pids_values_are_refused_and_start_nothing(home):
    for value, words in (
        ("0", "--max-pids 0: give a whole number from 1 to 4194304"),
        ("-5", "--max-pids -5: give a whole number from 1 to 4194304"),
        (str(2**70), f"--max-pids {2**70}: give a whole number"),
        ("4194305", "--max-pids 4194305: give a whole number"),
        ("many", "Invalid value for '--max-pids': 'many' is not a valid int"),
        ("nan", "Invalid value for '--max-pids': 'nan' is not a valid int"),
        ("", "Invalid value for '--max-pids'"),
    ):
        result = gq("daemon", "start", "--max-pids", value)
        assert result.code == 2 and words in result.err, (value, result.err)
        assert result.err.count("\n") == 1 and result.err.startswith("gq: error: "), result.err
    assert not (home / "daemon.pid").exists()
    assert gq("daemon", "status").code == 1


def test_info_says_where_a_jobs_tasks_are_not_limited(home):
    """Without cgroups (--cgroup off) nothing holds --max-pids: gq info says so, and so does
    the daemon's log; RLIMIT_NPROC is never the fallback (it counts the user's every
    process, their other work too)."""
    control = DaemonControl(home)
    control.start("--cgroup", "off", "--max-pids", "100")
    limits = json.loads(gq_ok("info", "--json"))["limits"]
    assert (limits["max_pids"], limits["node_pids"]) == (None, None)
    assert "no limit on a job's tasks" in limits["containment"]
    assert "no limit on a job's tasks" in gq_ok("info")
    assert "--max-pids 100 is not enforced here" in control.log()
    assert "--max-pids" in json.loads(gq_ok("info", "--json"))["options"]
    control.stop()
    if not cgroups_usable("auto"):
        return
    control.start("--max-pids", "100")
    limits = json.loads(gq_ok("info", "--json"))["limits"]
    if limits["max_pids"] is not None:
        assert limits["max_pids"] == 100 and 0 < limits["node_pids"] < 1 << 22
        assert "at most 100 tasks each" in gq_ok("info")
    else:
        assert "without its pids controller" in limits["containment"]
    control.stop()
