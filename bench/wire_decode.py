"""What decoding a message costs on each wire: a worker's Done (host side, once per
iteration of every job), a Launch with 60 environment variables (daemon to host), and a
Jobs answer of 500 jobs (daemon to client, `gq status --json` on a busy node); also what
encoding that answer costs the daemon. The best of five repeats, in this process.

  python bench/wire_decode.py

Prints one JSON object, then a summary.
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from gq import messages  # noqa: E402
from gq.exec import protocol  # noqa: E402
from gq.exec.host import messages as host_messages
from gq.exec.job import messages as worker_messages

REQUIRED = {f.name: None for f in msgspec.structs.fields(messages.JobInfo) if f.required}


def job(number: int) -> messages.JobInfo:
    return messages.JobInfo(
        **{
            **REQUIRED,
            "id": number,
            "label": str(number),
            "name": "train",
            "user": "ann",
            "state": "RUNNING",
            "priority": 0,
            "gpus": 1,
            "exclusive": False,
            "requeue": False,
            "held": False,
            "submit_time": 1.7e9,
            "run_count": 1,
            "steps_done": 10,
            "attained": 1.5,
            "holds_lane": False,
        }
    )


def best(action, number: int) -> float:
    """Seconds per call, the best of five repeats."""
    return min(timeit.repeat(action, number=number, repeat=5)) / number


def main() -> None:
    done = protocol.encode(worker_messages.Done(5, 1000, 2000)).rstrip(b"\n")
    spec = host_messages.LaunchSpec(
        id=1,
        run=1,
        argv=["/usr/bin/python3", "train.py", *["--flag"] * 20],
        worker=True,
        cwd="/home/ann/run",
        env={f"VARIABLE_{i}": "v" * 40 for i in range(60)},
        stdout="/home/ann/run/out",
        stderr="/home/ann/run/out",
        user="ann",
        submit_time=1.7e9,
    )
    launch = protocol.encode(host_messages.Launch(spec)).rstrip(b"\n")
    jobs = [job(number) for number in range(1, 501)]
    answer = messages.encode(messages.Jobs(jobs)).rstrip(b"\n")
    result = {
        "done_decode_us": best(lambda: protocol.decode(done, protocol.FROM_WORKER), 20000) * 1e6,
        "launch_decode_us": best(lambda: protocol.decode(launch, protocol.TO_HOST), 2000) * 1e6,
        "jobs500_decode_ms": best(lambda: messages.decode(answer, messages.ANSWERS), 20) * 1e3,
        "jobs500_encode_ms": best(lambda: messages.encode(messages.Jobs(jobs)), 20) * 1e3,
        "jobs500_bytes": len(answer),
    }
    result = {name: round(value, 2) for name, value in result.items()}
    print(json.dumps(result, indent=2))
    print(
        f"decode: Done {result['done_decode_us']} us, Launch {result['launch_decode_us']} us, "
        f"500 jobs {result['jobs500_decode_ms']} ms; encode 500 jobs "
        f"{result['jobs500_encode_ms']} ms"
    )


if __name__ == "__main__":
    main()
