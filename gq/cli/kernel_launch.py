"""gq kernel run: the process Jupyter starts as a gq kernel. It queues the kernel as an
interactive job (ipykernel on Jupyter's connection file, run by gq's worker:
:mod:`gq.exec.job.notebook`) and stands in for it until the job ends, as Jupyter's
KernelManager expects of its kernel process: while the job is pending it says why (one
line on stderr, which the Jupyter server logs); once it runs it takes the job's terminal,
as ``gq run --pty`` does, and copies what the kernel writes there to its own stdout. The
kernel's ports are on this node: Jupyter's client connects to the job directly. Why it
waited is also left in a note of the user's alone (:mod:`gq.exec.job.pending_notes`), named on
the kernel's command line, for its first cell to say; the launcher removes it when the job
has ended.

Its exit status is the job's exit code. An interrupt (SIGINT, Jupyter's
``interrupt_mode: signal``) goes on to the job's main process group as SIGINT; SIGTERM or
SIGHUP (a shutdown or restart that the kernel did not answer) cancels the job, and a
SIGKILL closes its terminal, which hangs the job up.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys

from gq import client, messages
from gq.cli import command_lines, interactive
from gq.errors import UserError
from gq.exec import protocol as wire
from gq.exec.job import pending_notes
from gq.home import locate

_KERNEL = b"# gq kernel: a Jupyter kernel\nfrom gq.exec.job.notebook import serve\n\nserve()\n"


class _Ended(Exception):
    """SIGTERM or SIGHUP came to the launcher: its job is cancelled."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def kernel_job(connection_file: str | None) -> command_lines.Queued:
    """What is queued for a kernel: the kernel's snapshot, run by this interpreter (the one
    the kernelspec names, which has ipykernel), on the connection file (None: a kernel
    checked at its install, whose file Jupyter writes at each start), and its pending note
    where the user has a place for one."""
    import importlib.util

    if importlib.util.find_spec("ipykernel") is None:
        raise UserError(f"{sys.executable} has no ipykernel: pip install 'gq[jupyter]'")
    args = []
    if connection_file is not None:
        path = os.path.abspath(connection_file)
        if not os.path.isfile(path):
            raise UserError(
                f"{connection_file}: no such connection file (Jupyter writes it "
                "before it starts the kernel)"
            )
        note = pending_notes.place(path)
        args = [path] if note is None else [path, note]
    return command_lines.Queued(
        os.path.join(os.getcwd(), "jupyter kernel.py"),
        _KERNEL,
        args,
        sys.executable,
        "jupyter-kernel",
    )


class PendingStatus(interactive.StatusLine):
    """The launcher's status line (the Jupyter server's log), also kept as the kernel's
    pending note while the job is pending: the kernel's first cell says why it waited
    (:mod:`gq.exec.job.notebook`), which a notebook shows where the server's log is not seen."""

    hint = "a shutdown of the kernel cancels it"

    def __init__(self, connection_file: str | None) -> None:
        super().__init__()
        # The place kernel_job named on the kernel's command line: the same for this file.
        self.note = None if connection_file is None else pending_notes.place(connection_file)

    def show(self, text: str) -> None:
        if text != self.shown and self.note is not None and " pending (" in text:
            said = text.removeprefix("gq: ").removesuffix(f"; {self.hint}")
            if not pending_notes.write(self.note, said):
                self.note = None  # the note is a courtesy: the server's log still says it
        super().show(text)

    def forget(self) -> None:
        """The job has ended: a note its kernel did not take goes."""
        if self.note is not None:
            pending_notes.forget(self.note)


def launch(job_id: int, connection_file: str | None = None) -> int:
    """Stand in for the kernel's job until it ends; its exit code, or 128 + the signal
    that ended the launcher (the job is then cancelled, and waited for)."""
    label = str(job_id)
    print(f"gq: kernel is job {label}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, lambda signum, frame: _interrupt(label))
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ending)
    status = PendingStatus(connection_file)
    try:
        return _stand_in(job_id, label, status)
    finally:
        status.forget()


def _stand_in(job_id: int, label: str, status: PendingStatus) -> int:
    try:
        taken = interactive.wait_for_terminal(
            label, wire.terminal_socket(str(locate().terminals), job_id), status
        )
    except _Ended as ended:
        _cancel(label)
        return 128 + ended.signum
    if taken is None:
        return interactive.exit_status(label)
    master, connection = taken
    with connection:  # open until the job has ended: its closing would hang the job up
        ended_by = _copy_out(master, label)
        return interactive.exit_status(label) if ended_by is None else 128 + ended_by


def _copy_out(master: int, label: str) -> int | None:
    """What the kernel writes on its terminal, to this stdout, until the job's side has
    closed; the signal that asked the launcher to end meanwhile (the job was cancelled)."""
    ended_by = None
    try:
        while True:
            try:
                select.select([master], [], [])
                data = _read(master)
            except _Ended as ended:
                ended_by = ended.signum
                _cancel(label)
                continue
            if not data:
                return ended_by
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
    finally:
        os.close(master)


def _read(master: int) -> bytes:
    try:
        return os.read(master, 1 << 16)
    except OSError as exc:
        if exc.errno == errno.EIO:  # every descriptor of the job's side is closed
            return b""
        raise


def _ending(signum: int, frame) -> None:
    raise _Ended(signum)


def _interrupt(label: str) -> None:
    """Jupyter's interrupt: to the job's main process group (nothing while it is pending)."""
    try:
        client.ask(messages.SignalJob(label, "INT"))
    except UserError as exc:
        print(f"gq: cannot interrupt kernel job {label}: {exc}", file=sys.stderr, flush=True)


def _cancel(label: str) -> None:
    """The job is cancelled, once: further SIGTERMs are ignored meanwhile."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    try:
        client.ask(messages.Cancel([label]))
    except UserError:
        pass  # ended meanwhile, or the daemon went away: nothing is left to cancel
