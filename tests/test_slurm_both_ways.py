"""Scripts move both ways between gq and a real Slurm (Debian's 22.05, one node of its own
started once per session, see slurm_cluster.py): gq jobs exported with ``gq export slurm``
run on Slurm with the results they had under gq, and typical cluster scripts run under gq
unchanged with the results they have on Slurm."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster
from conftest import DaemonControl, gq, gq_ok, job, submit, wait_state, write_script

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = slurm_cluster.missing()
    if reason:
        pytest.skip(reason)
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


def _outputs(directory: Path, pattern: str) -> dict[str, str]:
    """The text of each output file matching ``pattern`` (a regex with one group, the part
    of the name that is not an id), then the files removed, so the other side's land alone."""
    found = {}
    for path in sorted(directory.iterdir()):
        match = re.fullmatch(pattern, path.name)
        if match:
            found[match.group(1)] = path.read_text()
            path.unlink()
    return found


def _results(tmp_path: Path, spaced: Path, project: Path) -> dict:
    """What the jobs of the export test left, taken away for the other side's run."""
    results = {
        "array": _outputs(spaced, r"arr-\d+_(\d)\.out"),
        "venv": _outputs(project, r"(venv)-\d+\.out"),
        "fits": _outputs(tmp_path, r"(fits)-\d+\.out"),
        "exclusive": _outputs(tmp_path, r"(excl)-\d+\.out"),
        "order": (tmp_path / "order.log").read_text(),
    }
    (tmp_path / "order.log").unlink()
    return results


@pytest.mark.long
def test_scripts_move_both_ways_between_gq_and_a_real_slurm(slurm, home, tmp_path, monkeypatch):
    """Both directions in one test, so that one xdist worker alone starts a Slurm."""
    (tmp_path / "out").mkdir()
    (tmp_path / "in").mkdir()
    monkeypatch.chdir(tmp_path / "out")
    _jobs_exported_from_gq_run_on_slurm_with_the_same_results(slurm, tmp_path / "out")
    gq_ok("daemon", "stop")
    _cluster_scripts_run_under_gq_unchanged(slurm, home, tmp_path / "in", monkeypatch)


def _jobs_exported_from_gq_run_on_slurm_with_the_same_results(slurm, tmp_path):
    spaced = tmp_path / "dir with space"
    spaced.mkdir()
    array = write_script(
        spaced / "task.sh",
        (
            'echo "task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT name=$SLURM_JOB_NAME '
            'gq=$GQ_ARRAY_TASK_ID"\n'
        ),
    )
    step = write_script(
        tmp_path / "step.sh", (f'sleep 0.2\necho "$SLURM_JOB_NAME" >> "{tmp_path}/order.log"\n')
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "helper.py").write_text("VALUE = 'from the sibling module'\n")
    venv = tmp_path / "venv"
    subprocess.run(
        [
            "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable,
            "-m",
            "venv",
            "--without-pip",
            str(venv),
        ],
        check=True,
    )
    main = write_script(
        project / "main.py",
        (
            "import sys\nimport helper\n"
            "print(helper.VALUE, sys.prefix == sys.base_prefix and 'system' or 'venv', "
            "sys.argv[1:])\n"
        ),
    )
    memory = write_script(
        tmp_path / "mem.sh",
        (
            f'{sys.executable} -c "b = bytearray($1 << 20); import time; time.sleep($2); '
            "print('held', len(b) >> 20)\"\n"
        ),
    )
    plain = write_script(tmp_path / "plain.sh", 'echo "exclusive ran"\n')

    jobs = {
        "array": submit(
            "-J",
            "my array",
            "--array",
            "0-4%2",
            "-o",
            "arr-%A_%a.out",
            "-D",
            str(spaced),
            str(array),
        ),
        "venv": submit(
            "--python",
            str(venv / "bin" / "python"),
            "-o",
            "venv-%j.out",
            "-D",
            str(project),
            str(main),
            "--lr",
            "3e-4",
        ),
        "fits": submit(
            "--gpu-mem",
            "256M",
            "--host-mem",
            "300M",
            "-o",
            "fits-%j.out",
            "--deadline",
            "now+1day",
            "-t",
            "5:00",
            str(memory),
            "100",
            "0",
        ),
        "exclusive": submit("-G", "1", "--exclusive", "-o", "excl-%j.out", str(plain)),
    }
    first = submit("-J", "one", str(step))
    second = submit("-J", "two", "--dependency", f"afterok:{first}", str(step))
    third = submit("-J", "three", "--dependency", f"afterany:{second}", str(step))
    # Slurm samples memory each second (OverMemoryKill): held long enough to be seen.
    over = submit("--host-mem", "150M", "-o", "over-%j.out", str(memory), "400", "3")
    for job_id in [*jobs.values(), first, second, third]:
        wait_state(job_id, "COMPLETED", timeout=60)
    assert wait_state(over, "FAILED", timeout=30)["exit_code"] != 0  # its cgroup's limit
    under_gq = _results(tmp_path, spaced, project)
    assert under_gq["array"]["3"] == "task=3 of 5 name=my array gq=3\n"
    assert under_gq["venv"]["venv"] == "from the sibling module venv ['--lr', '3e-4']\n"
    assert under_gq["order"].split() == ["one", "two", "three"]

    exported = {name: gq("export", "slurm", str(job_id)) for name, job_id in jobs.items()}
    for name, result in exported.items():
        assert result.code == 0, (name, result.err)
    assert "#SBATCH --array=0-4%2" in exported["array"].out
    assert '#SBATCH --job-name="my array"' in exported["array"].out
    assert f'#SBATCH --chdir="{spaced}"' in exported["array"].out
    assert "#SBATCH --mem=300M" in exported["fits"].out
    assert "#SBATCH --gres=gpu:1" in exported["fits"].out
    assert "# gq --gpu-mem 256.0M" in exported["fits"].out
    assert "#SBATCH --deadline=" in exported["fits"].out
    assert "--exclusive" not in exported["exclusive"].out.replace("# gq --exclusive", "")
    assert f"exec {venv}/bin/python {main} --lr 3e-4" in exported["venv"].out
    over_script = tmp_path / "over.sbatch"
    over_script.write_text(gq_ok("export", "slurm", str(over)))
    over_id = slurm.sbatch(over_script, cwd=tmp_path)
    submitted = []
    for name, result in exported.items():
        script = tmp_path / f"{name}.sbatch"
        script.write_text(result.out)
        submitted.append(slurm.sbatch(script, cwd=tmp_path))
    chain = gq("export", "slurm", str(third), str(first), str(second))
    assert chain.code == 0, chain.err
    (tmp_path / "chain.sh").write_text(chain.out)
    ran = slurm.run("bash", str(tmp_path / "chain.sh"), cwd=tmp_path)
    slurm_ids = re.findall(r"\d+", ran.stdout.split("are Slurm jobs")[1])
    for slurm_id in [*submitted, *slurm_ids]:
        slurm.wait_done(slurm_id)
    assert slurm.wait_done(over_id)[0][1] in ("OUT_OF_MEMORY", "FAILED", "CANCELLED")
    on_slurm = _results(tmp_path, spaced, project)
    assert on_slurm == under_gq, slurm.log_tail()
    lone = gq("export", "slurm", str(second))
    assert lone.code == 2 and f"depends on job(s) {first}" in lone.err and lone.out == ""


CLUSTER_SCRIPTS = {
    # GPU training launched with srun, as most cluster batch scripts are.
    "train.sbatch": (
        "#!/bin/bash\n#SBATCH -J train\n#SBATCH --gres=gpu:1\n#SBATCH -c 2 --mem=1G\n"
        "#SBATCH -t 0:10:00\n#SBATCH -N 1 -n 1\n#SBATCH -o %x-%j.out\n"
        "cd $SLURM_SUBMIT_DIR\n"
        "srun python3 train.py --epochs 2\n"
    ),
    # Two GPUs of a type, one torchrun launching a process per GPU.
    "dist.sbatch": (
        "#!/bin/bash\n#SBATCH --job-name=dist --gres=gpu:fake:2 --ntasks-per-node=1 --mem=2G\n"
        "#SBATCH --output=%x-%j.out --error=%x-%j.err\n"
        "srun torchrun --standalone --nproc_per_node=2 dist.py\n"
    ),
    "array.sbatch": (
        "#!/bin/bash\n#SBATCH --array=1-3\n#SBATCH -J prep\n#SBATCH -o %x_%A_%a.out\n"
        'echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT ($SLURM_ARRAY_TASK_MIN-'
        '$SLURM_ARRAY_TASK_MAX) on $SLURM_JOB_NODELIST"\n'
    ),
    # CPU-only preprocessing: no GPU asked for, so none visible.
    "cpu.sbatch": (
        "#!/bin/bash\n#SBATCH -J cpu -c 2 --mem-per-cpu=200M -t 5 -o %x-%j.out\n"
        "#SBATCH --partition=debug --account=lab --mail-type=END\n"
        'echo "cpus=$SLURM_CPUS_PER_TASK gpus=${CUDA_VISIBLE_DEVICES:-none}"\n'
    ),
    # Resumable: requeued on a node failure, warned before its limit (which it does not
    # reach here: Slurm may send the warning only at its next half-minute check).
    "resume.sbatch": (
        "#!/bin/bash\n#SBATCH -J resume --requeue --signal=B:USR1@30 -t 2 -o %x-%j.out\n"
        "trap 'echo \"checkpointed on USR1\"; exit 0' USR1\n"
        "start=$(cat ckpt 2>/dev/null || echo 0)\n"
        "for i in $(seq $start 4); do sleep 0.1; done\n"
        'echo "steps $start-4, restarts=${SLURM_RESTART_COUNT:-0}"\n'
    ),
}
TRAIN = (
    "import os, sys\n"
    "print('train', sys.argv[1:], 'proc', os.environ['SLURM_PROCID'], 'of',\n"
    "      os.environ['SLURM_NTASKS'], 'cpus', os.environ['SLURM_CPUS_PER_TASK'],\n"
    "      'name', os.environ['SLURM_JOB_NAME'], 'in',\n"
    "      os.getcwd() == os.environ['SLURM_SUBMIT_DIR'])\n"
)
DIST = (
    "import torch, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "value = torch.tensor([dist.get_rank() + 1.0])\n"
    "dist.all_reduce(value)\n"
    "print(f'rank {dist.get_rank()} of {dist.get_world_size()} sum {int(value.item())}\\n',\n"
    "      end='', flush=True)\n"
    "dist.destroy_process_group()\n"
)


def _normalised(directory: Path) -> dict[str, str]:
    """Each output's name and text with job ids (which differ by system) as ID."""
    found = {}
    for path in directory.glob("*.out"):
        name = (
            re.sub(r"\d{2,}|(?<=[-_])\d(?=[._])", "ID", path.name)
            if "prep" not in path.name
            else re.sub(r"_\d+_", "_ID_", path.name)
        )
        found[name] = "".join(sorted(path.read_text().splitlines(keepends=True)))
    return found


def _cluster_scripts_run_under_gq_unchanged(slurm, home, tmp_path, monkeypatch):
    DaemonControl(home).start("--cpu-devices", "2", "--device-model", "Fake GPU")
    sides = {}
    for side in ("slurm", "gq"):
        directory = tmp_path / side
        directory.mkdir()
        (directory / "train.py").write_text(TRAIN)
        (directory / "dist.py").write_text(DIST)
        for name, text in CLUSTER_SCRIPTS.items():
            write_script(directory / name, text)
        sides[side] = directory
    slurm_ids = [
        slurm.sbatch(sides["slurm"] / name, cwd=sides["slurm"]) for name in CLUSTER_SCRIPTS
    ]
    monkeypatch.chdir(sides["gq"])
    submitted = {name: gq("submit", "--parsable", name) for name in CLUSTER_SCRIPTS}
    for name, result in submitted.items():
        assert result.code == 0, (name, result.err)
    # What gq cannot do as Slurm would is said, one line each; nothing else.
    assert submitted["train.sbatch"].err == ""
    assert submitted["cpu.sbatch"].err.count("ignored") == 2  # --partition, --account
    assert "--mail-type: this node has no mail command" in submitted[
        "cpu.sbatch"
    ].err or shutil.which("mail")
    assert "ask for no GPU, so it runs with -G 0" in submitted["resume.sbatch"].err
    for name, result in submitted.items():
        info = wait_state(int(result.out), "COMPLETED", "FAILED", timeout=90)
        assert info["state"] == "COMPLETED", (name, info, gq_ok("logs", result.out.strip()))
    shown = job(int(submitted["dist.sbatch"].out))
    assert shown["gpus"] == 2 and shown["gpu_type"] == "fake"
    for slurm_id in slurm_ids:
        assert all(state == "COMPLETED" for _, state, _ in slurm.wait_done(slurm_id)), (
            slurm.log_tail()
        )
    under_gq, on_slurm = _normalised(sides["gq"]), _normalised(sides["slurm"])
    assert len(on_slurm) == 7  # train, dist, three array tasks, cpu, resume
    assert under_gq == on_slurm
    _srun_and_slurm_tools_in_a_gq_job_never_reach_the_cluster(slurm, tmp_path, monkeypatch)


def _srun_and_slurm_tools_in_a_gq_job_never_reach_the_cluster(slurm, tmp_path, monkeypatch):
    """With a real cluster's configuration in its environment, a gq job's srun runs its
    tasks in the job, and its scontrol is gq's: it answers for the job itself and refuses a
    job of the cluster (Slurm's own tools would refuse its SLURM_JOB_ID, beyond any
    cluster's ids, rather than act on one)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.root / "slurm.conf"))
    script = write_script(
        tmp_path / "probe.sh",
        (
            "srun -n 2 sh -c 'echo step $SLURM_PROCID'\n"
            "scontrol show job $SLURM_JOB_ID | head -n 1 | cut -d ' ' -f 1\n"
            "scontrol requeue 1 2> /dev/null; echo requeue=$?\n"
            'echo "id=$SLURM_JOB_ID gq=$GQ_JOB_ID"\n'
        ),
    )
    before = sorted(slurm.run("squeue", "-h", "-a", "-t", "all", "-o", "%i").stdout.split())
    job_id = submit("-G", "1", "-o", str(tmp_path / "probe-%j.out"), str(script))
    wait_state(job_id, "COMPLETED", timeout=30)
    out = (tmp_path / f"probe-{job_id}.out").read_text().splitlines()
    assert sorted(out[:2]) == ["step 0", "step 1"]
    assert out[2:4] == [f"JobId={10_000_000_000 + job_id}", "requeue=1"]
    assert out[4] == f"id={10_000_000_000 + job_id} gq={job_id}"
    # No job or step appeared on the cluster (squeue lists in no fixed order).
    assert sorted(slurm.run("squeue", "-h", "-a", "-t", "all", "-o", "%i").stdout.split()) == before
