"""NVIDIA MPS where the operator asks for it (``gq daemon start --mps``): one control daemon
(``nvidia-cuda-mps-control -d``) per CUDA device, its pipe and log directories under gq's
state (``mps/<device>/pipe``, ``mps/<device>/log``), supervised by the daemon and stopped
with it; and what a job on such a device finds in its environment.

Classic MPS serves one user at a time on a device: a client of another user waits at CUDA's
start until every client of the server that runs has gone. So a job is made an MPS client
(:func:`serves`) only where no job of another user runs on its device; the others run as
plain CUDA contexts, time-sliced by the driver as without MPS. Their limits come from the
lanes: pinned device memory from its lane's capacity, active threads from the device's lane
count, set in each client's environment and as the control daemon's defaults.

A control daemon that answers when the daemon starts is adopted: jobs that outlived the
last daemon may be its clients. One left by a daemon that had ``--mps`` is stopped (``quit``
waits for its clients to finish) when the new daemon runs without it. A stop that keeps the
jobs (``--keep-jobs``, ``gq daemon restart``) leaves the control daemons to them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from gq.daemon.devices import Device
from gq.home import Home

log = logging.getLogger("gq.daemon")

CONTROL = "nvidia-cuda-mps-control"
# Tests and demos on the cpu: the emulated devices named here (cpu0,cpu1) are served as if
# they were CUDA devices, by whatever nvidia-cuda-mps-control is on PATH (a fake).
FAKE_DEVICES = "GQ_FAKE_MPS_DEVICES"
PIPE = "CUDA_MPS_PIPE_DIRECTORY"
LOGS = "CUDA_MPS_LOG_DIRECTORY"
MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# What a job may not set itself: gq's values, or none, are what it runs with.
CLIENT_VARIABLES = frozenset({PIPE, LOGS, MEMORY, THREADS})
ANSWER_WAIT = 5.0  # seconds the control's front end may take to answer one command
START_WAIT = 5.0  # seconds a started control daemon may take to answer (the socket waits)
STOP_WAIT = 10.0  # ... and a quit one to stop answering
NOT_ASKED = "not asked: gq daemon start --mps"


# ----- pure: what is served, and how -------------------------------------------------
def servable(devices: Iterable[Device], fake: str = "") -> list[Device]:
    """The devices a control daemon would serve: the CUDA ones (GPUs, MIG instances), and
    the emulated ones ``fake`` names (a comma-separated list, for tests)."""
    named = {name.strip() for name in fake.split(",") if name.strip()}
    return [d for d in devices if d.kind == "cuda" or (d.kind == "emulated" and d.name in named)]


def off_reason(asked: bool, control: str | None, devices: list[Device]) -> str | None:
    """Why MPS stays off on the whole node (None: it is tried on ``devices``)."""
    if not asked:
        return NOT_ASKED
    if control is None:
        return f"no {CONTROL} on PATH"
    if not devices:
        return "no CUDA device"
    return None


def thread_percentage(lanes: int) -> int:
    """Each client's share of the device's threads: an even split over its lanes, at
    least 1 (``--lanes auto`` admits as one lane: 100, so a job alone keeps all of it)."""
    return max(1, round(100 / max(1, lanes)))


def lane_mib(lane_memory: int) -> int:
    """A lane's capacity in whole MiB (at least 1): what MPS's memory limits are given in."""
    return max(1, lane_memory >> 20)


def pinned_limit(lane_memory: int) -> str:
    """The pinned device memory a client may hold, as CUDA reads it: device 0 (its only
    visible one) and whole MiB of its lane's capacity."""
    return f"0={lane_mib(lane_memory)}M"


def client_environment(pipe: str, lane_memory: int, lanes: int) -> dict[str, str]:
    return {PIPE: pipe, MEMORY: pinned_limit(lane_memory), THREADS: str(thread_percentage(lanes))}


def serves(user: str, others: Iterable[str]) -> bool:
    """Whether a job of ``user`` may be an MPS client of its device, where ``others`` are
    the owners of the device's other running jobs: only while they are all its own, so
    that the device's server is never another user's (a job of another user that runs
    without MPS counts too: it may have begun while its user's server ran)."""
    return all(other == user for other in others)


def summary(reason: str | None, on: Mapping[str, int | None], failed: Mapping[str, str]) -> str:
    """The line gq info shows: ``MPS: on (devices 0,1)``, ``MPS: off (why)``."""
    if reason is not None:
        return f"MPS: off ({reason})"
    parts = []
    if on:
        numbers = ",".join(str(i) if i is not None else name for name, i in sorted(on.items()))
        parts.append(f"MPS: on (devices {numbers})")
    for name, why in sorted(failed.items()):
        parts.append(f"{'off' if parts else 'MPS: off'} on {name} ({why})")
    return "; ".join(parts) or "MPS: off (no control daemon came up)"


def control_environment(
    base: Mapping[str, str], device: Device, pipe: Path, logs: Path
) -> dict[str, str]:
    """The environment a device's control daemon runs in: the daemon's, less any MPS
    settings of its own, with the device's pipe and log directories and the device alone
    visible (by UUID where it has one, as NVIDIA advises)."""
    env = {k: v for k, v in base.items() if not k.startswith("CUDA_MPS_")}
    visible = device.uuid or str(device.gpu if device.gpu is not None else device.index)
    env.update({PIPE: str(pipe), LOGS: str(logs), "CUDA_VISIBLE_DEVICES": visible})
    return env


# ----- the control daemons --------------------------------------------------------------
Runner = Callable[..., subprocess.CompletedProcess]


class Mps:
    """The node's MPS: which devices it serves, their control daemons started or adopted,
    checked, and stopped."""

    def __init__(
        self,
        home: Home,
        devices: list[Device],
        asked: bool,
        lanes: int,
        lane_memory: Callable[[Device], int],
        environ: Mapping[str, str] | None = None,
    ):
        self.home = home
        self.environ = dict(os.environ if environ is None else environ)
        self.control = shutil.which(CONTROL, path=self.environ.get("PATH"))
        self.candidates = servable(devices, self.environ.get(FAKE_DEVICES, ""))
        self.reason = off_reason(asked, self.control, self.candidates)
        self.lanes = max(1, lanes)
        self.lane_memory = lane_memory
        self.on: dict[str, Device] = {}  # devices whose control daemon answers
        self.failed: dict[str, str] = {}  # ... and why the others' did not come up

    @property
    def line(self) -> str:
        return summary(self.reason, {n: d.index for n, d in self.on.items()}, self.failed)

    def paths(self, device: Device) -> tuple[Path, Path]:
        base = self.home.root / "mps" / device.name
        return base / "pipe", base / "log"

    def start(self) -> None:
        """Bring up (or adopt) each device's control daemon; where MPS is not asked for,
        stop any an earlier daemon left."""
        if self.reason is not None:
            self._stop_left()
            return
        for device in self.candidates:
            try:
                self._bring_up(device)
            except (OSError, subprocess.SubprocessError) as exc:
                self.failed[device.name] = str(exc)
            if device.name in self.failed:
                log.error("MPS stays off on %s: %s", device.name, self.failed[device.name])

    def _bring_up(self, device: Device) -> None:
        pipe, logs = self.paths(device)
        _private_dirs(self.home.root / "mps", pipe.parent, pipe, logs)
        if self._answers(device):
            log.info("MPS: adopted the control daemon of %s (%s)", device.name, pipe)
        else:
            for leftover in pipe.iterdir():  # a dead one's files: nothing answers on them
                real_dir = leftover.is_dir() and not leftover.is_symlink()
                (shutil.rmtree if real_dir else os.unlink)(leftover)
            done = self._run(device, "-d", text=None)
            if done.returncode != 0:
                self.failed[device.name] = f"{CONTROL} -d exited {done.returncode}: " + _said(done)
                return
            deadline = time.monotonic() + START_WAIT
            while not self._answers(device):
                if time.monotonic() > deadline:
                    self.failed[device.name] = f"its control did not answer in {START_WAIT:g} s"
                    return
                time.sleep(0.05)
            log.info("MPS: started the control daemon of %s (%s)", device.name, pipe)
        self.on[device.name] = device
        self.failed.pop(device.name, None)
        for command in (
            f"set_default_active_thread_percentage {thread_percentage(self.lanes)}",
            f"set_default_device_pinned_mem_limit 0 {lane_mib(self.lane_memory(device))}M",
        ):
            done = self._run(device, text=command)
            if done.returncode != 0:  # (the clients' environment still carries it)
                log.warning("MPS on %s: %r failed: %s", device.name, command, _said(done))

    def tend(self) -> None:
        """A control daemon that stopped answering is started again."""
        for name, device in list(self.on.items()):
            try:
                if self._answers(device):
                    continue
                log.error("MPS: the control daemon of %s stopped answering: starting it", name)
                del self.on[name]
                self._bring_up(device)
            except (OSError, subprocess.SubprocessError) as exc:
                self.failed[name] = str(exc)
            if name in self.failed:  # (its jobs from now on start without MPS)
                log.error("MPS stays off on %s: %s", name, self.failed[name])

    def stop(self) -> None:
        """Quit every control daemon this daemon serves (the daemon stops with its jobs)."""
        for device in list(self.on.values()):
            self._quit(device)
            del self.on[device.name]

    def _stop_left(self) -> None:
        """Control daemons an earlier daemon with --mps left, where this one runs without:
        asked to quit, not waited for (``quit`` lets the clients of jobs that outlived that
        daemon finish first, and this daemon's socket waits meanwhile)."""
        top = self.home.root / "mps"
        if self.control is None or not top.is_dir():
            return
        for device in self.candidates:
            if self.paths(device)[0].is_dir() and self._answers(device):
                log.warning(
                    "MPS: asking the control daemon left on %s to quit (%s)",
                    device.name,
                    self.reason,
                )
                self._quit(device, wait=False)

    def _quit(self, device: Device, wait: bool = True) -> None:
        try:
            self._run(device, text="quit")
            deadline = time.monotonic() + STOP_WAIT
            while wait and self._answers(device):
                if time.monotonic() > deadline:
                    log.error("MPS: the control daemon of %s did not quit", device.name)
                    return
                time.sleep(0.05)
            if wait:
                log.info("MPS: stopped the control daemon of %s", device.name)
        except (OSError, subprocess.SubprocessError) as exc:
            log.error("MPS: cannot stop the control daemon of %s: %s", device.name, exc)

    def _answers(self, device: Device) -> bool:
        """Whether the device's control daemon answers its front end."""
        if not self.paths(device)[0].is_dir():
            return False
        try:
            return self._run(device, text="get_server_list").returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def _run(self, device: Device, *args: str, text: str | None) -> subprocess.CompletedProcess:
        assert self.control is not None
        pipe, logs = self.paths(device)
        return subprocess.run(
            [self.control, *args],
            input=None if text is None else f"{text}\n".encode(),
            stdin=subprocess.DEVNULL if text is None else None,
            capture_output=True,
            env=control_environment(self.environ, device, pipe, logs),
            cwd=self.home.root,
            timeout=ANSWER_WAIT,
        )

    # ----- a job's side --------------------------------------------------------------
    def environment(
        self, user: str, devices: list[Device], others: Iterable[str]
    ) -> dict[str, str]:
        """What a job of ``user`` on ``devices`` finds set of MPS's (``others``: the users of
        the other jobs running there): its device's, where it is one device MPS serves and
        :func:`serves` lets it; else nothing (gq removes the job's own)."""
        if len(devices) != 1 or devices[0].name not in self.on or not serves(user, others):
            return {}
        device = devices[0]
        return client_environment(str(self.paths(device)[0]), self.lane_memory(device), self.lanes)


def _private_dirs(*paths: Path) -> None:
    """Each directory made (or kept) as the daemon's own, 0755: job users reach the pipe's
    sockets, which the control daemon makes; only the daemon's user writes in them."""
    for path in paths:
        path.mkdir(mode=0o755, exist_ok=True)
        if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.geteuid():
            raise OSError(f"{path} is not a directory of the daemon's own")
        os.chmod(path, 0o755)


def _said(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr or done.stdout or b"").decode(errors="replace").strip()
    return text.splitlines()[-1][:200] if text else "(nothing said)"
