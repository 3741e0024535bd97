"""What a client may ask the daemon, and what it answers: every request and answer is a
msgspec struct defined once in this package, used by both ends (as pueue's client and daemon
share ``pueue_lib``'s message types): requests in :mod:`gq.messages.requests`, answers in
:mod:`gq.messages.answers`, the records both carry (a job, a device, a report's line) in
:mod:`gq.messages.records`. Every one of them is a name of this package too
(``messages.Submit``, ``messages.JobInfo``): the package is the wire's one vocabulary.

On the wire each message is one line of JSON, ``{"kind": ..., fields..., "v": VERSION}``
(VERSION: ``defaults.PROTOCOL_VERSION``), one request and one answer per connection over
the daemon's Unix stream socket.
:func:`decode` checks the version, the kind and every field's type and range (see
:mod:`gq.codec`), and rejects anything else in one place, so handlers only ever see
well-formed messages. Importing msgspec takes about as long as Python takes to start, so
``gq status`` and ``gq submit`` send their requests' fields without this package
(gq/client.py's ``ask_plain``), and the daemon checks them here as it checks any.
"""

from __future__ import annotations

from typing import Any

from gq import codec, defaults
from gq.codec import MessageError, VersionMismatch
from gq.messages.answers import (
    DaemonMemory,
    Delay,
    Done,
    EndedJob,
    Error,
    FairShare,
    Jobs,
    LogFile,
    NodeInfo,
    NodeLimits,
    PolicyInfo,
    Report,
    Script,
    Submitted,
    TestOnly,
    WaitOver,
)
from gq.messages.records import (
    INFO,
    REFUSED,
    WARNING,
    DeviceInfo,
    DeviceProcess,
    DeviceReading,
    EventInfo,
    JobInfo,
    LaneSharing,
    Line,
    MemoryBasis,
    OnOutOfMemory,
    RunInfo,
)
from gq.messages.requests import (
    SIGNALS_TO_JOBS,
    Cancel,
    Drain,
    ExportScript,
    GetPolicy,
    Hold,
    ListJobs,
    NodeInfoRequest,
    OpenLog,
    Release,
    Requeue,
    ResumeDevices,
    SetPolicy,
    ShowJob,
    SignalJob,
    Stop,
    Submit,
    SubmitOptions,
    Suspend,
    Update,
    Wait,
)

__all__ = [
    "MessageError",
    "VersionMismatch",
    "encode",
    "decode",
    "REQUESTS",
    "ANSWERS",
    # records
    "INFO",
    "WARNING",
    "REFUSED",
    "DeviceInfo",
    "LaneSharing",
    "DeviceProcess",
    "DeviceReading",
    "EventInfo",
    "JobInfo",
    "RunInfo",
    "Line",
    "MemoryBasis",
    "OnOutOfMemory",
    # requests
    "SIGNALS_TO_JOBS",
    "Cancel",
    "Drain",
    "ExportScript",
    "GetPolicy",
    "Hold",
    "ListJobs",
    "NodeInfoRequest",
    "OpenLog",
    "Release",
    "Requeue",
    "ResumeDevices",
    "SetPolicy",
    "ShowJob",
    "SignalJob",
    "Stop",
    "Submit",
    "SubmitOptions",
    "Suspend",
    "Update",
    "Wait",
    # answers
    "Delay",
    "Done",
    "EndedJob",
    "Error",
    "FairShare",
    "Jobs",
    "LogFile",
    "NodeInfo",
    "NodeLimits",
    "DaemonMemory",
    "PolicyInfo",
    "Report",
    "Script",
    "Submitted",
    "TestOnly",
    "WaitOver",
]


REQUESTS = codec.Wire(
    Submit,
    ListJobs,
    ShowJob,
    OpenLog,
    ExportScript,
    Wait,
    Cancel,
    Hold,
    Release,
    Requeue,
    Update,
    SetPolicy,
    GetPolicy,
    NodeInfoRequest,
    Stop,
    Drain,
    ResumeDevices,
    Suspend,
    SignalJob,
    version=defaults.PROTOCOL_VERSION,
)
ANSWERS = codec.Wire(
    WaitOver,
    Submitted,
    TestOnly,
    Jobs,
    LogFile,
    Script,
    Report,
    PolicyInfo,
    NodeInfo,
    Done,
    Error,
    version=defaults.PROTOCOL_VERSION,
)


def encode(message: Any) -> bytes:
    """One line: the kind, the fields, the version."""
    return codec.encode(message)


def decode(line: bytes, wire: codec.Wire) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    return wire.decode(line)
