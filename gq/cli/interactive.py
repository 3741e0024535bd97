"""gq run --pty: wait in the terminal while the job is pending, then be its terminal.

While the job is pending, one status line (job id, state, reason, forecast start) is
redrawn on stderr as it changes; Ctrl-C there cancels the job and says nothing more. Once
it runs, gq connects to its terminal's socket and takes the master of the job's
pseudo-terminal from its execution host (:mod:`gq.exec.host.terminal`), puts this terminal in
raw mode (restored on every way out) and copies bytes both ways: what is typed reaches the
job's own line discipline, so line editing, Ctrl-C and Ctrl-Z are the job's, and its window
size follows this terminal's. The job's end (its terminal reads EIO) ends the copy, and gq
exits with the job's exit code. gq's own end, or its terminal's, closes the master: the
kernel then hangs the job's session up, as a closed terminal hangs up a login shell.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import select
import signal
import socket
import sys
import termios
import time
import tty

from gq import client, defaults, messages
from gq.cli import render
from gq.errors import UserError
from gq.exec import protocol as wire
from gq.home import locate
from gq.queue.state_codes import TERMINAL

LOOK_EVERY = 0.1  # seconds between looks for a started job's terminal
ASK_EVERY = 0.5  # ... and between asks for a pending job's state
_CHUNK = 1 << 16
_MOST_BUFFERED = 1 << 20  # typed bytes held for a job that reads none: stdin waits then


def need_terminal() -> None:
    """--pty reads from a terminal: refused (nothing queued) where stdin is none."""
    if not os.isatty(0):
        raise UserError(
            "--pty needs a terminal on stdin (run it from an interactive shell, "
            "or leave --pty out to queue a batch job)"
        )


def run(job_id: int) -> int:
    """Wait for the job's terminal, be it until the job ends; gq's exit status."""
    label = str(job_id)
    path = wire.terminal_socket(str(locate().terminals), job_id)
    status = StatusLine()
    try:
        taken = wait_for_terminal(label, path, status)
    except KeyboardInterrupt:
        status.clear()
        _cancel(label)
        return 130
    status.clear()
    if taken is None:
        return exit_status(label)
    master, connection = taken
    # The connection stays open, unread, until gq exits: its host learns from its closing
    # (gq's end, or its terminal's) that the job was hung up.
    with connection:
        ended_by = relay(master)
        if ended_by is not None:  # gq or its own terminal was told to go: the job hangs up
            return 128 + ended_by
        return exit_status(label)


def wait_for_terminal(
    label: str, path: str, status: StatusLine
) -> tuple[int, socket.socket] | None:
    """The master of the job's terminal once its host hands it over, and the connection
    it came on; None for a job that ended without one to take (it never started, or no gq
    took it in time)."""
    next_ask = 0.0
    while True:
        taken = _take_terminal(path, label)
        if taken is not None:
            return taken
        if time.monotonic() >= next_ask:
            job = client.ask(messages.ShowJob(label)).jobs[0]
            if job.state in TERMINAL:
                return _take_terminal(path, label)  # it ended as it was looked for
            status.show(describe(job, status.hint))
            next_ask = time.monotonic() + ASK_EVERY
        time.sleep(LOOK_EVERY)


def describe(job: messages.JobInfo, hint: str = "Ctrl-C cancels it") -> str:
    """The status line of a job not yet attached: id, state, reason, forecast start, and
    while it is pending, ``hint`` (how to give up waiting)."""
    if job.state == "PENDING":
        text = f"gq: job {job.label} pending ({job.reason or 'None'})"
        start = render.forecast_time(job, end=False)
        if start not in ("-", "?"):
            text += f", starts {start}"
        return f"{text}; {hint}"
    return f"gq: job {job.label} {job.state.lower()} on {job.device or '-'}, attaching"


def _take_terminal(path: str, label: str) -> tuple[int, socket.socket] | None:
    """Connect to the job's terminal socket and receive its master (with the connection);
    None where there is no socket (yet, or any more)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    taken = False  # once it is, the connection is the caller's to close
    try:
        try:
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except OSError as exc:
            raise UserError(
                f"cannot reach job {label}'s terminal at {path}: {exc.strerror}"
            ) from None
        sock.settimeout(defaults.CLIENT_TIMEOUT)
        try:
            line, fds, _, _ = socket.recv_fds(sock, defaults.MAX_FRAME, 1)
        except OSError:
            return None  # refused (not this job's user), or its host closed it meanwhile
        if not fds:
            return None
        try:
            given = wire.decode(line.rstrip(b"\n"), wire.TO_CLIENT)
        except wire.MessageError:
            given = None
        if given is None or str(given.job) != label:
            for fd in fds:
                os.close(fd)
            raise UserError(
                f"job {label}'s terminal socket handed over something else; "
                "see the execution host's log"
            )
        taken = True
        return fds[0], sock
    finally:
        if not taken:
            sock.close()


def relay(master: int) -> int | None:
    """Copy between this terminal and the job's until the job's side closes (None), or a
    SIGHUP or SIGTERM to gq ends the copy (that signal's number). This terminal is raw
    meanwhile and restored however the copy ends; the master is closed."""
    from gq.wakeup import received, signal_socket

    saved = termios.tcgetattr(0)
    wake = signal_socket((signal.SIGWINCH, signal.SIGCONT, signal.SIGHUP, signal.SIGTERM))
    os.set_blocking(master, False)
    try:
        tty.setraw(0, termios.TCSANOW)
        _copy_size(master)
        typed = bytearray()  # read from this terminal, not yet taken by the job's
        while True:
            readers: list[int | socket.socket] = [master, wake]
            readers += [0] if len(typed) < _MOST_BUFFERED else []
            ready, writable, _ = select.select(readers, [master] if typed else [], [])
            for signum in received(wake) if wake in ready else ():
                if signum in (signal.SIGHUP, signal.SIGTERM):
                    return signum
                if signum == signal.SIGCONT:  # stopped and resumed: a shell may have reset it
                    tty.setraw(0, termios.TCSANOW)
                _copy_size(master)
            if master in ready and not _to_terminal(master):
                return None
            if 0 in ready:
                data = _read(0)
                if not data:  # this terminal is gone: so is the job's
                    return signal.SIGHUP
                typed += data
            if master in writable:
                try:
                    typed = typed[os.write(master, typed) :]
                except BlockingIOError:
                    pass
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)
        os.close(master)


def _to_terminal(master: int) -> bool:
    """What the job wrote, to this terminal; False once the job's side has closed."""
    try:
        data = os.read(master, _CHUNK)
    except BlockingIOError:
        return True
    except OSError as exc:
        if exc.errno == errno.EIO:  # every descriptor of its side is closed
            return False
        raise
    if not data:
        return False
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]
    return True


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, _CHUNK)
    except OSError as exc:
        if exc.errno == errno.EIO:
            return b""
        raise


def _copy_size(master: int) -> None:
    """This terminal's window size to the job's (whose foreground processes get SIGWINCH)."""
    try:
        size = fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
        fcntl.ioctl(master, termios.TIOCSWINSZ, size)
    except OSError:
        pass


def _cancel(label: str) -> None:
    """Ctrl-C while pending: the job is cancelled, quietly."""
    try:
        client.ask(messages.Cancel([label]))
    except UserError:
        pass  # ended meanwhile, or the daemon went away: nothing is left to cancel


def exit_status(label: str) -> int:
    """The job's exit code once it has ended (as gq wait gives it); an end that is not its
    own command's (a cancel, a time limit, a hang-up) is said on stderr."""
    ended = client.ask(messages.Wait([label]), wait=math.inf).jobs[0]
    if ended.state == "COMPLETED":
        return 0
    if ended.state != "FAILED" or ended.exit_code is None:
        job = client.ask(messages.ShowJob(label)).jobs[0]
        print(
            f"gq: job {label} {ended.state}" + (f": {job.reason}" if job.reason else ""),
            file=sys.stderr,
        )
    return min(255, ended.exit_code) if ended.exit_code else 1


class StatusLine:
    """One line on stderr, redrawn in place where stderr is a terminal (else each new one
    on a line of its own)."""

    hint = "Ctrl-C cancels it"  # how the one who waits gives up, said while pending

    def __init__(self) -> None:
        self.shown = ""
        self.in_place = sys.stderr.isatty()

    def show(self, text: str) -> None:
        if text == self.shown:
            return
        self.shown = text
        if not self.in_place:
            print(text, file=sys.stderr, flush=True)
            return
        width = os.get_terminal_size(sys.stderr.fileno()).columns
        sys.stderr.write("\r" + text[: max(1, width - 1)] + "\x1b[K")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.shown and self.in_place:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        self.shown = ""
