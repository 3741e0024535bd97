"""What a client may ask the daemon, and what it answers: every request and answer is a
dataclass defined once in this package, used by both ends (as pueue's client and daemon
share ``pueue_lib``'s message types): requests in :mod:`gq.messages.requests`, answers in
:mod:`gq.messages.answers`, the records both carry (a job, a device, a report's line) in
:mod:`gq.messages.records`. Every one of them is a name of this package too
(``messages.Submit``, ``messages.JobInfo``): the package is the wire's one vocabulary.

On the wire each message is one line of JSON, ``{"v": VERSION, "kind": ..., fields...}``
(VERSION: ``defaults.PROTOCOL_VERSION``), one request and one answer per connection over
the daemon's Unix stream socket.
:func:`decode` checks the version, the kind and every field's type and range (see
:mod:`gq.codec`), and rejects anything else in one place, so handlers only ever see
well-formed messages. This package imports nothing beyond the standard library and gq's
codec; ``gq status`` and ``gq submit`` send their requests' fields without it
(gq/client.py's ``ask_plain``), and the daemon checks them here as it checks any.
"""

from __future__ import annotations

from typing import Any

from gq import codec, defaults
from gq.codec import MessageError
from gq.messages.answers import (
    Delay,
    Done,
    EndedJob,
    Error,
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
    Line,
    MemoryBasis,
    OnOutOfMemory,
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
    "DeviceProcess",
    "DeviceReading",
    "EventInfo",
    "JobInfo",
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
    "Jobs",
    "LogFile",
    "NodeInfo",
    "NodeLimits",
    "PolicyInfo",
    "Report",
    "Script",
    "Submitted",
    "TestOnly",
    "WaitOver",
]


class VersionMismatch(codec.VersionMismatch):
    """The other end speaks another protocol version than this gq's."""

    def __init__(self, theirs: object):
        super().__init__(theirs, defaults.PROTOCOL_VERSION)


REQUESTS: dict[str, type] = {
    cls.kind: cls
    for cls in (
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
    )
}
ANSWERS: dict[str, type] = {
    cls.kind: cls
    for cls in (
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
    )
}


# ----- the codec ----------------------------------------------------------------------
def encode(message: Any) -> bytes:
    """One line: the version, the kind, then the fields."""
    data = {"v": defaults.PROTOCOL_VERSION, "kind": message.kind}
    data.update(codec.to_wire(message))
    return codec.dumps(data)


def decode(line: bytes, kinds: dict[str, type]) -> Any:
    """The message a line holds, every field checked; MessageError otherwise."""
    data = codec.loads(line)
    if data.get("v") != defaults.PROTOCOL_VERSION:
        raise VersionMismatch(data.get("v"))
    kind = data.pop("kind", None)
    del data["v"]
    if not isinstance(kind, str) or kind not in kinds:
        raise MessageError(f"unknown kind {str(kind)[:40]!r}")
    return codec.build(kinds[kind], data, kind)
