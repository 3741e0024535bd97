"""``python -m gq.daemon``: run the node daemon in the foreground (what `gq daemon start` runs)."""

from __future__ import annotations

import argparse
import logging
import sys

from gq.daemon.control import AlreadyRunning
from gq.daemon.node import Daemon, DaemonOptions
from gq.home import home


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m gq.daemon")
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--max-resident", type=int, default=4)
    parser.add_argument("--kill-wait", type=float, default=10.0)
    parser.add_argument("--cpu-memory", type=int, help="bytes the cpu device offers jobs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s daemon %(levelname)s %(message)s")
    options = DaemonOptions(lanes=args.lanes, max_resident=args.max_resident,
                            kill_grace=args.kill_wait, cpu_memory=args.cpu_memory)
    try:
        Daemon(home(), options).run()
    except AlreadyRunning as exc:
        print(f"gq: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
