"""Starting a device's execution host: its command line (the daemon runs
``python -m gq.exec.host.startup``), the lock on its pidfile and its listening socket in the
state directory, then :class:`gq.exec.host.loop.Host`'s loop until it exits. A second host of
the same device exits at once (AlreadyRunning), leaving the live one its socket."""

from __future__ import annotations

import argparse
import fcntl
import logging
import os
import signal

from gq import defaults
from gq import log as gq_log
from gq.errors import AlreadyRunning
from gq.exec.cgroups import job_cgroups as cgroups
from gq.exec.host.loop import Host
from gq.exec.host.messages import HOST_VERSION
from gq.exec.host.terminal import bind_private
from gq.exec.protocol import host_paths

log = logging.getLogger("gq.host")


def listen(state_dir: str, device: str):
    """Lock the device's host pidfile and bind its socket; AlreadyRunning if a live host
    holds them. Returns the pidfile (keep it open) and the listening socket."""
    pidfile_path, socket_path = host_paths(state_dir, device)
    fd = os.open(pidfile_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    pidfile = os.fdopen(fd, "r+")
    try:
        fcntl.flock(pidfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pidfile.close()
        raise AlreadyRunning(None) from None
    pidfile.seek(0)
    pidfile.truncate()
    pidfile.write(f"{os.getpid()} {HOST_VERSION}\n")
    pidfile.flush()
    listener = bind_private(socket_path)
    listener.listen(8)
    listener.setblocking(False)
    return pidfile, listener


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="gq-host", description="gq execution host (started by the daemon)"
    )
    parser.add_argument("--device", required=True)
    parser.add_argument("--cuda", action="store_true")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument(
        "--pack", action="store_true", help="lanes at once as measurement says (--lanes auto)"
    )
    parser.add_argument(
        "--checkpoint",
        choices=defaults.CHECKPOINT_KINDS,
        default="auto",
        help="how a suspended job's device memory moves to host memory (gq.exec.host.checkpoint)",
    )
    parser.add_argument(
        "--mps", action="store_true", help="MPS serves the device: one user's jobs side by side"
    )
    parser.add_argument("--memory", type=int, help="the device's memory in bytes, where known")
    parser.add_argument("--state-dir", required=True, help="where its socket and pidfile live")
    parser.add_argument("--kill-grace", type=float, default=defaults.KILL_WAIT)
    parser.add_argument("--cgroup", choices=cgroups.KINDS, default=defaults.CGROUP)
    parser.add_argument("--scope", required=True, help="this gq instance's cgroup tag")
    parser.add_argument("--terminals", help="where interactive jobs' terminal sockets go")
    parser.add_argument("--progress", help="where plain processes' step counts go")
    parser.add_argument(
        "--attach-wait",
        type=float,
        default=defaults.ATTACH_WAIT,
        help="seconds a started interactive job waits for its gq",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    gq_log.configure(f"host[{args.device}]")
    try:
        pidfile, listener = listen(args.state_dir, args.device)
    except AlreadyRunning:
        log.error("another execution host of %s is running", args.device)
        raise SystemExit(defaults.ALREADY_RUNNING_EXIT) from None
    backend = cgroups.detect(args.cgroup, args.scope)
    if args.mps:
        log.info("MPS serves %s: jobs side by side are one user's", args.device)
    log.info(
        "jobs' processes are kept in %s",
        f"cgroup {backend.kind} hierarchies"
        if backend is not None
        else "process groups (no cgroup hierarchy to use)",
    )
    try:
        Host(
            args.device,
            args.cuda,
            args.lanes,
            listener,
            args.kill_grace,
            backend,
            args.memory,
            args.terminals,
            args.attach_wait,
            args.progress,
            args.pack,
            args.checkpoint,
            args.mps,
        ).run()
    finally:
        os.unlink(host_paths(args.state_dir, args.device)[1])
        pidfile.close()


if __name__ == "__main__":
    main()
