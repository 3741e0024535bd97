"""A single-node Slurm of its own for the tests marked ``slurm``: munged, slurmctld and
slurmd (Debian's 22.05) as root in the foreground, with config, state, spool and munge key
in one directory, two fake GPUs (gres backed by plain files), memory enforced by
accounting (OverMemoryKill). Started once per test session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sacct")
GPU_TYPE = "fake"


def missing() -> str | None:
    """Why no Slurm can be started here, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests run slurmctld and slurmd as root"
    absent = [p for p in PROGRAMS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]
    if absent:
        return (
            f"no Slurm here ({', '.join(absent)} not found): apt-get install slurm-wlm "
            "munge, as .ci/run does"
        )
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Cluster:
    root: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.root / "slurm.conf"))

    def run(
        self, *argv: str, cwd: Path | None = None, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            cwd=cwd,
            input=input,
            env=self.env,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: rc {result.returncode}: {result.stderr}")
        return result

    def sbatch(self, script: Path | str, *options: str, cwd: Path) -> int:
        """Submit (a path, or a script's text on stdin); the Slurm job id."""
        if isinstance(script, Path):
            out = self.run("sbatch", "--parsable", *options, str(script), cwd=cwd).stdout
        else:
            out = self.run("sbatch", "--parsable", *options, cwd=cwd, input=script).stdout
        return int(out.strip().split(";")[0])

    def state(self, job_id: int | str) -> list[tuple[str, str, str]]:
        """(JobID, State, ExitCode) of the job's rows (array tasks each), from sacct-less
        scontrol: the controller keeps ended jobs for MinJobAge."""
        out = self.run("scontrol", "-o", "show", "job", str(job_id), check=False).stdout
        rows = []
        for line in out.splitlines():
            fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
            task = fields.get("ArrayTaskId")
            label = (
                f"{fields['ArrayJobId']}_{task}"
                if task and fields.get("ArrayJobId")
                else fields.get("JobId", "")
            )
            rows.append((label, fields.get("JobState", ""), fields.get("ExitCode", "")))
        return rows

    def wait_done(self, job_id: int | str, timeout: float = 90.0) -> list[tuple[str, str, str]]:
        """Wait until every row of the job has ended; its rows."""
        deadline = time.monotonic() + timeout
        while True:
            rows = self.state(job_id)
            if rows and all(
                state
                not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED")
                and not (state == "PENDING")
                for _, state, _ in rows
            ):
                return rows
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm job {job_id} did not end: {rows}\n{self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self) -> str:
        texts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                texts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(texts)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def start(root: Path) -> Cluster:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # the job's user reads nothing here, but slurmd's children chdir around
    cluster = Cluster(root)
    node = socket.gethostname().split(".")[0]
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(exist_ok=True)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "munge").chmod(0o700)
    socket_path = root / "munge" / "munge.socket"
    for index in range(2):
        (root / f"gpu{index}").write_text("")
    memory = min(4096, int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20) - 512)
    cpus = os.cpu_count() or 1
    (root / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName={node} Name=gpu Type={GPU_TYPE} File={root}/gpu[0-1]\n"
    )
    (root / "slurm.conf").write_text(f"""\
ClusterName=gqtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
MinJobAge=600
MaxArraySize=1001
KillWait=2
InactiveLimit=0
DefMemPerNode=256
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} Gres=gpu:{GPU_TYPE}:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    logs = open(root / "daemons.log", "ab")
    try:
        cluster.processes.append(
            subprocess.Popen(
                [
                    "munged",
                    "--foreground",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={socket_path}",
                    f"--pid-file={root}/munge/munged.pid",
                    f"--log-file={root}/munge/munged.log",
                    f"--seed-file={root}/munge/seed",
                ],
                stdout=logs,
                stderr=logs,
            )
        )
        _wait_for(lambda: socket_path.exists(), "munged's socket", cluster)
        for argv in (["slurmctld", "-D", "-i"], ["slurmd", "-D", "-N", node]):
            cluster.processes.append(
                subprocess.Popen(argv, stdout=logs, stderr=logs, env=cluster.env, cwd=root)
            )
        _wait_for(
            lambda: "idle" in cluster.run("sinfo", "-h", "-o", "%T", check=False).stdout,
            "the node to be idle",
            cluster,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for(condition, what: str, cluster: Cluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [p.args[0] for p in cluster.processes if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(
                f"Slurm did not start ({what}; exited: {dead}):\n"
                f"{(cluster.root / 'daemons.log').read_text()[-2000:]}\n"
                f"{cluster.log_tail()}"
            )
        time.sleep(0.2)


if __name__ == "__main__":  # start one by hand: python tests/slurm_cluster.py DIR
    import sys

    started = start(Path(sys.argv[1]).absolute())
    print(f"export SLURM_CONF={started.root}/slurm.conf  # Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        started.stop()
