"""One user's listings must not slow everyone's: on a shared node (a root system daemon, a
throwaway user), a user who asks for many listings at once waits behind root's `gq status`,
not the other way round. Big listings are made off the daemon's loop, one of a user's at a
time; requests ready together are served in turns, the caller that has used the least of
the loop first. The order in which answers begin is what is asserted, never a duration.
Also: a listing lists the same jobs whether it is made in the loop or apart, and the pure
order of turns (gq.daemon.serving.turns)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from test_month_of_jobs import _copies_of as copies_of
from test_shared_node import _script, _submit

from gq import defaults
from gq.daemon.serving.turns import Turns

from conftest import gq_ok, submit, wait_state, write_script

# Run as the flooding user: COUNT connections, each sending one listing of every pending
# task, all sent before it says so; then when each answer began (or its connection was
# closed), on the monotonic clock every process shares, and how many jobs each listed.
FLOOD = r"""
import json, socket, sys, threading, time
path, count, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
line = json.dumps({"v": version, "kind": "list", "states": ["PENDING"],
                   "array_tasks": True}).encode() + b"\n"
socks = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(line)
    socks.append(s)
print("sent", flush=True)
began, answers = [None] * count, [b""] * count
def read(i):
    chunks = [socks[i].recv(1 << 16)]
    began[i] = time.monotonic()
    while chunks[-1] and not chunks[-1].endswith(b"\n"):
        chunks.append(socks[i].recv(1 << 20))
    answers[i] = b"".join(chunks)
readers = [threading.Thread(target=read, args=(i,)) for i in range(count)]
for reader in readers:
    reader.start()
for reader in readers:
    reader.join()
listed = []
for answer in answers:
    try:
        listed.append(len(json.loads(answer)["jobs"]))
    except (ValueError, KeyError):
        listed.append(answer[:200].decode(errors="replace"))
print(json.dumps({"began": began, "listed": listed}), flush=True)
"""


def _flood(shared_node, user, count: int) -> subprocess.Popen:
    """The user's flood of listings, once every request of it is sent."""
    flood = subprocess.Popen(
        [
            "runuser",
            "-u",
            user.name,
            "--",
            shared_node.install.python,
            "-c",
            FLOOD,
            str(shared_node.root / "gq.sock"),
            str(count),
            str(defaults.PROTOCOL_VERSION),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert flood.stdout.readline().strip() == "sent"
    return flood


def _outcome(flood: subprocess.Popen) -> dict:
    out, _ = flood.communicate(timeout=120)
    assert flood.returncode == 0
    return json.loads(out)


def _held_array(shared_node, user, tasks: int) -> int:
    return _submit(
        shared_node, user, "--hold", "--array", f"0-{tasks - 1}", _script(user, "t.sh", "true\n")
    )


def test_a_users_flood_of_big_listings_waits_behind_roots_status(shared_node, users):
    """Ten listings of 4,000 tasks each (the request `gq status -r --json` sends), all sent
    before root asks: made in the loop, each in turn, root's `gq status` was answered after
    every one of them had begun; made in children, one of hers at a time, it is answered
    while most of hers wait, and hers are all answered in full afterwards."""
    alice = users["alice"]
    tasks, count = 4000, 10
    array = _held_array(shared_node, alice, tasks)
    flood = _flood(shared_node, alice, count)
    status = shared_node.run(None, "status")
    answered = time.monotonic()
    outcome = _outcome(flood)

    assert status.code == 0, status.err
    assert [line.split()[0] for line in status.out.splitlines()[1:]] == [f"{array}_[0-{tasks - 1}]"]
    begun = sum(began < answered for began in outcome["began"])
    assert begun <= count - 5, f"{begun} of alice's {count} listings began before root's"
    assert outcome["listed"] == [tasks] * count  # queued behind each other, none refused


def test_requests_ready_together_are_served_the_least_served_caller_first(shared_node, users):
    """Forty listings small enough to be made in the loop (150 tasks each), all sent
    before root asks: served in the order they came, root's was answered after all of
    hers; served in turns, it is answered after a few."""
    alice = users["alice"]
    tasks, count = 150, 40
    assert tasks <= defaults.LIST_INLINE
    _held_array(shared_node, alice, tasks)
    flood = _flood(shared_node, alice, count)
    answer = _ask_as_root(shared_node, {"kind": "list", "states": ["PENDING", "RUNNING"]})
    answered = time.monotonic()
    outcome = _outcome(flood)

    assert answer["kind"] == "jobs" and len(answer["jobs"]) == 1  # her tasks, folded
    begun = sum(began < answered for began in outcome["began"])
    assert begun <= count // 2, f"{begun} of alice's {count} listings began before root's"
    assert outcome["listed"] == [tasks] * count


def _ask_as_root(shared_node, request: dict) -> dict:
    """One request from this process (root), its answer read whole."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(shared_node.root / "gq.sock"))
        sock.sendall(json.dumps({"v": defaults.PROTOCOL_VERSION, **request}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            assert chunk, "the daemon closed root's connection without answering"
            data += chunk
    return json.loads(data)


def test_listings_either_side_of_the_inline_bound_list_the_same_jobs(daemon, tmp_path):
    """Up to ``LIST_INLINE`` records a listing is made in the loop, past it in a child; which
    it is, found reading one row past the bound of pending and of finished jobs alike, changes
    nothing of what is listed (pages of finished jobs are cut as before)."""
    script = write_script(tmp_path / "s.sh", "true\n")
    done = submit(str(script))
    wait_state(done, "COMPLETED")
    copies_of(daemon.root, done, 59)  # 60 completed, ended at the same time
    completed = list(range(done, done + 60))
    cancelled = [submit("--hold", str(script)) for _ in range(30)]
    gq_ok("cancel", *map(str, cancelled))  # 30 more finished, ended since
    tasks = defaults.LIST_INLINE - 50
    array = submit("--hold", "--array", f"0-{tasks - 1}", str(script))
    pending = list(range(array, array + tasks))
    ended_last = sorted(cancelled, reverse=True) + sorted(completed, reverse=True)

    def listed(*options: str) -> list[int]:
        return [entry["id"] for entry in json.loads(gq_ok("status", "--json", *options))]

    # (the room left for finished jobs beside the pending tasks is 50)
    for limit in (49, 50, 51, 89, 0):  # in the loop, at the bound, then in a child
        shown = ended_last[: limit or None]
        assert listed("--all", "-r", "--limit", str(limit)) == sorted(pending + shown), limit
    assert listed("-t", "CA,PD", "-r") == sorted(pending + cancelled)  # 30 fit: in the loop
    assert listed("-t", "CD,PD", "-r") == sorted(pending + completed)  # 60 do not
    assert listed("--all") == sorted([array, *completed, *cancelled])  # her tasks, folded


# ----- the order of turns, pure ----------------------------------------------------------


def test_a_caller_alone_is_served_in_the_order_it_asked():
    turns: Turns[str] = Turns(half_life=5.0)
    for item in ("a", "b", "c"):
        turns.add(7, item)
    turns.charge(7, 100.0, now=0.0)  # however much it has used: nobody else waits
    assert [turns.take(now=0.0) for _ in range(4)] == [(7, "a"), (7, "b"), (7, "c"), None]
    assert not turns and len(turns) == 0


def test_the_caller_that_used_least_of_the_loop_goes_first_then_arrival_order():
    turns: Turns[str] = Turns(half_life=5.0)
    turns.charge(1000, 2.0, now=0.0)  # a flooder
    turns.charge(0, 0.01, now=0.0)  # root, after a few status commands
    for index in range(3):
        turns.add(1000, f"flood{index}")
    turns.add(1001, "newcomer")  # never served: first, though it came after the flood
    turns.add(0, "status")
    assert turns.take(now=0.0) == (1001, "newcomer")
    assert turns.take(now=0.0) == (0, "status")
    assert turns.take(now=0.0) == (1000, "flood0")
    turns.add(2000, "late")
    assert turns.take(now=0.0) == (2000, "late")
    assert turns.take(now=0.0, skip={1000}) is None  # its child is busy, say
    assert len(turns) == 2 and turns.take(now=0.0) == (1000, "flood1")


def test_use_decays_with_the_half_life_and_callers_alike_keep_arrival_order():
    turns: Turns[str] = Turns(half_life=5.0)
    turns.charge(1, 4.0, now=0.0)
    turns.charge(2, 1.0, now=0.0)
    assert turns.used(1, now=5.0) == pytest.approx(2.0)
    assert turns.used(1, now=10.0) == pytest.approx(1.0)
    assert turns.used(2, now=10.0) == pytest.approx(0.25)
    assert turns.used(3, now=10.0) == 0.0
    turns.charge(2, 0.75, now=10.0)  # 0.25 left, and 0.75 more: level with uid 1
    turns.add(1, "first")
    turns.add(2, "second")
    assert [turns.take(now=10.0), turns.take(now=10.0)] == [(1, "first"), (2, "second")]
    turns.charge(5, -3.0, now=10.0)  # a clock that stepped back charges nothing
    assert turns.used(5, now=10.0) == 0.0


def test_an_item_removed_is_never_taken():
    turns: Turns[str] = Turns()
    turns.add(1, "gone")
    turns.add(1, "kept")
    turns.remove(1, "gone")
    turns.remove(1, "never added")
    turns.remove(9, "nobody's")
    assert [turns.take(now=0.0), turns.take(now=0.0)] == [(1, "kept"), None]


def test_a_callers_items_refused_by_keep_are_forgotten():
    turns: Turns[str] = Turns()
    for item in ("open", "closed", "open too"):
        turns.add(1, item)
    turns.add(2, "closed")  # another caller's: untouched
    turns.prune(1, keep=lambda item: item != "closed")
    turns.prune(3, keep=lambda item: False)  # a caller with nothing ready
    assert len(turns) == 3
    assert [turns.take(now=0.0) for _ in range(3)] == [(1, "open"), (1, "open too"), (2, "closed")]
    turns.add(1, "closed")
    turns.prune(1, keep=lambda item: False)
    assert not turns
