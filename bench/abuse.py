"""What one user's abuse costs another: a system daemon; a throwaway user who submits as
fast as a loop allows, keeps hundreds of idle connections open and fills their pending
limit; and the latency of root's `gq status` meanwhile, next to the same command on the
quiet node in the same run. Then the cost of one bulk verb: holding, releasing and
cancelling an array of 9,999 tasks. Then the user's flood of listings: with an array of
10,000 held tasks of theirs queued, 8 and then 16 threads each asking again and again for
every task (the request `gq status -r --json` sends: 12 MB an answer), and root's
`gq status` meanwhile, next to it with the same queue and no flood.

  sudo python bench/abuse.py [--seconds 20] [--connections 500] [--submitters 4]
  sudo python bench/abuse.py --listings-only [--listers 8,16]

Needs root (it makes a throwaway user and runs a system daemon). Prints one JSON object,
then a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gq.defaults import PROTOCOL_VERSION  # noqa: E402

from harness import percentile  # noqa: E402

# Run as the hostile user by Debian's python3 (standard library only): raw requests.
HOSTILE = r"""
import base64, json, socket, sys, threading, time
sock_path, script, workdir, seconds, connections, submitters, VERSION = sys.argv[1:8]
VERSION = int(VERSION)
seconds, connections, submitters = float(seconds), int(connections), int(submitters)
idle, refused_connections = [], 0
for _ in range(connections):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sock_path)
    except OSError:
        refused_connections += 1
        continue
    idle.append(s)
# A refused connection is answered with an error line at once; a kept one has nothing to
# read (checked now: the daemon drops idle clients after --client-timeout).
time.sleep(0.5)
kept = 0
for s in idle:
    try:
        s.recv(1, socket.MSG_DONTWAIT)
    except BlockingIOError:
        kept += 1
counts = {"accepted": 0, "refused_pending_limit": 0, "refused_connection_limit": 0,
          "refused_other": 0, "failed": 0}
lock = threading.Lock()
body = base64.b64encode(open(script, "rb").read()).decode()
line = json.dumps({"v": VERSION, "kind": "submit", "script_path": script, "script": body,
                   "args": [], "workdir": workdir, "env": {"PATH": "/usr/bin:/bin"},
                   "umask": 18, "options": {"held": True}}).encode() + b"\n"
def flood():
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock_path)
                s.sendall(line)
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            if b'"submitted"' in answer:
                kind = "accepted"
            elif b"--max-pending" in answer:
                kind = "refused_pending_limit"
            elif b"--max-connections" in answer:
                kind = "refused_connection_limit"
            else:
                kind = "refused_other"
        except OSError:
            kind = "failed"
        with lock:
            counts[kind] += 1
threads = [threading.Thread(target=flood) for _ in range(submitters)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({**counts, "idle_connections_kept": kept,
                  "idle_connections_tried": connections}))
"""

# Run as the hostile user too: one held array of TASKS (0-9999) submitted; its id printed.
SUBMIT_ARRAY = r"""
import base64, json, socket, sys
sock_path, script, workdir, version, tasks = sys.argv[1:6]
body = base64.b64encode(open(script, "rb").read()).decode()
line = json.dumps({"v": int(version), "kind": "submit", "script_path": script, "script": body,
                   "args": [], "workdir": workdir, "env": {"PATH": "/usr/bin:/bin"},
                   "umask": 18, "options": {"held": True, "array": tasks}}).encode() + b"\n"
answer = b""
with socket.socket(socket.AF_UNIX) as s:
    s.connect(sock_path)
    s.sendall(line)
    while not answer.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
print(json.loads(answer)["job_id"])
"""

# Run as the hostile user too: THREADS threads, each asking for every one of the queue's
# pending and running tasks until stdin closes; what they got, as JSON, at the end (with
# when each whole answer came, on the monotonic clock, which every process shares).
LISTER = r"""
import json, socket, sys, threading, time
sock_path, threads, version = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
line = json.dumps({"v": version, "kind": "list", "states": ["PENDING", "RUNNING"],
                   "array_tasks": True}).encode() + b"\n"
counts = {"answers": 0, "answer_bytes": 0, "refused": 0, "failed": 0, "answered_at": []}
lock, stop = threading.Lock(), threading.Event()
def flood():
    buffer = memoryview(bytearray(1 << 20))
    while not stop.is_set():
        size, last = 0, 0
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(sock_path)
                s.sendall(line)
                while last != 10:
                    got = s.recv_into(buffer)
                    if not got:
                        break
                    size, last = size + got, buffer[got - 1]
            kind = "answers" if last == 10 and size > 4096 else "refused"
        except OSError:
            kind = "failed"
        with lock:
            counts[kind] += 1
            if kind == "answers":
                counts["answer_bytes"] += size
                counts["answered_at"].append(time.monotonic())
workers = [threading.Thread(target=flood) for _ in range(threads)]
for worker in workers:
    worker.start()
print("flooding", flush=True)
sys.stdin.read()
stop.set()
for worker in workers:
    worker.join()
print(json.dumps(counts), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument(
        "--listers", default="8,16", help="the listing floods' thread counts, one run each"
    )
    parser.add_argument(
        "--listing-seconds",
        type=float,
        default=20.0,
        help="how long root's gq status is timed during each flood of listings",
    )
    parser.add_argument("--listings-only", action="store_true", help="only the flood of listings")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/abuse.py needs root: it makes a throwaway user and a system daemon")
    base = Path(tempfile.mkdtemp(prefix="gq-abuse-"))
    base.chmod(0o755)
    name = f"gqab{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "-m", "-d", str(base / name), "-s", "/bin/sh", name], check=True)
    user = pwd.getpwnam(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GQ_")}
    env["GQ_SYSTEM_HOME"] = str(base / "system")
    gq = [sys.executable, "-m", "gq"]
    try:
        subprocess.run(
            [*gq, "daemon", "start", "--system", "--kill-wait", "1"],
            env=env,
            check=True,
            capture_output=True,
        )
        workdir = Path(user.pw_dir)
        script = workdir / "true.sh"
        script.write_text("true\n")
        os.chown(script, user.pw_uid, user.pw_gid)

        def status_latency() -> list[float]:
            times = []
            for _ in range(args.samples):
                start = time.perf_counter()
                subprocess.run([*gq, "status"], env=env, check=True, capture_output=True)
                times.append(time.perf_counter() - start)
            return times

        socket_path = base / "system" / "gq.sock"
        if args.listings_only:
            result = {"listing_floods": listing_floods(args, gq, env, name, script, socket_path)}
            print(json.dumps(result, indent=2))
            print_listing_floods(result["listing_floods"])
            return
        quiet = status_latency()
        hostile = subprocess.Popen(
            [
                "runuser",
                "-u",
                name,
                "--",
                "/usr/bin/python3",
                "-c",
                HOSTILE,
                str(base / "system" / "gq.sock"),
                str(script),
                str(workdir),
                str(args.seconds),
                str(args.connections),
                str(args.submitters),
                str(PROTOCOL_VERSION),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(min(2.0, args.seconds / 4))  # let the flood reach its limits first
        abused = status_latency()
        flood = json.loads(hostile.communicate(timeout=args.seconds + 120)[0])
        info = json.loads(
            subprocess.run(
                [*gq, "info", "--json"], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        pending = json.loads(
            subprocess.run(
                [*gq, "status", "--json", "--state", "PD"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        full_queue = status_latency()
        subprocess.run(
            [*gq, "cancel", "--state", "PD", "--user", name],
            env=env,
            check=True,
            capture_output=True,
        )
        bulk = bulk_verbs(gq, env, script, name)
        floods = listing_floods(args, gq, env, name, script, socket_path)
    finally:
        subprocess.run([*gq, "daemon", "stop"], env=env, capture_output=True)
        subprocess.run(["userdel", "-r", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

    result = {
        "quiet_status": summary(quiet),
        "status_under_abuse": summary(abused),
        "status_with_hostile_pending": summary(full_queue),
        "flood": flood,
        "hostile_pending": len(pending),
        "limits": info["limits"],
        **bulk,
        "listing_floods": floods,
    }
    print(json.dumps(result, indent=2))
    ratio = result["status_under_abuse"]["p50_ms"] / result["quiet_status"]["p50_ms"]
    print(
        f"\nroot's gq status: {result['quiet_status']['p50_ms']:.0f} ms quiet, "
        f"{result['status_under_abuse']['p50_ms']:.0f} ms (p95 "
        f"{result['status_under_abuse']['p95_ms']:.0f}) while one user floods ({ratio:.2f}x), "
        f"{result['status_with_hostile_pending']['p50_ms']:.0f} ms with their "
        f"{len(pending)} pending jobs listed"
    )
    print(
        f"the flood: {flood['idle_connections_kept']} of {flood['idle_connections_tried']} "
        f"idle connections kept (limit {info['limits']['max_connections_per_user']} per "
        f"user); {flood['accepted']} submissions accepted, refused for the pending limit "
        f"({info['limits']['max_pending']}) {flood['refused_pending_limit']}, for the "
        f"connection limit {flood['refused_connection_limit']}, otherwise "
        f"{flood['refused_other']}; {flood['failed']} connections failed"
    )
    print(
        f"an array of 9,999 held tasks: submit {bulk['submit_s']:.2f} s, release "
        f"{bulk['release_s']:.2f} s, hold {bulk['hold_s']:.2f} s, cancel "
        f"{bulk['cancel_s']:.2f} s (whole commands)"
    )
    print_listing_floods(floods)


def summary(times: list[float]) -> dict:
    return {
        "p50_ms": statistics.median(times) * 1000,
        "p95_ms": percentile(times, 95) * 1000,
        "max_ms": max(times) * 1000,
    }


def listing_floods(
    args: argparse.Namespace, gq: list[str], env: dict, user: str, script: Path, sock: Path
) -> dict:
    """Root's `gq status` with the user's array of 10,000 held tasks queued: quiet, then
    while the user floods the daemon with listings of every task from each thread count of
    ``--listers``; and what each flood got."""

    def latency(seconds: float = 0.0) -> list[float]:
        """Root's gq status, one after another: ``--samples`` of them, and more until
        ``seconds`` have passed (a flood comes in bursts)."""
        times: list[float] = []
        end = time.monotonic() + seconds
        while len(times) < args.samples or time.monotonic() < end:
            start = time.perf_counter()
            subprocess.run([*gq, "status"], env=env, check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        return times

    daemon = psutil.Process(int((sock.parent / "daemon.pid").read_text().split()[0]))
    array = subprocess.run(
        [
            "runuser",
            "-u",
            user,
            "--",
            "/usr/bin/python3",
            "-c",
            SUBMIT_ARRAY,
            str(sock),
            str(script),
            str(script.parent),
            str(PROTOCOL_VERSION),
            "0-9999",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The pass that reads the new tasks, and the page cache, settle before anything is timed.
    time.sleep(2.0)
    latency()
    quiet = latency()
    result: dict = {"tasks": 10_000, "quiet_status": summary(quiet)}
    for threads in [int(n) for n in args.listers.split(",")]:
        flood = subprocess.Popen(
            [
                "runuser",
                "-u",
                user,
                "--",
                "/usr/bin/python3",
                "-c",
                LISTER,
                str(sock),
                str(threads),
                str(PROTOCOL_VERSION),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout is not None and flood.stdin is not None
        assert flood.stdout.readline().strip() == "flooding"
        time.sleep(0.5)  # every thread has a listing asked for, or under way
        began, cpu = time.monotonic(), daemon.cpu_times()
        times = latency(args.listing_seconds)
        ended, spent = time.monotonic(), daemon.cpu_times()
        flood.stdin.close()
        got = json.loads(flood.stdout.readline())
        flood.wait(timeout=300)
        answered = got.pop("answered_at")
        result[f"{threads}_threads"] = {
            "status": summary(times),
            "samples": len(times),
            "ratio_p50": statistics.median(times) / statistics.median(quiet),
            "flood": got,
            "listings_per_s": sum(began <= t <= ended for t in answered) / (ended - began),
            # CPU of the daemon's own loop, and of its children (listings made apart)
            "daemon_cpu_share": (spent.user + spent.system - cpu.user - cpu.system)
            / (ended - began),
            "children_cpu_share": (
                spent.children_user
                + spent.children_system
                - cpu.children_user
                - cpu.children_system
            )
            / (ended - began),
        }
    subprocess.run([*gq, "cancel", array], env=env, check=True, capture_output=True)
    return result


def print_listing_floods(floods: dict) -> None:
    quiet = floods["quiet_status"]
    parts = [
        f"{key.split('_')[0]} threads: {run['status']['p50_ms']:.0f} ms (p95 "
        f"{run['status']['p95_ms']:.0f}, max {run['status']['max_ms']:.0f}; "
        f"{run['ratio_p50']:.2f}x), the flood answered {run['listings_per_s']:.1f} listings/s"
        for key, run in floods.items()
        if key.endswith("_threads")
    ]
    print(
        f"root's gq status beside {floods['tasks']:,} held tasks of one user: "
        f"{quiet['p50_ms']:.0f} ms quiet (p95 {quiet['p95_ms']:.0f}); while they flood "
        "listings of every task from " + "; ".join(parts)
    )


def bulk_verbs(gq: list[str], env: dict, script: Path, user: str) -> dict:
    """Seconds for root to submit, release, hold and cancel an array of 9,999 tasks (a held
    blocker keeps the released tasks from starting; with it, the pending limit is met)."""

    def timed(*argv: str) -> tuple[float, str]:
        start = time.perf_counter()
        done = subprocess.run([*gq, *argv], env=env, check=True, capture_output=True, text=True)
        return time.perf_counter() - start, done.stdout

    _, blocker = timed("submit", "--parsable", "--hold", str(script))
    submit_s, array = timed(
        "submit",
        "--parsable",
        "--hold",
        "--array",
        "0-9998",
        "--dependency",
        f"afterok:{blocker.strip()}",
        str(script),
    )
    release_s, _ = timed("release", array.strip())
    hold_s, _ = timed("hold", array.strip())
    cancel_s, _ = timed("cancel", array.strip(), blocker.strip())
    return {"submit_s": submit_s, "release_s": release_s, "hold_s": hold_s, "cancel_s": cancel_s}


if __name__ == "__main__":
    main()
