"""A stand-in for NVIDIA's ``nvidia-cuda-mps-control``, written onto a test's PATH by
:func:`install`: every call is recorded (its arguments, the MPS directories and visible
devices it was given, the commands on its stdin) as a JSON line in ``record``.

``-d`` forks a control daemon that makes the pipe directory's ``control`` FIFO and its pid
file (as the real one does), serves the commands written to the FIFO, and exits on ``quit``,
removing both. Without ``-d`` it is the front end: it writes its stdin's commands to the
FIFO and exits 0, or exits 1 saying it cannot find the daemon where nothing reads them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SCRIPT = r"""#!{python}
import errno, json, os, sys, time

RECORD = {record!r}
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
control = os.path.join(pipe, "control")
pidfile = os.path.join(pipe, "nvidia-cuda-mps-control.pid")


def note(**fields):
    with open(RECORD, "a") as out:
        out.write(json.dumps(fields) + "\n")


def serve():
    os.setsid()
    os.mkfifo(control, 0o666)
    with open(pidfile, "w") as out:
        out.write(str(os.getpid()))
    note(event="up", pid=os.getpid(), pipe=pipe)
    with os.fdopen(os.open(control, os.O_RDWR), "r") as commands:  # (a writer of its own:
        for line in commands:  # no end of file between two front ends)
            if line.strip() == "quit":
                os.unlink(control)
                os.unlink(pidfile)
                note(event="down", pid=os.getpid(), pipe=pipe)
                os._exit(0)


argv = sys.argv[1:]
if argv == ["-d"]:
    note(
        event="start",
        pipe=pipe,
        log=os.environ.get("CUDA_MPS_LOG_DIRECTORY"),
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        mps={{k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_") and k not in
             ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}},
    )
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.dup2(os.open(os.devnull, os.O_RDWR), fd)
        serve()
    deadline = time.monotonic() + 5
    while not os.path.exists(pidfile) and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(0)
commands = [line.strip() for line in sys.stdin if line.strip()]
try:
    fd = os.open(control, os.O_WRONLY | os.O_NONBLOCK)
except OSError as exc:
    if exc.errno not in (errno.ENOENT, errno.ENXIO):
        raise
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
os.write(fd, "".join(c + "\n" for c in commands).encode())
os.close(fd)
if commands != ["get_server_list"]:
    note(event="command", pipe=pipe, commands=commands)
"""


def install(directory: Path, record: Path) -> Path:
    """The fake, as ``directory/nvidia-cuda-mps-control``, recording into ``record``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "nvidia-cuda-mps-control"
    path.write_text(SCRIPT.format(python=sys.executable, record=str(record)))
    path.chmod(0o755)
    return path


def events(record: Path, kind: str | None = None) -> list[dict]:
    """What the fake recorded (of one ``kind``: start, up, command, down)."""
    if not record.exists():
        return []
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    return [e for e in lines if kind is None or e["event"] == kind]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purposes
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not die"
        time.sleep(0.01)
