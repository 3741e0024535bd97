"""bench/gpu_check.py, the prepared check for a GPU node, run as CI runs it: on the cpu
device, quick (its own daemon in a throwaway GQ_HOME). It must run through every phase,
and the lane must keep two jobs' iterations apart on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

PHASES = {
    "environment",
    "alone",
    "fair_pair",
    "priority_fill",
    "sweep",
    "escapes",
    "bounded_hold",
    "lone_tail",
}


@pytest.mark.long
def test_the_gpu_check_runs_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GQ_")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_check.py"),
            "--cpu",
            "--quick",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    assert set(result["phases"]) == PHASES
    for name, phase in result["phases"].items():
        assert phase["figures"], f"{name}: no figures ({phase['error']})"
    fair = result["phases"]["fair_pair"]
    assert fair["status"] == "ok", fair["error"]
    figures = {f["name"]: f for f in fair["figures"]}
    assert figures["overlap"]["value"] is not None and figures["overlap"]["value"] <= 0.01
    assert "fair_pair" in done.stdout and "threshold" in done.stdout  # the summary, last
