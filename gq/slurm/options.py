"""sbatch's options beside gq's: the one map read by ``#SBATCH`` lines, by ``gq submit``
(whose options of the same name mean the same) and by ``gq export slurm`` (pure).

In ``#SBATCH`` lines ``--mem`` is host memory, as on a cluster; gq's device memory is
``--gpu-mem``. On gq's own command line and in ``#GQ`` lines ``--mem`` is still the old
spelling of ``--gpu-mem``, with a warning (see :data:`DEPRECATED_MEM`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gq.errors import UserError


@dataclass(frozen=True)
class Option:
    sbatch: tuple[str, ...]  # its spellings in sbatch, short one first
    gq: str | None  # gq submit's option that carries it; None: gq does not use it
    takes_value: bool
    slurm_meaning: str
    gq_meaning: str
    single: str | None = None  # for gq=None: the one value gq runs with anyway (-N 1)


OPTIONS: tuple[Option, ...] = (
    Option(("-J", "--job-name"), "--job-name", True, "job name", "job name (%x)"),
    Option(
        ("-G", "--gpus"),
        "--gpus",
        True,
        "GPUs for the job, [TYPE:]N",
        "devices, [TYPE:]N: 0 none, 1 one shared device, N>1 whole devices; TYPE matched "
        "to the device model",
    ),
    Option(
        ("--gpus-per-node",),
        "--gpus-per-node",
        True,
        "GPUs on each node, [TYPE:]N",
        "as --gpus (one node)",
    ),
    Option(
        ("--gres",),
        "--gres",
        True,
        "generic resources, e.g. gpu:a100:2",
        "its gpu[:TYPE][:N] part as --gpus; other resources are not used",
    ),
    Option(
        ("--mem",),
        "--host-mem",
        True,
        "real memory per node (0: all of it)",
        "host memory, the limit of the job's cgroup (0: no limit)",
    ),
    Option(
        ("--mem-per-cpu",),
        "--mem-per-cpu",
        True,
        "real memory per CPU",
        "host memory: this times --cpus-per-task",
    ),
    Option(
        ("--mem-per-gpu",),
        "--mem-per-gpu",
        True,
        "real memory per GPU",
        "host memory: this times the devices asked for",
    ),
    Option(
        ("-c", "--cpus-per-task"),
        "--cpus-per-task",
        True,
        "CPUs per task",
        "CPUs the job may use (SLURM_CPUS_PER_TASK; its cgroup's CPU quota where v2)",
    ),
    Option(("-t", "--time"), "--time", True, "time limit (UNLIMITED: none)", "time limit"),
    Option(
        ("--begin",),
        "--begin",
        True,
        "not started before this time",
        "pending (BeginTime) until this time",
    ),
    Option(
        ("--deadline",),
        "--deadline",
        True,
        "removed if it cannot end by then",
        "removed (DEADLINE) if it cannot end by then",
    ),
    Option(
        ("--signal",),
        "--signal",
        True,
        "[B:]SIG[@SECONDS]: SIG that long (60) before "
        "the time limit, to the job's steps (B: its batch shell alone)",
        "the same: B: the job's main process; else the tasks srun started, or where "
        "there are none the main process alone, never what these fork for themselves",
    ),
    Option(("-o", "--output"), "--output", True, "stdout file pattern", "stdout file pattern"),
    Option(("-e", "--error"), "--error", True, "stderr file pattern", "stderr file pattern"),
    Option(("-D", "--chdir"), "--chdir", True, "working directory", "working directory"),
    Option(("-a", "--array"), "--array", True, "job array, 0-99%8", "job array, 0-99%8"),
    Option(
        ("-d", "--dependency"), "--dependency", True, "afterok:ID..., after, afterany", "the same"
    ),
    Option(
        ("--requeue",),
        "--requeue",
        False,
        "requeue after a node failure",
        "requeue when its host dies",
    ),
    Option(
        ("--exclusive",),
        "--exclusive",
        False,
        "the whole node, shared with no job",
        "whole devices, shared with no job",
    ),
    Option(("-H", "--hold"), "--hold", False, "submitted held", "submitted held"),
    Option(
        ("--nice",),
        "--priority",
        True,
        "lower priority by N (negative: admins only)",
        "--priority -N",
    ),
    Option(
        ("-w", "--nodelist"),
        None,
        True,
        "the nodes to run on",
        "this node (gq's own -w names devices)",
        single="",
    ),
    Option(
        ("--mail-type",),
        "--mail-type",
        True,
        "mail at BEGIN, END, FAIL, REQUEUE, ALL",
        "the same, through this node's mail command",
    ),
    Option(("--mail-user",), "--mail-user", True, "whom to mail [the submitter]", "the same"),
    Option(("-N", "--nodes"), None, True, "nodes", "one node", single="1"),
    Option(
        ("-n", "--ntasks"),
        "--ntasks",
        True,
        "tasks (srun starts as many)",
        "the same: SLURM_NTASKS, the copies the job's srun starts",
    ),
    Option(("--ntasks-per-node",), "--ntasks", True, "tasks per node", "as --ntasks (one node)"),
    Option(
        ("--gpus-per-task",), "--gpus", True, "GPUs per task, [TYPE:]N", "as --gpus (for one task)"
    ),
)
BY_SBATCH: dict[str, Option] = {name: option for option in OPTIONS for name in option.sbatch}
BY_GQ: dict[str, Option] = {}  # the first option of each gq name: its own sbatch spelling
for _option in OPTIONS:
    if _option.gq:
        BY_GQ.setdefault(_option.gq, _option)
DEPRECATED_MEM = (
    "--mem on gq's command line and in #GQ lines is device memory, as before; "
    "write --gpu-mem (in #SBATCH lines and on a cluster --mem is host memory)"
)
_NICE_DEFAULT = "100"  # sbatch's adjustment for a bare --nice


def sbatch_name(gq_option: str) -> str:
    """The long sbatch spelling of a gq option they share (``--host-mem`` -> ``--mem``)."""
    return BY_GQ[gq_option].sbatch[-1]


def translate(tokens: list[str], node: str = "") -> tuple[list[str], list[str]]:
    """gq submit's tokens for one ``#SBATCH`` line, and one notice per option gq does not
    use (``--partition``, ``--gres=tmpfs:10G``): it says what is ignored and why. ``node``
    is this node's name, which ``-w`` may name without a word."""
    out: list[str] = []
    notices: list[str] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        name, equals, value = token.partition("=")
        has_equals = bool(equals)
        if not has_equals and len(name) > 2 and name[0] == "-" and name[1] != "-":
            name, value, has_equals = name[:2], name[2:], True  # -Jgo, -c4
        option = BY_SBATCH.get(name)
        if option is None:
            if not has_equals and index < len(tokens) and not tokens[index].startswith("-"):
                index += 1  # its value
            notices.append(f"{name} is not used by gq (one node, its own devices); ignored")
            continue
        if option.takes_value and not has_equals:
            if name == "--nice" and (index >= len(tokens) or tokens[index].startswith("-")):
                value = _NICE_DEFAULT
            elif index < len(tokens):
                value, index = tokens[index], index + 1
            else:
                raise UserError(f"#SBATCH {name} needs a value")
        if option.gq is None:
            if value.strip() not in (option.single, node if name in ("-w", "--nodelist") else None):
                notices.append(f"{name}={value}: gq runs {option.gq_meaning}; ignored")
        elif name == "--gres":
            gpus, others = split_gres(value)
            if gpus is not None:
                out += ["--gres", gpus]
            notices += [f"--gres={other}: gq has no such resource; ignored" for other in others]
        elif name == "--nice":
            number = value.strip()
            out += [
                "--priority",
                str(-int(number)) if re.fullmatch(r"-?\d{1,9}", number) else number,
            ]
        elif name == "--exclusive":
            out.append("--exclusive")  # =user and =mcs narrow whom Slurm lets share the node
        else:
            out += [option.gq, value] if option.takes_value else [option.gq]
    return out, notices


GPU_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")  # what a type may be: a100, rtx_4090
_GPUS = re.compile(rf"^(?:(?P<type>{GPU_TYPE.pattern}):)?(?P<count>\d{{1,6}})$")
_GRES_GPU = re.compile(rf"^gpu(?::(?P<type>{GPU_TYPE.pattern}))?(?::(?P<count>\d{{1,6}}))?$")


def split_gres(text: str) -> tuple[str | None, list[str]]:
    """The gpu part of a --gres list (``gpu:a100:2``), and the others."""
    gpus: list[str] = []
    others: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        (gpus if part == "gpu" or part.startswith("gpu:") else others).append(part)
    if len(gpus) > 1:
        raise UserError(f"invalid --gres {text!r}: name gpu once")
    return (gpus[0] if gpus else None), others


@dataclass(frozen=True)
class Gpus:
    count: int
    type: str | None = None


def parse_gpus(text: str, flag: str = "--gpus") -> Gpus:
    """``--gpus [TYPE:]N`` (also --gpus-per-node)."""
    match = _GPUS.match(text.strip())
    if not match:
        raise UserError(f"invalid {flag} {text[:40]}: give a count, or TYPE:COUNT such as a100:2")
    return Gpus(int(match["count"]), match["type"])


def parse_gres(text: str) -> Gpus:
    """``--gres gpu[:TYPE][:N]`` (N defaults to 1, as in Slurm)."""
    gpus, others = split_gres(text)
    if others:
        raise UserError(
            f"invalid --gres {text!r}: gq has only gpu (gpu[:TYPE][:N]); not {', '.join(others)}"
        )
    match = _GRES_GPU.match(gpus or "")
    if not match:
        raise UserError(f"invalid --gres {text!r}: use gpu[:TYPE][:N], such as gpu:a100:2")
    return Gpus(int(match["count"] or 1), match["type"])


def is_unlimited(text: str) -> bool:
    """sbatch's spellings of no time limit (0 among them)."""
    return text.strip().lower() in ("unlimited", "infinite", "-1", "0")


@dataclass(frozen=True)
class WarnSignal:
    """sbatch's --signal: ``number`` sent ``before`` seconds before the time limit, to the
    job's main process alone (``batch``), or else to its steps: the tasks srun started, or
    the main process where there are none."""

    number: int
    before: int = 60
    batch: bool = False

    def __str__(self) -> str:
        return f"{'B:' if self.batch else ''}{self.number}@{self.before}"


_SIGNAL = re.compile(
    r"^(?:(?P<where>[BR]{1,2}):)?(?P<sig>[A-Za-z0-9]{1,12})(?:@(?P<time>\d{1,5}))?$"
)


def parse_signal(text: str) -> WarnSignal:
    """``[{R|B}:]SIG[@SECONDS]`` as sbatch takes it: SIG a name (USR1, SIGUSR1) or number,
    SECONDS 0 to 65535 (60 when left out); R (a reservation's end) means nothing here."""
    import signal as signals

    match = _SIGNAL.match(text.strip())
    number = None
    if match:
        name = match["sig"].upper()
        if name.isdigit():
            number = int(name)
        else:
            known = getattr(signals, name if name.startswith("SIG") else f"SIG{name}", None)
            number = int(known) if isinstance(known, signals.Signals) else None
    if (
        match is None
        or number is None
        or not 1 <= number < signals.NSIG
        or int(match["time"] or 60) > 65535
    ):
        raise UserError(
            f"invalid --signal {text[:40]}: use [B:]SIG[@SECONDS], such as "
            "B:USR1@120 (SIG a name or number, SECONDS up to 65535)"
        )
    return WarnSignal(number, int(match["time"] or 60), "B" in (match["where"] or ""))
