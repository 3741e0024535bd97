"""Who may do what (pure): anyone lists the queue; a job's owner or an operator acts on
the job; only operators change the node. The caller's identity comes from the kernel."""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from gq.errors import Refused


@dataclass(frozen=True)
class Caller:
    uid: int
    gid: int
    name: str
    operator: bool


@dataclass(frozen=True)
class Rules:
    daemon_uid: int  # the daemon's own user: root in system mode, the owner in personal mode
    operator_group: str | None = None
    priority_cap: int | None = None  # None: no cap (personal mode)

    def identify(self, uid: int, gid: int) -> Caller:
        """The caller behind a connection, from its kernel-reported uid and gid."""
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return Caller(uid, gid, name, self._is_operator(uid, gid, name))

    def _is_operator(self, uid: int, gid: int, name: str) -> bool:
        if uid in (0, self.daemon_uid):
            return True
        if self.operator_group is None:
            return False
        try:
            group = grp.getgrnam(self.operator_group)
        except KeyError:
            return False
        try:
            groups = os.getgrouplist(name, gid)
        except OSError:
            groups = [gid]
        return group.gr_gid in groups or name in group.gr_mem


def check_may_act(caller: Caller, owner_uid: int | None, owner: str, verb: str, label: str) -> None:
    """Refused unless the caller owns the job or is an operator."""
    if caller.operator or caller.uid == owner_uid:
        return
    raise Refused(f"job {label} belongs to {owner}: only its owner or an operator may {verb} it")


def check_operator(caller: Caller, what: str) -> None:
    if not caller.operator:
        raise Refused(
            f"only an operator (root or the daemon's operator group) may {what}; "
            f"{caller.name} is not one"
        )


def check_priority(
    rules: Rules, caller: Caller, wanted: int, current: int | None, label: str | None = None
) -> None:
    """Above the node's cap only operators go; anyone may lower their own job's priority."""
    if rules.priority_cap is None or caller.operator or wanted <= rules.priority_cap:
        return
    if current is not None and wanted <= current:
        return
    where = f" for job {label}" if label else ""
    raise Refused(
        f"--priority {wanted}{where} is above this node's cap of "
        f"{rules.priority_cap} for users; ask an operator"
    )


def check_may_raise(
    rules: Rules, caller: Caller, option: str, wanted: int, current: int | None, label: str
) -> None:
    """A job's priority or time limit (``current``; None is no limit) goes up only by an
    operator's hand: its owner may lower it. A job started on a short limit (backfilled
    before a reservation, say) keeps the promise it was admitted on."""
    if caller.operator or current is None or wanted <= current:
        return
    raise Refused(
        f"only an operator may raise job {label}'s {option} (from {current} to "
        f"{wanted}); {caller.name} may lower it"
    )
