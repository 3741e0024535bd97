"""Fair share by user, with memory: each user's lane time, decayed with the node's half-life
(``--fair-half-life``, a day unless set, as Slurm's fair-share decays usage), charged as the
hosts report their jobs' attained time and kept in the queue (``user_usage``), in the same
transaction as the jobs' progress, so that a user's use outlives their jobs and the daemon.

Usage is what the hosts billed (lane time as the host observed it, never a job's word).
Each run is charged what it attained beyond what it was charged before; after a restart a
running job's last recorded attained time was charged already. The hosts are sent, for each
user with jobs resident there, the usage beside those jobs (:meth:`Ledger.beside`): a
policy adds what the resident jobs attain meanwhile (``gq.policies.fair``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select

from gq.policies.fair import decayed
from gq.queue.engine import Transaction
from gq.queue.models import UserUsage


@dataclass
class Account:
    """Lane seconds used, as of ``at`` (wall clock), decaying from then on."""

    used: float = 0.0
    at: float = 0.0

    def now(self, now: float, half_life: float) -> float:
        return decayed(self.used, now - self.at, half_life)

    def add(self, seconds: float, now: float, half_life: float) -> None:
        self.used = self.now(now, half_life) + seconds
        self.at = now


@dataclass
class Charged:
    """What one run has been charged: its attained time so far, and that time as it counts
    in its owner's usage now (decayed alike)."""

    attained: float = 0.0
    share: Account | None = None


class Ledger:
    """Every user's usage; loaded from the queue once, written back as it is charged."""

    def __init__(self, half_life: float):
        self.half_life = half_life
        self.accounts: dict[str, Account] = {}
        self.changed: set[str] = set()

    def load(self, session: Transaction) -> None:
        for row in session.scalars(select(UserUsage)):
            self.accounts[row.user] = Account(row.usage, row.updated)

    def usage(self, user: str, now: float | None = None) -> float:
        account = self.accounts.get(user)
        if account is None:
            return 0.0
        return account.now(time.time() if now is None else now, self.half_life)

    def usages(self, now: float | None = None) -> dict[str, float]:
        """Every user's usage now, most first."""
        when = time.time() if now is None else now
        found = {user: a.now(when, self.half_life) for user, a in self.accounts.items()}
        return dict(sorted(found.items(), key=lambda item: (-item[1], item[0])))

    def charge(self, user: str, run: Charged, attained: float, now: float) -> None:
        """A run of ``user``'s has attained so much (its host's word, which is the host's own
        observation): what it had not been charged goes on the user's account."""
        more = attained - run.attained
        if not more > 0:  # (NaN too: a figure the wire let through is never charged)
            return
        run.attained = attained
        if run.share is None:
            run.share = Account(at=now)
        run.share.add(more, now, self.half_life)
        self.accounts.setdefault(user, Account(at=now)).add(more, now, self.half_life)
        self.changed.add(user)

    def save(self, session: Transaction) -> None:
        """Write the accounts charged since the last save (in the caller's transaction)."""
        for user in sorted(self.changed):
            account = self.accounts[user]
            session.merge(UserUsage(user=user, usage=account.used, updated=account.at))
        self.changed.clear()

    def beside(self, runs: Iterable[tuple[str, Charged]], now: float) -> dict[str, float]:
        """For each user of ``runs`` (the runs resident on one host), their usage beside
        those runs: what a host's policy adds its residents' attained time to."""
        shares: dict[str, float] = {}
        for user, run in runs:
            if user not in shares:
                shares[user] = self.usage(user, now)
            if run.share is not None:
                shares[user] -= run.share.now(now, self.half_life)
        return {user: max(0.0, value) for user, value in shares.items()}
