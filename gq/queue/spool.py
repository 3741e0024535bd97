"""Snapshots of submitted scripts, so editing or deleting the original changes no queued job."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gq.home import Home


def job_dir(home: Home, job_id: int) -> Path:
    return home.spool / str(job_id)


def snapshot(home: Home, job_id: int, script: Path) -> Path:
    target_dir = job_dir(home, job_id)
    target_dir.mkdir(mode=0o700, exist_ok=True)
    target = target_dir / script.name
    shutil.copyfile(script, target)
    os.chmod(target, 0o700)
    return target


def discard(home: Home, job_id: int) -> None:
    shutil.rmtree(job_dir(home, job_id), ignore_errors=True)
