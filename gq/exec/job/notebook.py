"""The Jupyter kernel of ``gq kernel``: run by gq's worker as its script, it is ipykernel's
own kernel on the connection file Jupyter wrote, whose every cell ends the iteration it
opened (IPython's ``post_run_cell``), as :mod:`gq.exec.job.console` ends one per statement. A
cell's module calls and optimizer steps hold the lane; between cells, while a person reads
and types, the job holds nothing and other jobs have the device.

An interrupt (SIGINT, sent on by ``gq kernel run``) is a KeyboardInterrupt in the cell, as
in any kernel; one that comes while the cell waits for the lane is raised once the lane is
granted, as the console's is.
"""

from __future__ import annotations

import os
import signal
import sys

from gq.exec.job import pending_notes
from gq.exec.job import session as job_session
from gq.exec.job.console import end_cells, interrupting


def serve() -> None:
    """ipykernel on the connection file this job was given (its first argument), saying in
    its first cell why it waited, as the note its launcher named (the second) says."""
    from ipykernel.ipkernel import IPythonKernel
    from ipykernel.kernelapp import IPKernelApp

    session = job_session.active

    class CellKernel(IPythonKernel):
        def pre_handler_hook(self) -> None:
            """While a request is handled, SIGINT is the cell's KeyboardInterrupt (ipykernel
            sets python's handler here), held back while the worker exchanges with its host
            or the hooks count a call (gq.exec.job.console.interrupting)."""
            handler = signal.default_int_handler if session is None else interrupting(session)
            self.saved_sigint_handler = signal.signal(signal.SIGINT, handler)

    # The kernel's parent is gq's execution host, not the Jupyter server that started the
    # launcher: ipykernel would take that for its parent's death and exit at once.
    os.environ.pop("JPY_PARENT_PID", None)
    app = IPKernelApp.instance(kernel_class=CellKernel)
    app.initialize(["-f", sys.argv[1]])
    if len(sys.argv) > 2:  # (a kernel queued where its user had no place for a note: none)
        _say_why_it_waited(app.shell, sys.argv[2])
    end_cells(app.shell, session)
    app.start()


def _say_why_it_waited(shell, note: str) -> None:
    """The first cell's output says why the kernel waited for its device, as its launcher
    left it (gq.cli.kernel_launch): a notebook shows no launcher's log."""
    said = pending_notes.take(note)
    if not said:
        return

    def once(info) -> None:
        shell.events.unregister("pre_run_cell", once)
        print(f"gq: this kernel waited for its device: {said}", file=sys.stderr)

    shell.events.register("pre_run_cell", once)
