"""``python -m gq.daemon``: run the node daemon in the foreground (what `gq daemon start`
runs, detached, and what the systemd unit runs)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from gq import defaults, home
from gq.daemon.control import acquire_pidfile
from gq.errors import AlreadyRunning


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gq.daemon")
    parser.add_argument("--system", action="store_true",
                        help="the node's shared daemon (root; state in GQ_SYSTEM_HOME)")
    parser.add_argument("--lanes", type=int, default=defaults.LANES)
    parser.add_argument("--max-resident", type=int, default=defaults.MAX_RESIDENT)
    parser.add_argument("--kill-wait", type=float, default=defaults.KILL_WAIT)
    parser.add_argument("--cpu-memory", type=int, help="bytes the cpu device offers jobs")
    parser.add_argument("--cpu-devices", type=int, help="emulate this many devices")
    parser.add_argument("--operators", help="group whose members are operators")
    parser.add_argument("--priority-cap", type=int, default=defaults.PRIORITY_CAP)
    parser.add_argument("--max-temp", type=float, help="admit nothing to a device hotter (C)")
    parser.add_argument("--max-power", type=float, help="... or drawing more (W)")
    parser.add_argument("--readings", help="recorded device readings overlaid on samples")
    parser.add_argument("--metrics", help="ADDR:PORT to serve Prometheus metrics on")
    parser.add_argument("--client-timeout", type=float, default=defaults.CONNECTION_IDLE)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s daemon %(levelname)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line each
    if args.system and os.geteuid() != 0:
        sys.exit("gq: error: the system daemon runs as root")
    where = (home.system() if args.system else home.personal()).ensure()
    try:
        pidfile = acquire_pidfile(where)  # before the heavy imports: a loser exits at once
    except AlreadyRunning as exc:
        print(f"gq: {exc}", file=sys.stderr)
        sys.exit(defaults.ALREADY_RUNNING_EXIT)
    from gq.daemon.node import Daemon, DaemonOptions

    options = DaemonOptions(lanes=args.lanes, max_resident=args.max_resident,
                            kill_grace=args.kill_wait, cpu_memory=args.cpu_memory,
                            cpu_devices=args.cpu_devices,
                            operator_group=args.operators, priority_cap=args.priority_cap,
                            max_temp=args.max_temp, max_power=args.max_power,
                            readings=args.readings, metrics=args.metrics,
                            client_timeout=args.client_timeout)
    Daemon(where, options).run(pidfile)


if __name__ == "__main__":
    main()
