"""What watching the node costs the daemon: its CPU time per second of wall time on an
idle node with 4 emulated devices (sampling them every second), then with `gq top`
refreshing once a second, then with a Prometheus scrape every second, in one run.

  python bench/monitoring_cost.py [--seconds 15]

Prints one JSON object, then a summary.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Node  # noqa: E402


def daemon_cpu(node: Node) -> float:
    pid = int((Path(node.env["GQ_HOME"]) / "daemon.pid").read_text())
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def per_second(node: Node, seconds: float, during=lambda: None) -> float:
    before, start = daemon_cpu(node), time.monotonic()
    while time.monotonic() - start < seconds:
        during()
        time.sleep(1.0)
    return (daemon_cpu(node) - before) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Node("--cpu-devices", "4", "--metrics", f"127.0.0.1:{port}") as node:
        script = node.dir / "held.sh"
        script.write_text("true\n")
        for _ in range(8):  # a pending queue for gq top to list
            node.submit("--hold", str(script))
        time.sleep(2)  # past start-up
        idle = per_second(node, args.seconds)
        top = subprocess.Popen(
            [sys.executable, "-m", "gq", "top", "-b"],
            env=node.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with_top = per_second(node, args.seconds)
        finally:
            top.terminate()
            top.wait()
        scrape = lambda: urllib.request.urlopen(  # noqa: E731
            f"http://127.0.0.1:{port}/metrics", timeout=5
        ).read()
        scraped = per_second(node, args.seconds, scrape)
    result = {
        "seconds": args.seconds,
        "daemon_cpu_idle_ms_per_s": idle * 1000,
        "with_top_ms_per_s": with_top * 1000,
        "with_scrapes_ms_per_s": scraped * 1000,
    }
    print(json.dumps(result))
    print(
        f"daemon CPU per second: idle {idle * 1000:.1f} ms (sampling 4 devices); "
        f"gq top at 1 Hz {(with_top - idle) * 1000:+.1f} ms; a scrape per second "
        f"{(scraped - idle) * 1000:+.1f} ms (1 ms = 0.1 % of one core)"
    )


if __name__ == "__main__":
    main()
