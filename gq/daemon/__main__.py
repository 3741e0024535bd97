"""``python -m gq.daemon``: run the node daemon in the foreground (what `gq daemon start`
runs, detached, and what the systemd unit runs)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from gq import defaults, home, log
from gq.daemon.pidfiles import acquire_pidfile
from gq.errors import AlreadyRunning, UnsafeStateDirectory, UserError
from gq.units import parse_period


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gq.daemon")
    parser.add_argument(
        "--system",
        action="store_true",
        help="the node's shared daemon (root; state in GQ_SYSTEM_HOME)",
    )
    parser.add_argument("--lanes", type=_lanes, default=(defaults.LANES, True))
    parser.add_argument("--checkpoint", choices=defaults.CHECKPOINT_KINDS, default="auto")
    parser.add_argument("--max-resident", type=int, default=defaults.MAX_RESIDENT)
    parser.add_argument(
        "--max-pids",
        type=_tasks,
        default=defaults.MAX_PIDS,
        help="tasks (processes and threads) each job may have at once",
    )
    parser.add_argument("--kill-wait", type=float, default=defaults.KILL_WAIT)
    parser.add_argument("--cpu-memory", type=int, help="bytes the cpu device offers jobs")
    parser.add_argument(
        "--probe-mem",
        type=_positive,
        default=defaults.PROBE_MEMORY,
        help="bytes free a job that declares no memory needs to start",
    )
    parser.add_argument(
        "--probe-wait",
        type=_seconds_up_to(defaults.MAX_PROBE_WAIT),
        default=defaults.PROBE_IDLE_SECONDS,
        help="seconds a probe waits for a job's first iteration",
    )
    parser.add_argument("--cpu-devices", type=int, help="emulate this many devices")
    parser.add_argument("--device-model", help="the emulated devices' model name")
    parser.add_argument("--operators", help="group whose members are operators")
    parser.add_argument("--on-finish", help="command run as each job's owner once it ends")
    parser.add_argument("--move-margin", type=float, default=defaults.MOVE_MARGIN)
    parser.add_argument(
        "--attach-wait",
        type=_seconds_up_to(defaults.MAX_ATTACH_WAIT),
        default=defaults.ATTACH_WAIT,
        help="seconds a started interactive job waits for its gq",
    )
    parser.add_argument("--priority-cap", type=int, default=defaults.PRIORITY_CAP)
    parser.add_argument("--max-temp", type=float, help="admit nothing to a device hotter (C)")
    parser.add_argument("--max-power", type=float, help="... or drawing more (W)")
    parser.add_argument("--readings", help="recorded device readings overlaid on samples")
    parser.add_argument("--metrics", help="ADDR:PORT to serve Prometheus metrics on")
    parser.add_argument("--client-timeout", type=float, default=defaults.CONNECTION_IDLE)
    parser.add_argument("--cgroup", choices=("auto", "v2", "v1", "off"), default=defaults.CGROUP)
    parser.add_argument("--retention", type=_period, default=defaults.RETENTION)
    parser.add_argument("--fair-half-life", type=_period, default=defaults.FAIR_HALF_LIFE)
    parser.add_argument("--idle-resident", type=_period, default=defaults.IDLE_RESIDENT)
    parser.add_argument("--rotate", type=_rotate, help="a resident's turn while others wait")
    parser.add_argument("--mps", action="store_true", help="NVIDIA MPS on the CUDA devices")
    parser.add_argument("--max-pending", type=int, default=defaults.MAX_PENDING_PER_USER)
    parser.add_argument("--max-array", type=int, default=defaults.MAX_ARRAY_SIZE)
    parser.add_argument(
        "--max-connections-per-user", type=int, default=defaults.MAX_CONNECTIONS_PER_USER
    )
    parser.add_argument("--max-connections", type=int, default=defaults.MAX_CONNECTIONS)
    parser.add_argument("--max-request", type=int, default=defaults.MAX_REQUEST)
    parser.add_argument("--max-spool", type=int, default=defaults.MAX_SPOOL_PER_USER)
    args = parser.parse_args()
    # A daemon outlives the terminal that started it: no hangup may end it, and its working
    # directory is its own (nothing a user controls is on its path: see spawn.gq_python).
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.configure("daemon")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line each
    if args.system and os.geteuid() != 0:
        sys.exit("gq: error: the system daemon runs as root")
    try:
        where = (home.system() if args.system else home.personal()).ensure()
    except UnsafeStateDirectory as exc:
        sys.exit(f"gq: error: {exc}")
    os.chdir(where.root)
    try:
        pidfile = acquire_pidfile(where)  # before the heavy imports: a loser exits at once
    except AlreadyRunning as exc:
        print(f"gq: {exc}", file=sys.stderr)
        sys.exit(defaults.ALREADY_RUNNING_EXIT)
    from gq.daemon.node import Daemon
    from gq.daemon.options import DaemonOptions

    options = DaemonOptions(
        lanes=args.lanes[0],
        packing=args.lanes[1],
        checkpoint=args.checkpoint,
        max_resident=args.max_resident,
        max_pids=args.max_pids,
        kill_grace=args.kill_wait,
        cpu_memory=args.cpu_memory,
        cpu_devices=args.cpu_devices,
        device_model=args.device_model,
        on_finish=args.on_finish,
        move_margin=args.move_margin,
        operator_group=args.operators,
        priority_cap=args.priority_cap,
        max_temp=args.max_temp,
        max_power=args.max_power,
        readings=args.readings,
        metrics=args.metrics,
        client_timeout=args.client_timeout,
        cgroup=args.cgroup,
        fair_half_life=args.fair_half_life,
        idle_resident=args.idle_resident,
        rotate=args.rotate,
        mps=args.mps,
        retention=args.retention,
        max_pending=args.max_pending,
        max_array=args.max_array,
        max_connections_per_user=args.max_connections_per_user,
        max_connections=args.max_connections,
        max_request=args.max_request,
        max_spool=args.max_spool,
        probe_mem=args.probe_mem,
        probe_wait=args.probe_wait,
        attach_wait=args.attach_wait,
    )
    Daemon(where, options).run(pidfile)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a whole number of at least 1")
    return value


def _lanes(text: str) -> tuple[int, bool]:
    from gq.daemon.options import parse_lanes

    try:
        return parse_lanes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rotate(text: str) -> float:
    from gq.daemon.options import parse_rotate

    try:
        return parse_rotate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tasks(text: str) -> int:
    value = int(text)
    if not 1 <= value <= defaults.MAX_PIDS_CEILING:
        raise argparse.ArgumentTypeError(
            f"{text}: give a whole number from 1 to {defaults.MAX_PIDS_CEILING}"
        )
    return value


def _seconds_up_to(limit: float):
    """An argparse type: seconds, more than 0 and at most ``limit``."""

    def seconds(text: str) -> float:
        value = float(text)
        if not 0 < value <= limit:
            raise argparse.ArgumentTypeError(
                f"{text}: give seconds, more than 0 and at most {limit:g}"
            )
        return value

    return seconds


def _period(text: str) -> float:
    try:
        return parse_period(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


if __name__ == "__main__":
    main()
