"""What watching the node costs the daemon: its CPU time per second of wall time on an
idle node with 4 emulated devices (sampling them every second), then with `gq top`
refreshing once a second and a Prometheus scrape every second, measured in one run.

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
        top = subprocess.Popen([sys.executable, "-m", "gq", "top", "-b"], env=node.env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            scrape = lambda: urllib.request.urlopen(  # noqa: E731
                f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            watched = per_second(node, args.seconds, scrape)
        finally:
            top.terminate()
            top.wait()
    result = {"seconds": args.seconds, "daemon_cpu_idle_ms_per_s": idle * 1000,
              "daemon_cpu_watched_ms_per_s": watched * 1000,
              "extra_ms_per_s": (watched - idle) * 1000}
    print(json.dumps(result))
    print(f"daemon CPU: idle {idle * 1000:.1f} ms/s, with gq top at 1 Hz and a scrape per second "
          f"{watched * 1000:.1f} ms/s: {(watched - idle) * 1000:+.1f} ms per second "
          f"({(watched - idle) * 100:.2f} % of one core)")


if __name__ == "__main__":
    main()
