"""The Python REPL of an interactive job (``gq run --pty -- python``): run by gq's worker as
its script, it is :mod:`code`'s console with readline, as ``python`` gives one, whose every
statement ends the iteration it opened; ``gq run --pty -- ipython`` is IPython's own terminal
shell, whose every cell ends it likewise. A statement's module calls and optimizer steps hold
the lane as a script's do; between statements, while a person reads and types, the job
holds nothing and other jobs have the device.

While a statement runs, its terminal's times are kept fresh (:class:`Busy`): its host counts
the job's idle time from them (:mod:`gq.exec.job.idleness`), and a long computation is no idle
time.

Ctrl-C is a KeyboardInterrupt, as in ``python``; one that comes while a statement waits for
the lane is raised once the lane is granted (a grant lost between worker and host would
leave the two disagreeing about who holds it), and the statement's end gives it back.
"""

from __future__ import annotations

import code
import os
import signal
import sys
import threading
from types import FrameType

from gq.exec.job import session as job_session

TOUCH_EVERY = 1.0  # seconds between touches of a busy job's terminal (a utime call)


class Busy:
    """Marks the job's terminal as used (its access and modification times now) when a
    statement or a cell begins and ends, and every TOUCH_EVERY seconds between, as typing
    would. Nothing where the job has no terminal."""

    def __init__(self, fd: int = 0) -> None:
        try:
            self.tty: str | None = os.ttyname(fd)
        except OSError:
            self.tty = None
        self.running = threading.Event()
        self.ended = threading.Event()
        self.thread: threading.Thread | None = None

    def begin(self) -> None:
        self.touch()
        self.ended.clear()
        self.running.set()
        if self.thread is None and self.tty is not None:
            self.thread = threading.Thread(target=self._keep_fresh, name="gq-busy", daemon=True)
            self.thread.start()

    def end(self) -> None:
        self.running.clear()
        self.ended.set()
        self.touch()

    def touch(self) -> None:
        if self.tty is not None:
            try:
                os.utime(self.tty)
            except OSError:
                self.tty = None  # the terminal went away: nothing more to mark

    def _keep_fresh(self) -> None:
        while True:
            self.running.wait()
            while not self.ended.wait(TOUCH_EVERY):
                self.touch()


class StatementConsole(code.InteractiveConsole):
    """A console that ends the iteration in progress after every statement."""

    def __init__(self, namespace: dict, session) -> None:
        super().__init__(namespace, filename="<stdin>")
        self.session = session
        self.busy = Busy()

    def runcode(self, compiled) -> None:
        self.busy.begin()
        try:
            super().runcode(compiled)
        finally:
            self.busy.end()
            if self.session is not None:
                self.session.end_iteration()


def interact() -> None:
    """Run the REPL in ``__main__``, as ``python`` with no script does: its argv, its path,
    its interactive hook (readline, completion, history) and PYTHONSTARTUP."""
    session = job_session.active
    namespace = sys.modules["__main__"].__dict__
    for name in ("__file__", "__cached__"):  # the worker's label is no file of the user's
        namespace.pop(name, None)
    sys.argv = [""]
    sys.path[0] = ""
    if session is not None:
        signal.signal(signal.SIGINT, interrupting(session))
    hook = getattr(sys, "__interactivehook__", None)
    if hook is not None:
        hook()
    startup = os.environ.get("PYTHONSTARTUP")
    if startup and os.path.isfile(startup):
        with open(startup, "rb") as handle:
            exec(compile(handle.read(), startup, "exec"), namespace)
    console = StatementConsole(namespace, session)
    console.interact(
        banner=f'Python {sys.version} on {sys.platform}\nType "help", '
        '"copyright", "credits" or "license" for more information.',
        exitmsg="",
    )


def interact_ipython() -> None:
    """IPython's terminal shell, as ``ipython ARGS`` starts it (its profile, configuration
    and options: the job's arguments), each cell ending the iteration it opened."""
    from IPython.terminal.ipapp import TerminalIPythonApp

    session = job_session.active
    args = sys.argv[1:]
    sys.argv = ["ipython", *args]
    sys.path[0] = ""
    app = TerminalIPythonApp.instance()
    app.initialize(args)
    end_cells(app.shell, session)
    if session is not None:
        signal.signal(signal.SIGINT, interrupting(session))
    app.start()


def end_cells(shell, session) -> None:
    """An IPython shell's (a terminal's, a kernel's) every cell marks its terminal busy
    while it runs and ends the iteration it opened."""
    busy = Busy()  # a cell computing is no idle time (gq.exec.job.idleness)
    shell.events.register("pre_run_cell", lambda info: busy.begin())
    shell.events.register("post_run_cell", lambda result: busy.end())
    if session is not None:
        shell.events.register("post_run_cell", lambda result: session.end_iteration())


# The modules that mark a job's boundaries and speak for it to its host. A Ctrl-C that
# comes while one of them runs (even between its sections: in the finally that would leave a
# module call, say) would leave the hooks counting a call that never ends, and the lane held
# for good; it is raised at the next section's end instead.
_EXEC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOUNDARY_CODE = frozenset(
    os.path.join(_EXEC, name)
    for name in (
        "job/hooks.py",
        "job/outermost_calls.py",
        "job/boundaries.py",
        "job/worker.py",
        "lane/lease.py",
    )
)


def interrupting(session):
    """The SIGINT handler of a statement (or a cell): a KeyboardInterrupt, held back while
    the worker and its host exchange a READY and its GO, or a release and its DONE, while
    the hooks count what is inside an iteration, and while gq's boundary code runs at all."""

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if session.holding or (frame is not None and frame.f_code.co_filename in _BOUNDARY_CODE):
            session.interrupted = True  # raised once the section is over
            return
        signal.default_int_handler(signum, frame)  # python's own (no frame of gq's shown)

    return on_interrupt
