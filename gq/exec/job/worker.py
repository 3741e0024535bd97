"""Worker bootstrap: ``python -m gq.exec.job.worker SNAPSHOT [ARGS]...``.

Connects to its execution host over the socket inherited as fd ``GQ_WORKER_FD``, installs
the boundary hooks, then runs the snapshot of the user's script as ``__main__`` under the
name it was submitted with (``GQ_SCRIPT``): ``__file__``, ``sys.argv[0]``, ``sys.path[0]``
and tracebacks name the user's file, exactly as ``python script.py`` would, with no gq
frames above the script's own. At an acquire it sends READY and blocks until GO (or, alone
on its lane, takes the lane's lock: gq.exec.lane.lease); at a release it waits until the device
has run the iteration's work (gq.exec.lane.device_sync), then sends DONE with its step count and
memory figures (or lets the lock go) and runs on; where its grant allowed a gapless hand-over,
it sends the DONE at once with an interprocess event instead (gq.exec.lane.handover).
"""

from __future__ import annotations

import builtins
import linecache
import os
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable

from gq import defaults
from gq.exec.job import hooks, worker_memory
from gq.exec.job import session as job_session
from gq.exec.job.worker_link import READY, WorkerChannel
from gq.exec.lane import device_sync
from gq.exec.lane.lease import SharedPage, WorkerLease
from gq.validation import INT64_MAX

_PLACE = {kind: place for place, kind in enumerate(job_session.COUNTED_FIRST)}


class WorkerSession:
    """The job side of the protocol (see :mod:`gq.exec.job.session`); safe to call from
    several threads: one READY/GO exchange at a time."""

    def __init__(
        self, channel: WorkerChannel, memory_cap: int | None = None, page: SharedPage | None = None
    ):
        self.channel = channel
        self.device = device_sync.DeviceWork()
        self.lease = WorkerLease(page, self.device) if page is not None else None
        self.memory_cap = memory_cap  # bytes of device memory its CUDA allocations may hold
        self.lock = threading.RLock()
        self.held = False
        self.empty_cache_after = False
        self.hand_over = False  # its last Go let its release hand the lane over gaplessly
        self.counts = dict.fromkeys(job_session.COUNTED_FIRST, 0)
        # What is reported: explicit steps if any, else optimizer steps, else hand-written
        # training steps, else evaluation batches (the count of the first kind counted, in
        # COUNTED_FIRST's order; kept as steps are counted, read at every boundary).
        self.steps = 0
        self.counted = len(job_session.COUNTED_FIRST)  # that kind's place in the order
        self.reported = 0
        self.sample = worker_memory.MemorySample(0, 0)
        self.sampled_at = 0.0
        self.detached = False
        self.at_finish: list = []  # what runs as the script ends (the hooks' last boundary)
        self.ending = None  # the hooks' way to end an iteration now, where they are installed
        # Sections a console's Ctrl-C waits out (``interrupted``), nested: an exchange with
        # the host (READY to GO, release to DONE) and the hooks' count of the calls inside
        # an iteration. Raised in the middle, it would leave worker, hooks and host
        # disagreeing about who holds the lane; it is raised as the outermost one ends.
        # Signals come to the main thread alone: only its sections count.
        self.holding = 0
        self.interrupted = False
        self.main_thread = threading.main_thread().ident
        # A forked child (a DataLoader worker, say) must not speak on its parent's socket.
        os.register_at_fork(after_in_child=self._detach)

    def _detach(self) -> None:
        self.detached = True
        job_session.active = None

    def acquire(self) -> None:
        if self.held or self.detached:
            return
        with self.lock:
            if self.held:
                return
            self.hold_interrupts()  # (before a held-back DONE or the READY goes)
            try:
                lease = self.lease
                kept = self._settle()
                if lease is not None and lease.take(self.steps, kept):
                    self.held = True
                else:
                    self._ask()
            finally:
                self.let_interrupts()
                if not self.held:  # no grant came: an interrupt held back goes with it
                    self.interrupted = False
        self.raise_held_back()  # held: the statement's end gives the lane back

    def _ask(self) -> None:
        """READY, then wait for the GO."""
        self.channel.send_line(READY)
        grant = self.channel.receive_grant()
        # Lanes short of memory: give back cached blocks when parked.
        self.empty_cache_after = grant.empty_cache
        if grant.mem_cap is not None:
            self.cap_memory(grant.mem_cap)
        if grant.lease and self.lease is not None:
            self.lease.granted(grant.lease, self.steps)
        self.hand_over = grant.hand_over
        if grant.after is not None:  # the previous holder's tail may still be running
            try:
                self.device.wait_on(bytes.fromhex(grant.after))
            except ValueError:
                pass  # (the host sends only handles it checked)
        self.held = True

    def hold_interrupts(self) -> None:
        """A section begins that a console's Ctrl-C waits out (on the main thread, where
        signals come; elsewhere nothing): end it with :meth:`let_interrupts`, in a
        ``finally``, on the same thread."""
        if threading.get_ident() == self.main_thread:
            self.holding += 1

    def let_interrupts(self) -> None:
        if threading.get_ident() == self.main_thread:
            self.holding -= 1

    def raise_held_back(self) -> None:
        """A Ctrl-C that came during a section, raised once the outermost one is over (on
        the main thread, whose sections held it back)."""
        if self.interrupted and not self.holding and threading.get_ident() == self.main_thread:
            self.interrupted = False
            raise KeyboardInterrupt

    def cap_memory(self, cap: int) -> None:
        """Hold its CUDA allocations to ``cap`` bytes from now on (its probe's figure); before
        torch is imported, the hooks apply it as they are installed."""
        self.memory_cap = cap
        torch = sys.modules.get("torch")
        if torch is not None:
            worker_memory.cap_devices(torch, cap)

    def count_step(self, kind: str) -> None:
        if self.detached:  # (its lock may have been held as it was forked)
            return
        with self.lock:
            counts = self.counts
            counts[kind] += 1
            place = _PLACE[kind]
            if place <= self.counted:
                self.counted, self.steps = place, counts[kind]

    def release(self) -> None:
        if self.detached:
            return
        with self.lock:
            self.hold_interrupts()
            try:
                self._release()
            finally:
                self.let_interrupts()
        self.raise_held_back()

    def _release(self) -> None:
        """The DONE (or the lease's release, or the steps taken outside a grant)."""
        steps = self.steps
        lease = self.lease
        if not self.held:
            if steps != self.reported:  # steps taken outside a grant (released loops)
                self.reported = steps
                self.channel.send("progress", steps=steps)
            return
        self.held = False
        now = time.monotonic()
        if now - self.sampled_at >= defaults.MEMORY_SAMPLE_PERIOD:
            self.sample, self.sampled_at = worker_memory.sample(), now
        if self.empty_cache_after:
            worker_memory.release_cached()
        self.reported = steps
        sample = self.sample
        figures = self._done_figures(steps)
        if lease is not None and lease.active:
            # Alone, one iteration ahead of its device; in a slice beside jobs waiting for
            # the lane, none (asked back meanwhile: seen just below).
            self.device.wait_kept(0 if lease.page.paced() else defaults.LEASE_AHEAD)
            if lease.release(steps, sample.persistent, sample.peak):
                return  # (the lock goes once the device has run the iteration)
            # Asked back (a slice's end, say): a Done ends the lease, its lock let go once
            # the device has run the iteration, so that the host never finds it free first.
            if not self._hand_over(figures, self._give_and_drain):
                lease.hand_back()  # (the device waited for)
                self.channel.send("done", **figures)
            return
        if self._hand_over(figures, self._send_drained):
            return

        # The lane passes on once the device has run what this iteration queued: the
        # host hears of the release then, from a thread that waits for the device,
        # while this one runs on (its gap's work beside the device's tail).
        def send_done() -> None:
            self.channel.send("done", **figures)

        self.device.then(send_done)

    def _hand_over(self, figures: dict, drained: Callable[[], None]) -> bool:
        """Gapless, where the last Go allowed it and the device can: the Done goes now with
        an event after the iteration's work, which a successor of the same user waits on on
        its device, and ``drained`` once the device has run it (the host hears then too: a
        successor of another user waits for that). False: nothing was sent."""
        if not self.hand_over or (handle := self.device.hand_over()) is None:
            return False
        self.channel.send("done", event=handle.hex(), **figures)
        self.device.then(drained)
        return True

    def _send_drained(self) -> None:
        self.channel.send("drained")

    def _give_and_drain(self) -> None:
        assert self.lease is not None  # (only a lease's hand-over drains so)
        self.lease.page.give()
        self.channel.send("drained")

    def end_iteration(self) -> None:
        """A console's statement is over: whatever iteration it left open ends here (through
        the hooks, where they are installed, so that they agree), and the lane goes to other
        jobs until a statement uses the device again."""
        try:
            if self.ending is not None:
                self.ending()
            else:
                self.release()
            with self.lock:
                self._give_back_lease()
        except KeyboardInterrupt:
            pass  # a Ctrl-C as the statement ends: nothing is left for it to stop

    def _give_back_lease(self) -> None:
        """A lease (a person's run of turns, say) goes back as the statement ends, once the
        device has run its work: held through the person's pause, it would keep the lane
        from the jobs beside it, and be billed to this one."""
        lease = self.lease
        if self.held or self.detached or lease is None or not lease.lapse():
            return
        self.device.keep()  # (the last release's give, held back while the device was busy)
        self.hold_interrupts()
        try:
            lease.hand_back()  # (its lock let go whatever the wait for the device raises)
        finally:
            self.let_interrupts()
            self.channel.send("done", **self._done_figures(self.reported))

    def _done_figures(self, steps: int) -> dict:
        """What a Done says: the step count, and the memory last sampled."""
        sample = self.sample
        return {"steps": steps, "mem_persistent": sample.persistent, "mem_peak": sample.peak}

    def _settle(self) -> bool:
        """Before asking for the lane again: a Done the device still holds back is waited
        for and sent now (the host must hear it before a READY); True where what is held
        back is a lease's lock instead (it is the job's still). A lease asked back while its
        last iteration's tail runs (a slice's end, between iterations) hands over here, as
        at a release (its own tail then waited for before its READY)."""
        pending = self.device.keep()
        if pending is None:
            return False
        lease = self.lease
        if lease is not None and lease.gives(pending):
            if not lease.page.offered():
                figures = self._done_figures(self.reported)
                if self._hand_over(figures, self._give_and_drain):
                    return self._settle()  # (False: its tail run, the lock let go)
            return True
        self.device.finish()
        pending()
        return False

    def set_total_steps(self, total: int) -> None:
        if not 1 <= total <= INT64_MAX:
            raise ValueError(
                f"gq.set_total_steps({total}): the total must be a whole number "
                f"of iterations from 1 to {INT64_MAX}"
            )
        if not self.detached:
            with self.lock:
                self.channel.send("total", steps=total)

    def ran_out_of_memory(self, exc: BaseException) -> None:
        """Tell the host, as the script ends on it, that it ran out of memory and how much it
        held and asked for: its job goes back to the queue (or fails), and no neighbour is
        blamed."""
        found = worker_memory.shortage(exc)
        if found is not None and not self.detached:
            with self.lock:
                self.channel.send("oom", held=found.held, wanted=found.wanted)

    def finish(self) -> None:
        """The script is over: free the lane now, not after the interpreter's teardown."""
        if self.detached:
            return
        for action in self.at_finish:
            action()
        with self.lock:
            if self.held:
                self.release()
            if self._settle() and self.lease is not None:  # the lease's lock: let it go
                self.lease.hand_back()
            self.channel.send("finished")


def run_script(snapshot: str, submitted: str) -> None:
    """Run the snapshot as ``__main__`` as if ``python SUBMITTED`` ran it. The snapshot is
    the descriptor the host opened (defaults.SCRIPT_PATH), closed once read, or a file."""
    if snapshot == defaults.SCRIPT_PATH:
        with os.fdopen(defaults.SCRIPT_FD, "rb") as handle:
            source = handle.read()
    else:
        with open(snapshot, "rb") as handle:
            source = handle.read()
    code = compile(source, submitted, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=submitted,
        __cached__=None,
        __loader__=None,
        __package__=None,
        __spec__=None,
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    # Tracebacks quote the lines that ran (the snapshot), not a later edit of the file.
    linecache.cache[submitted] = (
        len(source),
        None,
        source.decode(errors="replace").splitlines(True),
        submitted,
    )
    exec(code, main.__dict__)


def _print_user_traceback(exc: BaseException) -> None:
    """The traceback Python prints for a script, without the worker's frames above it."""
    tb = exc.__traceback__
    here = os.path.dirname(os.path.abspath(__file__))
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(here):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m gq.exec.job.worker SNAPSHOT [ARGS]...\n")
        sys.exit(2)
    fd = int(os.environ.pop("GQ_WORKER_FD"))
    submitted = os.environ.pop("GQ_SCRIPT", None) or argv[0]
    cap = os.environ.pop("GQ_MEM_CAP", None)
    page_fd = os.environ.pop("GQ_PAGE_FD", None)
    page = None
    if page_fd and page_fd.isdigit():
        os.set_inheritable(int(page_fd), False)  # the job's own programs get no lane
        page = SharedPage.attach(int(page_fd))
    session = WorkerSession(
        WorkerChannel(socket.socket(fileno=fd)), int(cap) if cap and cap.isdigit() else None, page
    )
    job_session.active = session
    hooks.install_when_imported(session)
    sys.argv = [submitted, *argv[1:]]
    sys.path[0] = os.path.dirname(submitted)  # sibling imports, as `python script.py` has
    try:
        run_script(argv[0], submitted)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as Python would, exit code 1
        _print_user_traceback(exc)
        session.ran_out_of_memory(exc)
        raise SystemExit(1) from None
    finally:
        session.finish()


if __name__ == "__main__":
    main(sys.argv[1:])
