"""Shared harness: a temporary GQ_HOME, the real CLI (in-process, through gq's own entry
point), and a real detached daemon with its execution hosts and workers."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import signal
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis.configuration import set_hypothesis_home_dir

from gq.cli.main import main
from gq.daemon.scheduling.scheduler import PENDING_DRIFT

ROOT = Path(__file__).resolve().parents[1]

# Hypothesis keeps its example database and a cache of constants in the working directory:
# the suite keeps them out of the repository, where the demo's test sees what lands.
set_hypothesis_home_dir(os.path.join("/tmp", f"gq-test-hypothesis-{os.getuid()}"))


def pytest_xdist_auto_num_workers(config) -> int:
    """Three workers more than CPUs: most tests spend their time waiting on jobs' iterations.
    On 2 cores, with one more, the cores were idle for 257 of 840 core-seconds; with two,
    for 46 of 630, and the suite took 314 s instead of 375. Since then more tests wait (on
    preemptions, idle timeouts, terminals): with two more the cores were still idle a tenth
    of the time. Runs one after the other, two more against three: 322 s against 302 s, and
    338 s against 328 s on a slower hour; four more took 317 s (its collection and contention
    cost more than the waits it fills)."""
    return len(os.sched_getaffinity(0)) + 3


def pytest_configure(config) -> None:
    """Every process a test starts takes SIGINT as one started at a terminal does. A suite
    started in the background (bash's '&', CI's runner) inherits SIGINT ignored, each child
    would keep it so, and a test's Ctrl-C (a signal, or ^C on a pseudo-terminal) would never
    reach gq. A caught signal is reset to its default by exec: catching it here is enough."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items) -> None:
    """The tests marked long first (in their order), the rest after: the workers take one
    test at a time, so the long ones start at once, side by side, and the short ones fill
    in around them instead of one long test running alone at the end. The short ones in a
    fixed shuffle, not file by file: a file's tests tend to wait alike (on preemptions, on
    terminals), and four of them side by side left the cores idle for a third of a minute
    of every run, where tests that compute would have used them."""

    def place(item) -> tuple[int, int]:
        if item.get_closest_marker("long"):
            return (0, 0)  # (sort is stable: the long ones keep their order)
        return (1, zlib.crc32(item.nodeid.encode()))

    items.sort(key=place)


@dataclass
class Result:
    code: int
    out: str
    err: str


def gq(*args: str) -> Result:
    """Run one gq command exactly as the console script would, capturing its output."""
    out, err = _stream(), _stream()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return Result(code, _text(out), _text(err))


def _stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode()


def gq_ok(*args: str) -> str:
    result = gq(*args)
    assert result.code == 0, f"gq {' '.join(map(str, args))} -> {result.code}: {result.err}"
    return result.out


def submit(*args: str) -> int:
    return int(gq_ok("submit", "--parsable", *args).strip())


def job(job_id: int) -> dict:
    """One job by id (for an array's id, 'gq show' lists every task: take the first)."""
    shown = json.loads(gq_ok("show", "--json", str(job_id)))
    return next(j for j in shown if j["id"] == job_id) if isinstance(shown, list) else shown


def all_jobs() -> list[dict]:
    """Every job, each array task on its own."""
    return json.loads(gq_ok("status", "--all", "--limit", "0", "--array-tasks", "--json"))


def main_in_a_new_interpreter(*line: str) -> tuple[list[str], bool]:
    """``gq LINE`` run by gq's main() in an interpreter of its own: its output's lines, and
    whether it imported typer or click (what gq.cli.quick keeps a plain line from)."""
    import subprocess

    code = (
        "import sys; from gq.cli.main import main; code = main(sys.argv[1:]); "
        "print('typer' in sys.modules or 'click' in sys.modules, code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *line],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    *output, verdict = done.stdout.splitlines()
    imported, code = verdict.split()
    assert code == "0", done.stdout
    return output, imported == "True"


def wait_for(
    predicate,
    timeout: float = 30.0,
    interval: float | None = None,
    what: str | Callable[[], str] = "condition",
):
    """``predicate()``'s first true value. Without an ``interval`` it is asked again after
    10 ms, then ever less often, up to every 100 ms: most waits are short, and a long one
    polling the daemon 20 times a second cost the suite a good part of a core. ``what`` may
    be a function, called on a timeout: what was waited for, with what was seen then."""
    deadline = time.monotonic() + timeout
    pause = 0.01 if interval is None else interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {said}")
        time.sleep(pause)
        if interval is None:
            pause = min(pause * 1.25, 0.1)


def wait_for_words(path, count: int, timeout: float = 30.0, what: str = "the file") -> list[str]:
    """The words of ``path`` once it holds ``count`` of them: a shell's ``>`` or Python's
    ``open(..., 'w')`` creates the file before it writes, so existing is not being written."""
    return wait_for(
        lambda: path.exists() and len(words := path.read_text().split()) >= count and words,
        timeout,
        what=what,
    )


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE"}


def wait_state(job_id: int, *states: str, timeout: float = 30.0) -> dict:
    """Wait for the job to reach one of ``states``; fail at once if it ends otherwise."""
    return _wait_state(job, gq, job_id, states, timeout)


def _wait_state(shown, command, job_id: int, states: tuple[str, ...], timeout: float) -> dict:
    """``shown(job_id)`` once it is in one of ``states`` (an error once it has ended in
    another). Where those are end states, ``command("wait", ...)`` (gq wait) first waits for
    the job's end: one request, where a wait that polls asks ``gq show`` ten times a second,
    each costing the daemon's CPU and the test's (and an interpreter, where run as a user).
    Not for an array's task: its id is its array's too, and gq wait would wait for them all."""
    deadline = time.monotonic() + timeout

    def reached(info: dict) -> bool:
        if info["state"] in ENDED and info["state"] not in states:
            raise AssertionError(
                f"job {job_id} ended {info['state']} ({info['reason']}) "
                f"instead of reaching {'/'.join(states)}"
            )
        return info["state"] in states

    info = shown(job_id)
    if reached(info):
        return info
    if ENDED.issuperset(states) and info["array_job_id"] is None:
        # whatever it answers (how the job ended, 124 for the time out), the state decides
        command("wait", "--timeout", str(max(1, math.ceil(timeout))), str(job_id))
    return wait_for(
        lambda: reached(info := shown(job_id)) and info,
        max(deadline - time.monotonic(), 0.1),
        what=f"job {job_id} to reach {'/'.join(states)}",
    )


# examples/kernel_train.py without torch: its iterations are gq.steps, each a sleep. For tests
# whose subject is what gq does with iterations, not how it finds them in a PyTorch script:
# importing torch costs about 3 s of CPU a job here, most of the suite's CPU when every test's
# jobs did it.
KERNEL_LOOP = (str(ROOT / "examples" / "kernel_train.py"), "--no-torch")

# kernel_train.py holds about 330M: declared, a job of it joins its lane-mates at once, not
# after the probe of its memory (which a job waiting for its start file does not finish).
DECLARED = ("--gpu-mem", "512M")


def submit_resident(go: Path, count: int, *args: str) -> list[int]:
    """Submit ``count`` jobs of examples/kernel_train.py (``args``: it and its options) and
    return their ids once all of them wait for ``go`` before their loops (not yet made)."""
    ids = [submit(*DECLARED, *args, "--start-file", str(go)) for _ in range(count)]
    wait_until_waiting(go, count)
    return ids


def wait_until_waiting(go: Path, count: int) -> None:
    """Until ``count`` kernel_train.py jobs wait for ``go``: torch imported, model built.
    A job that is merely resident may be seconds from its loop, and one started before the
    others would run alone."""
    waiting = Path(f"{go}.waiting")
    wait_for(
        lambda: waiting.exists() and len(waiting.read_text().split()) >= count,
        60,
        what=f"{count} jobs to wait for {go.name}",
    )


def start_together(go: Path, count: int) -> None:
    """Start ``count`` kernel_train.py jobs waiting for ``go`` at once."""
    wait_until_waiting(go, count)
    go.touch()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, it was read
        return False


@pytest.fixture(scope="session")
def preloaded_daemons(tmp_path_factory) -> str:
    """The socket of a server that forks daemons with their imports done (tests/preloaded.py):
    one per test process, started isolated as gq starts its daemon."""
    import subprocess

    server = tmp_path_factory.mktemp("preloaded") / "daemons.sock"
    boot = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import runpy; "
        f"runpy.run_path({str(ROOT / 'tests' / 'preloaded.py')!r}, run_name='__main__')"
    )
    process = subprocess.Popen(
        [sys.executable, "-I", "-c", boot, str(server)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    assert process.stdout.readline() == b"ready\n", "the preloaded daemon server did not start"
    yield str(server)
    process.terminate()
    process.wait(10)


@pytest.fixture
def home(tmp_path, monkeypatch, preloaded_daemons) -> Path:
    """A personal GQ_HOME; the first command that needs a daemon starts one there (forked
    from a process that has imported it: see tests/preloaded.py), and it is stopped (its jobs
    ended) when the test is over. An event of the daemon's loop that failed (it logs it and
    goes on) fails the test: nothing a test does should cause one."""
    from gq import client

    from preloaded import PreloadedDaemon

    root = tmp_path / "gqhome"
    monkeypatch.setenv("GQ_HOME", str(root))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        client,
        "spawn_daemon",
        lambda options, env, cwd, log: PreloadedDaemon(preloaded_daemons, options, env, cwd, log),
    )
    yield root
    try:
        if gq("daemon", "status").code == 0 or live_hosts(root):
            gq_ok("daemon", "stop")  # a daemon started to stop re-adopted hosts and their jobs
    finally:
        kill_what_is_left(root)
    log = root / "daemon.log"
    failed = [
        line
        for line in (log.read_text().splitlines() if log.exists() else [])
        if "(the daemon goes on)" in line or PENDING_DRIFT in line
    ]
    assert not failed, f"the daemon's loop failed: {failed[0]} (see {log})"


def kill_what_is_left(root: Path) -> None:
    """SIGKILL what still runs of the daemon of ``root`` once its stop has been tried: the
    daemon, its execution hosts and everything below them (their jobs). A stop that failed
    (a daemon that no longer answers, say) must not leave them running past the test."""
    import psutil

    from gq.daemon import pidfiles
    from gq.home import Home

    home = Home(root)
    processes = []
    for pid in [pidfiles.running_pid(home), *pidfiles.live_hosts(home)]:
        try:
            process = psutil.Process(pid) if pid is not None else None
            if process is not None:
                processes += [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    wait_for(
        lambda: not any(process.is_running() and pid_alive(process.pid) for process in processes),
        10,
        what="what was left of the daemon to die",
    )


def live_hosts(root: Path) -> list[int]:
    """Pids of the execution hosts that hold their pidfile lock under ``root``."""
    from gq.daemon import pidfiles
    from gq.home import Home

    return pidfiles.live_hosts(Home(root))


class DaemonControl:
    def __init__(self, root: Path):
        self.root = root
        self.args: list[str] = []

    def start(self, *args: str) -> int:
        self.args = list(args) or self.args
        gq_ok("daemon", "start", "--kill-wait", "1", *self.args)
        return self.pid()

    def pid(self) -> int:
        return int((self.root / "daemon.pid").read_text())

    def stop(self) -> None:
        if gq("daemon", "status").code == 0:
            gq_ok("daemon", "stop")

    def kill9(self) -> int:
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: gq("daemon", "status").code == 1, 10, what="daemon to die")
        return pid

    def log(self) -> str:
        path = self.root / "daemon.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def daemon(home):
    """A personal daemon taking turns on one lane a device: what most tests of the lanes
    hold it to (tests of --lanes auto, the default, start one without the flag)."""
    control = DaemonControl(home)
    control.start("--lanes", "1")
    yield control
    control.stop()


def cgroups_usable(kind: str, memory: bool = False) -> bool:
    """Whether jobs can be kept in cgroups of ``kind`` (auto, v2) here (``memory``: with
    a memory limit that holds). Asking makes the probe's base directories, empty: they are
    removed again, so runs leave none behind."""
    from gq.exec.cgroups import job_cgroups as cgroups

    probe = cgroups.detect(kind, "probe-" + os.urandom(4).hex())
    if probe is None:
        return False
    holds = probe.holds_memory()
    for base in probe.bases.values():
        os.rmdir(base)
    return holds or not memory


def write_script(path: Path, body: str, mode: int = 0o644) -> Path:
    path.write_text(body)
    path.chmod(mode)
    return path


PYTHON = sys.executable


# ----- the shared node: a system daemon, throwaway users, the CLI run as them -----------
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's: every user may run it (root's Python is closed)


def _shared_node_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: creates throwaway users and runs a system daemon"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "runuser"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}, an interpreter every user can run"
    return None


@dataclass
class SharedInstall:
    """gq installed where every user can run it: a venv of Debian's python3 with gq's
    dependencies (torch left out: these jobs do not import it) and a copy of the source."""

    python: str
    source: Path

    @contextlib.contextmanager
    def building(self):
        """Held while the shared venv is built or added to: parallel test workers share it."""
        with _venv_lock(Path(self.python).parents[1]):
            yield

    def env(self, system_home: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GQ_")}
        env.update(
            PYTHONPATH=str(self.source),
            GQ_SYSTEM_HOME=str(system_home),
            PYTHONDONTWRITEBYTECODE="1",
        )
        return env


@pytest.fixture(scope="session")
def shared_install(tmp_path_factory) -> SharedInstall:
    reason = _shared_node_skip_reason()
    if reason:
        pytest.skip(reason)
    import hashlib
    import subprocess
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as handle:
        needs = [
            d for d in tomllib.load(handle)["project"]["dependencies"] if not d.startswith("torch")
        ]
    # Kept between runs (keyed by the dependency list).
    key = hashlib.sha256("\n".join(needs).encode()).hexdigest()[:12]
    venv = Path(f"/tmp/gq-test-venv-{key}")
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import typer, sqlalchemy, alembic, psutil"]
    with _venv_lock(venv):
        if not python.exists() or subprocess.run(probe, capture_output=True).returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
            install_from_here(str(python), needs)
    base = tmp_path_factory.mktemp("shared-node")
    source = base / "src"
    for part in ("gq", "migrations"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    # Compiled once for every user's processes (none of them may write it there).
    subprocess.run([str(python), "-m", "compileall", "-q", str(source)], check=True)
    _open_to_all(base)
    return SharedInstall(str(python), source)


def install_from_here(python: str, needs: list[str]) -> None:
    """Give ``python``'s venv the distributions ``needs`` (requirement strings) as this
    interpreter has them installed: hard links of their files (and of what they require)
    in a directory its site-packages names in a .pth file. That took 9 s for gq's
    dependencies and torch together on a loaded machine, where pip took 181 s for torch's
    900 MB alone. Where a file cannot be linked (another filesystem) or a distribution is not
    installed here, pip installs them."""
    import subprocess

    venv = Path(python).parents[1]
    linked = venv / "linked"
    if _link_installed(needs, linked):
        site = subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "gq-test-linked.pth").write_text(f"{linked}\n")
        return
    # (What was linked stays: pip installs into site-packages, which comes first.)
    subprocess.run([python, "-m", "ensurepip", "-q"], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", *needs], check=True)


def _link_installed(needs: list[str], into: Path) -> bool:
    """Hard-link the installed files of ``needs`` and everything they require into ``into``
    (the files' own modes kept: root's, readable by all); False where one cannot be."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo, seen = [Requirement(need) for need in needs], set()
    try:
        while todo:
            need = todo.pop()
            name = canonicalize_name(need.name)
            if name in seen or (need.marker is not None and not need.marker.evaluate()):
                continue
            seen.add(name)
            dist = metadata.distribution(need.name)
            for file in dist.files or ():
                if ".." in file.parts:  # console scripts, in bin/: not needed by imports
                    continue
                target = into / file
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    os.link(dist.locate_file(file), target)
            todo.extend(Requirement(r) for r in dist.requires or ())
    except (metadata.PackageNotFoundError, OSError):
        return False
    return True


@contextlib.contextmanager
def _venv_lock(venv: Path):
    import fcntl

    with open(f"{venv}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _open_to_all(path: Path) -> None:
    """Let every user reach ``path`` (and the pytest directories above it)."""
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o755)
    for directory, _, files in os.walk(path):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    workdir: Path


class SharedNode:
    """A system daemon under GQ_SYSTEM_HOME, and the real CLI run as root or as a user."""

    def __init__(self, install: SharedInstall, root: Path, operators: str):
        self.install = install
        self.root = root
        self.operators = operators
        self.env = install.env(root)

    def run(
        self, user: User | None, *args: str, cwd: Path | None = None, timeout: float = 60
    ) -> Result:
        import subprocess

        argv = [self.install.python, "-m", "gq", *map(str, args)]
        if user is not None:
            argv = [
                "runuser",
                "-u",
                user.name,
                "--",
                "env",
                *[f"{k}={v}" for k, v in self.env.items()],
                *argv,
            ]
        done = subprocess.run(
            argv,
            env=self.env,
            capture_output=True,
            text=True,
            cwd=cwd or (user.workdir if user else self.root.parent),
            timeout=timeout,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def start(self, *options: str) -> None:
        """Start the system daemon as root, with the suite's options and ``options``: one
        lane a device, as the personal daemon fixture's (jobs that take turns there are what
        the tests of shares hold to; --lanes auto would run them side by side)."""
        self.ok(
            None,
            "daemon",
            "start",
            "--system",
            "--lanes",
            "1",
            "--kill-wait",
            "1",
            "--operators",
            self.operators,
            "--priority-cap",
            "5",
            *options,
        )

    def ok(self, user: User | None, *args: str, **kwargs) -> str:
        result = self.run(user, *args, **kwargs)
        assert result.code == 0, f"gq {' '.join(map(str, args))} -> {result.code}: {result.err}"
        return result.out

    def job(self, job_id: int) -> dict:
        return json.loads(self.ok(None, "show", "--json", job_id))

    def wait_state(self, job_id: int, *states: str, timeout: float = 30) -> dict:
        return _wait_state(
            self.job,
            lambda *line: self.run(None, *line, timeout=timeout + 30),
            job_id,
            states,
            timeout,
        )


def _make_user(base: Path, name: str, groups: list[str]) -> User:
    import pwd
    import subprocess

    subprocess.run(
        [
            "useradd",
            "-m",
            "-d",
            str(base / name),
            "-s",
            "/bin/sh",
            *(["-G", ",".join(groups)] if groups else []),
            name,
        ],
        check=True,
    )
    entry = pwd.getpwnam(name)
    (base / name).chmod(0o755)
    return User(name, entry.pw_uid, entry.pw_gid, base / name / "work")


@pytest.fixture(scope="session")
def accounts(shared_install, tmp_path_factory):
    """Throwaway users for the session: alice and bob (plain users), carol (in the operator
    group), removed at the end."""
    import subprocess
    import uuid

    tag = uuid.uuid4().hex[:6]
    group = f"gqops{tag}"
    base = tmp_path_factory.mktemp("users")
    _open_to_all(base)
    subprocess.run(["groupadd", group], check=True)
    made: list[str] = []
    try:
        people = {}
        for short, groups in (("alice", []), ("bob", []), ("carol", [group])):
            name = f"gq{short[:3]}{tag}"
            people[short] = _make_user(base, name, groups)
            made.append(name)
        people["operators"] = group
        yield people
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


@pytest.fixture
def users(accounts, tmp_path):
    """The throwaway users, each with a fresh working directory for this test (job ids
    start again in every test's queue, and so would their output files)."""
    import dataclasses

    fresh = {"operators": accounts["operators"]}
    for key in ("alice", "bob", "carol"):
        user = accounts[key]
        workdir = user.workdir.parent / tmp_path.name
        workdir.mkdir()
        os.chown(workdir, user.uid, user.gid)
        fresh[key] = dataclasses.replace(user, workdir=workdir)
    return fresh


@pytest.fixture
def shared_node(shared_install, users, tmp_path):
    root = tmp_path / "system"
    node = SharedNode(shared_install, root, users["operators"])
    _open_to_all(tmp_path)
    node.start()
    yield node
    try:
        node.run(None, "daemon", "stop")
    finally:
        kill_what_is_left(root)
