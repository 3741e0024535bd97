"""Each request to its handler: decoded, authorized, run, and answered in one line.

Authorization that depends only on the request (operators alone change the node) is checked
here once, before dispatch; handlers check what depends on the job (its owner). Handlers see
the daemon only through :class:`~gq.daemon.serving.handlers.node_view.NodeView`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gq import defaults, messages
from gq.daemon.forecasts.forecasting import WhatIf
from gq.daemon.serving.access import Caller, check_operator
from gq.daemon.serving.handlers import control, node, query, submit
from gq.daemon.serving.listings import Listing
from gq.daemon.serving.waiting import Waiting
from gq.errors import UserError

if TYPE_CHECKING:
    from gq.daemon.serving.handlers.node_view import NodeView

log = logging.getLogger("gq.daemon")


# handler(node, caller, request) -> answer, or (answer, descriptors to pass with it)
HANDLERS: dict[type, Callable[..., Any]] = {
    messages.Submit: submit.submit,
    messages.ListJobs: query.list_jobs,
    messages.ShowJob: query.show,
    messages.OpenLog: query.open_log,
    messages.ExportScript: query.export,
    messages.Wait: query.wait,
    messages.Suspend: control.suspend,
    messages.SignalJob: control.signal_job,
    messages.Drain: node.drain,
    messages.ResumeDevices: node.resume_devices,
    messages.Cancel: control.cancel,
    messages.Hold: control.hold,
    messages.Release: control.release,
    messages.Requeue: control.requeue,
    messages.Update: control.update,
    messages.SetPolicy: node.set_policy,
    messages.GetPolicy: node.get_policy,
    messages.NodeInfoRequest: node.info,
    messages.Stop: node.stop,
}
OPERATORS_ONLY: dict[type, str] = {
    messages.SetPolicy: "change the policy",
    messages.Stop: "stop the daemon",
    messages.Drain: "drain devices",
    messages.ResumeDevices: "resume devices",
    # A suspended job's time limit stops: a user could hold a device forever.
    messages.Suspend: "suspend or resume jobs",
}


def dispatch(
    daemon: NodeView, caller: Caller, line: bytes
) -> tuple[bytes, list[int]] | Waiting | WhatIf | Listing:
    """Decode one request line, authorize it, run its handler; always an answer line,
    whatever the line held and whatever the handler did, or a :class:`Waiting` (gq wait:
    the answer comes once the jobs have ended), a :class:`WhatIf` (gq submit --test-only:
    it comes with the next forecast) or a :class:`Listing` (a big listing: a child makes
    it)."""
    try:
        request = messages.decode(line, messages.REQUESTS)
    except messages.VersionMismatch as exc:
        return _error(
            f"this daemon speaks protocol version {defaults.PROTOCOL_VERSION} and "
            f"the client {str(exc.theirs)[:40]}: use the gq that matches the daemon, or "
            "restart it"
        ), []
    except messages.MessageError as exc:
        return _error(f"malformed request: {exc}"), []
    fds: list[int] = []
    try:
        if type(request) in OPERATORS_ONLY:
            check_operator(caller, OPERATORS_ONLY[type(request)])
        answer = HANDLERS[type(request)](daemon, caller, request)
        if isinstance(answer, (Waiting, WhatIf, Listing)):
            return answer
        answer, fds = answer if isinstance(answer, tuple) else (answer, [])
        return messages.encode(answer), fds
    except UserError as exc:
        _close(fds)
        return _error(str(exc), exc.exit_code), []
    except Exception:  # noqa: BLE001 - a request must not take the daemon down
        _close(fds)
        log.exception("request %s from %s failed", request.kind, caller.name)
        return _error(
            f"the daemon failed on this {request.kind} request; its log has the details", 1
        ), []


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _error(message: str, exit_code: int = 2) -> bytes:
    """An error answer: one printable line, whatever of the request it quotes."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    return messages.encode(messages.Error(line, exit_code))
