"""What each value on gq's wires may be: the field types that messages between client,
daemon, host and worker share (see :mod:`gq.codec` for how they are checked)."""

from __future__ import annotations

from typing import Annotated

from gq import defaults
from gq.codec import INT64_MAX, Bounds, Count, MaxLen, Pid, Positive, Where

__all__ = ["Count", "Positive", "Pid"]

JobId = Annotated[int, Bounds(1, INT64_MAX)]
Priority = Annotated[int, Bounds(-defaults.MAX_PRIORITY, defaults.MAX_PRIORITY)]
TimeLimit = Annotated[int, Bounds(1, defaults.MAX_TIME_LIMIT)]  # seconds
Timestamp = Annotated[float, Bounds(0.0, defaults.MAX_TIMESTAMP)]  # seconds since the epoch
Seconds = Annotated[float, Bounds(0.0, float(defaults.MAX_TIME_LIMIT) * 10)]  # a measured span
Gpus = Annotated[int, Bounds(0, defaults.MAX_GPUS)]
Cpus = Annotated[int, Bounds(1, defaults.MAX_CPUS)]
HostMemory = Annotated[int, Bounds(1, defaults.MAX_HOST_MEM)]  # bytes
ExitCode = Annotated[int, Bounds(0, 255 + 128)]
Signal = Annotated[int, Bounds(1, 255)]
Umask = Annotated[int, Bounds(0, 0o777)]
Lane = Annotated[int, Bounds(0, 1 << 16)]
Tasks = Annotated[int, Bounds(1, defaults.MAX_PIDS_CEILING)]  # a cgroup's pids.max

Name = Annotated[str, MaxLen(defaults.MAX_NAME)]
Path = Annotated[str, MaxLen(defaults.MAX_PATH)]
Text = Annotated[str, MaxLen(defaults.MAX_TEXT)]
Arg = Annotated[str, MaxLen(defaults.MAX_JOB_PAYLOAD)]
EnvKey = Annotated[str, MaxLen(defaults.MAX_NAME * 4), Where("^[^=]+$", "a name without '='")]
# Room beyond what a submission may carry for what gq adds at launch (its own PYTHONPATH
# entry), so that every job the daemon accepted also fits the host's wire.
EnvValue = Annotated[str, MaxLen(defaults.MAX_JOB_PAYLOAD + 2 * defaults.MAX_PATH)]
Environment = Annotated[dict[EnvKey, EnvValue], MaxLen(defaults.MAX_JOB_PAYLOAD // 2)]
Args = Annotated[list[Arg], MaxLen(defaults.MAX_JOB_PAYLOAD // 2)]
CommandLine = Annotated[str, MaxLen(defaults.MAX_COMMAND)]  # as the user gave it (shlex)
Groups = Annotated[list[Annotated[int, Bounds(0, (1 << 32) - 2)]], MaxLen(65536)]
Uid = Annotated[int, Bounds(0, (1 << 32) - 2)]
# A CUDA interprocess event's handle (64 bytes), in lower-case hex: a worker's at its release,
# passed to the next holder of its lane only where both are one user's (gq.exec.lane.handover).
EventHandle = Annotated[
    str, MaxLen(128), Where(r"\A[0-9a-f]{128}\Z", "an event handle: 64 bytes in hex")
]
