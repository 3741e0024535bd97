"""What a client may ask the daemon: one module per request family, and this dispatcher.

Authorization that depends only on the request (operators alone change the node) is checked
here once, before dispatch; handlers check what depends on the job (its owner).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gq import messages
from gq.daemon.access import Caller, check_operator
from gq.daemon.handlers import control, node, query, submit
from gq.errors import UserError

if TYPE_CHECKING:
    from gq.daemon.node import Daemon

log = logging.getLogger("gq.daemon")

# handler(daemon, caller, request) -> answer, or (answer, descriptors to pass with it)
HANDLERS: dict[type, Callable[..., Any]] = {
    messages.Submit: submit.submit,
    messages.ListJobs: query.list_jobs,
    messages.ShowJob: query.show,
    messages.OpenLog: query.open_log,
    messages.ExportScript: query.export,
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
OPERATORS_ONLY = {messages.SetPolicy: "change the policy", messages.Stop: "stop the daemon"}


def dispatch(daemon: Daemon, caller: Caller, line: bytes) -> tuple[bytes, list[int]]:
    """Decode one request line, authorize it, run its handler; always an answer line."""
    try:
        request = messages.decode(line, messages.REQUESTS)
    except messages.VersionMismatch as exc:
        return _error(f"this daemon speaks protocol version {messages.VERSION} and the client "
                      f"{exc.theirs}: use the gq that matches the daemon, or restart it"), []
    except messages.MessageError as exc:
        return _error(f"malformed request: {exc}"), []
    try:
        if type(request) in OPERATORS_ONLY:
            check_operator(caller, OPERATORS_ONLY[type(request)])
        answer = HANDLERS[type(request)](daemon, caller, request)
    except UserError as exc:
        return _error(str(exc), exc.exit_code), []
    except Exception:
        log.exception("request %s from %s failed", request.kind, caller.name)
        return _error(f"the daemon failed on this {request.kind} request; its log has the "
                      "details", 1), []
    answer, fds = answer if isinstance(answer, tuple) else (answer, [])
    return messages.encode(answer), fds


def _error(message: str, exit_code: int = 2) -> bytes:
    return messages.encode(messages.Error(message, exit_code))
