"""``scontrol`` inside a gq job: what training frameworks and cluster scripts call from
within their own job (Lightning's requeue on its time-limit signal, a script reading its
own state), answered by the daemon that runs the job, never by a Slurm controller.

Understood: ``requeue ID`` (as ``gq requeue``), ``show job ID`` (Slurm's ``Key=Value``
lines; ``-o`` on one line), ``show hostnames [LIST]`` and ``update JobId=ID TimeLimit=T``
(as ``gq update --time``, which lets a user lower their own job's limit). ID must be the
calling job's own, in any of its spellings (``$SLURM_JOB_ID``, the array form
``$SLURM_ARRAY_JOB_ID_$SLURM_ARRAY_TASK_ID``, gq's id); the daemon checks besides that
the caller owns it. Anything else is refused with one line and exit status 1.

The job's PATH finds a shim the daemon wrote (:func:`gq.slurm.environment.scontrol_shim`)
that runs :func:`main` with the daemon's interpreter and gq, whatever interpreter or
virtual environment the job itself has.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass

from gq.errors import UserError
from gq.slurm.environment import PARTITION, node_name, slurm_id
from gq.units import format_duration, parse_duration

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from collections.abc import Mapping

    from gq.client import Fields
    from gq.home import Home
    from gq.messages import JobInfo

NAME = "scontrol (gq)"
MAX_HOSTNAMES = 10_000  # what one hostlist may expand to
USAGE = (
    "inside a gq job scontrol understands: requeue ID, show job ID, show hostnames "
    "[LIST], update JobId=ID TimeLimit=TIME (ID: this job's, $SLURM_JOB_ID)"
)


class Refusal(UserError):
    """What the shim will not do, in one line (exit status 1, as scontrol's errors)."""

    exit_code = 1


@dataclass(frozen=True)
class OwnJob:
    """The calling job: its gq id and every spelling of its id a caller may give."""

    id: int
    spellings: frozenset[str]

    @property
    def slurm(self) -> str:
        return slurm_id(self.id)


@dataclass(frozen=True)
class Requeue:
    pass


@dataclass(frozen=True)
class ShowJob:
    one_line: bool


@dataclass(frozen=True)
class ShowHostnames:
    hostlist: str | None  # None: the job's own node list


@dataclass(frozen=True)
class SetTimeLimit:
    seconds: int


Command = Requeue | ShowJob | ShowHostnames | SetTimeLimit


def own_job(environ: Mapping[str, str]) -> OwnJob:
    """The job this process belongs to, from the variables gq gave it."""
    text = environ.get("GQ_JOB_ID", "")
    if not text.isdigit() or len(text) > 12:
        raise Refusal(
            "runs only inside a gq job, which sets GQ_JOB_ID; outside one use gq "
            "(gq show, gq requeue, gq update)"
        )
    job_id = int(text)
    spellings = {str(job_id), slurm_id(job_id)}
    array, task = environ.get("GQ_ARRAY_JOB_ID", ""), environ.get("GQ_ARRAY_TASK_ID", "")
    if array.isdigit() and task.isdigit() and len(array) <= 12:
        spellings |= {f"{array}_{task}", f"{slurm_id(int(array))}_{task}"}
    return OwnJob(job_id, frozenset(spellings))


def parse(argv: list[str], own: OwnJob) -> Command:
    """The command ``argv`` asks for, its job id checked to be ``own``; Refusal otherwise."""
    one_line = any(arg in ("-o", "--oneliner") for arg in argv)
    words = [arg for arg in argv if arg not in ("-o", "--oneliner", "-d", "--details")]
    verb = words[0].lower() if words else ""
    if verb == "requeue" and len(words) == 2:
        _check_own(words[1], own)
        return Requeue()
    if verb == "show" and len(words) >= 2 and words[1].lower() in ("job", "jobid"):
        if len(words) != 3:
            raise Refusal(
                f"show job: give this job's id (scontrol show job {own.slurm}); "
                "inside a gq job scontrol shows its own job alone"
            )
        _check_own(words[2], own)
        return ShowJob(one_line)
    if verb == "show" and len(words) in (2, 3) and words[1].lower() == "hostnames":
        return ShowHostnames(words[2] if len(words) == 3 else None)
    if verb == "update" and len(words) >= 2:
        return _update(words[1:], own)
    shown = " ".join(argv)[:60]
    raise Refusal(f"'{shown}' is not understood; {USAGE}" if shown else USAGE)


def _update(pairs: list[str], own: OwnJob) -> SetTimeLimit:
    fields = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals:
            raise Refusal(f"update: {pair[:40]!r} is not KEY=VALUE; give JobId=ID TimeLimit=TIME")
        fields[key.lower()] = value
    job = fields.pop("jobid", None) or fields.pop("job", None)
    limit = fields.pop("timelimit", None)
    if job is None or limit is None or fields:
        raise Refusal(
            "update: only JobId=ID TimeLimit=TIME can be updated from inside a gq "
            "job (gq update changes the rest)"
        )
    _check_own(job, own)
    try:
        return SetTimeLimit(parse_duration(limit))
    except UserError as exc:
        raise Refusal(f"update: {exc}") from None


def _check_own(text: str, own: OwnJob) -> None:
    if text not in own.spellings:
        raise Refusal(
            f"job {text[:40]} is not this job ({own.slurm}): inside a gq job "
            "scontrol acts on its own job alone"
        )


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist expression as names: ``node[01-03,7],gpu`` is node01, node02,
    node03, node7, gpu (brackets may repeat within a name; zero padding is kept)."""
    names: list[str] = []
    for part in _top_level(text):
        names.extend(_expanded(part, MAX_HOSTNAMES - len(names), text))
    return names


def _top_level(text: str) -> list[str]:
    """The comma-separated parts of a hostlist, commas inside brackets left in place."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise Refusal(f"invalid hostlist {text[:60]!r}: unbalanced brackets")
        if char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise Refusal(f"invalid hostlist {text[:60]!r}: unbalanced brackets")
    parts.append(text[start:])
    if any(not part for part in parts):
        raise Refusal(f"invalid hostlist {text[:60]!r}: an empty name")
    return parts


_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")


def _expanded(part: str, room: int, whole: str) -> list[str]:
    """One name of a hostlist, its first bracket expanded and the rest after it in turn;
    Refusal beyond ``room`` names."""
    opening = part.find("[")
    if opening < 0:
        if room < 1:
            raise Refusal(f"hostlist {whole[:60]!r} names more than {MAX_HOSTNAMES} hosts")
        return [part]
    closing = part.index("]", opening)
    values: list[str] = []
    for item in part[opening + 1 : closing].split(","):
        match = _RANGE.match(item)
        if match is None or int(match[2] or match[1]) < int(match[1]):
            raise Refusal(
                f"invalid hostlist {whole[:60]!r}: {item[:20]!r} is not a range such as 01-04"
            )
        low, high, width = int(match[1]), int(match[2] or match[1]), len(match[1])
        if len(values) + high - low + 1 > room:
            raise Refusal(f"hostlist {whole[:60]!r} names more than {MAX_HOSTNAMES} hosts")
        values.extend(f"{number:0{width}d}" for number in range(low, high + 1))
    names: list[str] = []
    for value in values:
        names.extend(
            _expanded(part[:opening] + value + part[closing + 1 :], room - len(names), whole)
        )
    return names


def show_job(job: JobInfo | Fields, now: float, one_line: bool = False) -> str:
    """The job as ``scontrol show job`` prints it: the fields scripts read, Slurm's names,
    spellings and units (times local, durations [D-]HH:MM:SS), ids as SLURM_JOB_ID has
    them. One line per group, indented, as Slurm's; or all on one line. The shim reads the
    job's fields as attributes (it may run under an interpreter without msgspec to decode
    a JobInfo)."""
    from gq.cli.render import elapsed, short_time

    state = "SUSPENDED" if job.suspended else job.state
    started = job.start_time is not None
    if job.end_time is not None:
        end = short_time(job.end_time)
    elif job.start_time is not None and job.time_limit is not None:
        # Slurm's: when its limit ends it
        end = short_time(job.start_time + job.time_limit)
    else:
        end = "Unknown"
    code = job.exit_code or 0
    cpus = job.cpus or os.cpu_count() or 1  # without -c nothing holds it to fewer
    limit = format_duration(job.time_limit, padded=True) if job.time_limit else "UNLIMITED"
    groups = [
        [f"JobId={slurm_id(job.id)}", f"JobName={job.name}"],
        [f"UserId={job.user}({job.uid if job.uid is not None else '?'})"],
        [f"Priority={job.priority}", f"Partition={PARTITION}"],
        [f"JobState={state}", f"Reason={_reason(job)}", f"Dependency={job.dependency or '(null)'}"],
        [
            f"Requeue={int(job.requeue)}",
            f"Restarts={_restarts(job)}",
            f"ExitCode={code if code >= 0 else 0}:{-code if code < 0 else 0}",
        ],
        [f"RunTime={format_duration(elapsed(job, now) or 0, padded=True)}", f"TimeLimit={limit}"],
        [f"SubmitTime={short_time(job.submit_time)}"],
        [f"StartTime={short_time(job.start_time) if started else 'Unknown'}", f"EndTime={end}"],
        [f"NodeList={node_name() if started else '(null)'}"],
        ["NumNodes=1", f"NumCPUs={cpus}", f"NumTasks={job.ntasks or 1}", f"CPUs/Task={cpus}"],
        [f"Command={' '.join([job.script or '', *(job.args or [])]).strip() or '(null)'}"],
        [f"WorkDir={job.workdir or '(null)'}"],
        [f"StdErr={job.stderr or '(null)'}"],
        ["StdIn=/dev/null"],
        [f"StdOut={job.stdout or '(null)'}"],
    ]
    if job.array_job_id is not None:
        groups[0] += [
            f"ArrayJobId={slurm_id(job.array_job_id)}",
            f"ArrayTaskId={job.array_task_id}",
        ]
    if one_line:
        return " ".join(field for group in groups for field in group)
    return "\n".join(
        ("" if index == 0 else "   ") + " ".join(group) for index, group in enumerate(groups)
    )


def _reason(job: JobInfo | Fields) -> str:
    """Slurm's one-word reason: a pending job's (gq's reason starts with squeue's code);
    None for any other."""
    if job.state != "PENDING" or not job.reason:
        return "None"
    return re.split(r"[\s(]", job.reason, maxsplit=1)[0] or "None"


def _restarts(job: JobInfo | Fields) -> int:
    """How often it was requeued: every run but the current one (a pending job's runs all
    ended in a requeue)."""
    return job.run_count if job.state == "PENDING" else max(0, job.run_count - 1)


def run(argv: list[str], environ: Mapping[str, str], home: Home) -> str:
    """Carry out ``argv`` for the calling job; what to print (Slurm's scontrol prints
    nothing for a requeue or an update)."""
    own = own_job(environ)
    command = parse(argv, own)
    if isinstance(command, ShowHostnames):
        hostlist = command.hostlist or environ.get("SLURM_JOB_NODELIST") or node_name()
        return "\n".join(expand_hostlist(hostlist))
    # Plain requests: the shim runs under the job's interpreter, which may lack msgspec.
    from gq import client

    label = str(own.id)
    if isinstance(command, ShowJob):
        answer = client.ask_plain("show", {"label": label}, "jobs", home)  # an array: all
        mine = next(job for job in answer["jobs"] if job["id"] == own.id)
        return show_job(client.Fields(mine), time.time(), command.one_line)
    if isinstance(command, Requeue):
        report = client.ask_plain("requeue", {"labels": [label]}, "report", home)
    else:
        asked = {"labels": [label], "time_limit": command.seconds}
        report = client.ask_plain("update", asked, "report", home)
    refused = [line["text"] for line in report["lines"] if line["level"] == "refused"]
    if refused:
        raise Refusal(refused[0])
    return ""


def main(argv: list[str], root: str, mode: str) -> int:
    """The shim's entry: the daemon of the state directory ``root`` (in ``mode``) answers."""
    import signal

    from gq.home import Home

    # The stop a requeue sets off reaches this process too (it is the job's): its exit
    # status must be the daemon's answer, as Slurm's scontrol returns once it is given.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        text = run(argv, os.environ, Home(root, mode))
    except UserError as exc:
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 1
    if text:
        print(text)
    return 0
