"""The typed wire between client, daemon, host and worker (gq.codec and its two message
modules): every frame decodes to a checked message or is refused with MessageError, whatever
a peer sends; hypothesis tries well-formed frames with bad values, and arbitrary bytes."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gq import codec, defaults, messages
from gq.codec import INT64_MAX, FrameTooLarge, MessageError
from gq.exec import protocol as wire
from gq.exec.host import messages as host_messages
from gq.exec.job import messages as worker_messages

HOSTILE_VALUES = [
    None,
    2**70,
    -(2**70),
    "abc",
    "",
    "x" * 70_000,
    "\x00",
    "\ud800",
    1.5,
    True,
    [],
    {},
    [[[[1]]]],
    {"a": {"b": 1}},
    -1,
    0,
]
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
TABLES = {
    "from worker": wire.FROM_WORKER,
    "to daemon": wire.TO_DAEMON,
    "to host": wire.TO_HOST,
    "to worker": wire.TO_WORKER,
}


def _valid(value, hint_owner, name) -> None:
    """A decoded field holds nothing the codec promised to keep out."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int):
        assert -(2**63) <= value <= INT64_MAX, (hint_owner, name, value)
    elif isinstance(value, float):
        assert math.isfinite(value), (hint_owner, name, value)
    elif isinstance(value, str):
        assert "\0" not in value
        value.encode("utf-8")
    elif isinstance(value, list):
        for item in value:
            _valid(item, hint_owner, name)
    elif isinstance(value, dict):
        for key, item in value.items():
            _valid(key, hint_owner, name)
            _valid(item, hint_owner, name)
    elif isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            _valid(getattr(value, field), type(value).__name__, field)


def _decode_or_refuse(line: bytes, kinds: codec.Wire):
    try:
        message = wire.decode(line, kinds)
    except MessageError:
        return None
    _valid(message, type(message).__name__, "")
    return message


@pytest.mark.parametrize("table", TABLES, ids=list(TABLES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_well_formed_frames_with_any_values_decode_checked_or_are_refused(table, data):
    kinds = TABLES[table]
    kind = data.draw(st.sampled_from(sorted(kinds.classes)))
    fields = list(kinds.classes[kind].__struct_fields__) or ["x"]
    frame = {"kind": kind}
    for name in data.draw(st.lists(st.sampled_from(fields), max_size=len(fields))):
        frame[name] = data.draw(st.sampled_from(HOSTILE_VALUES) | JSON_VALUES)
    _decode_or_refuse(json.dumps(frame).encode(), kinds)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=400))
def test_arbitrary_bytes_never_raise_anything_but_message_error(payload):
    for kinds in TABLES.values():
        _decode_or_refuse(payload, kinds)
    try:
        messages.decode(payload, messages.REQUESTS)
    except MessageError:
        pass


@pytest.mark.parametrize(
    "frame,fragment",
    [
        ({"kind": "total", "steps": None}, "total.steps: expected `int`, got `null`"),
        ({"kind": "total", "steps": 2**70}, "total.steps: expected `int` <="),
        ({"kind": "total", "steps": 0}, "total.steps: expected `int` >= 1"),
        ({"kind": "done", "steps": 3, "mem_persistent": "abc"}, "done.mem_persistent"),
        ({"kind": "done", "steps": -1}, "done.steps"),
        ({"kind": "progress", "steps": True}, "progress.steps: expected `int`, got `bool`"),
        ({"kind": "ready", "extra": 1}, "ready: object contains unknown field `extra`"),
        ({"kind": "launch"}, "unknown kind"),
        ({"kind": 7}, "unknown kind"),
    ],
)
def test_each_hostile_worker_frame_is_named_in_its_refusal(frame, fragment):
    with pytest.raises(MessageError, match=fragment.replace("(", r"\(")):
        wire.decode(json.dumps(frame).encode(), wire.FROM_WORKER)


@pytest.mark.parametrize(
    "bad", [None, 2**70, -1, 0, "abc", "\x00", 1.5, True, [[[[1]]]], {"a": 1}, float("nan")]
)
def test_a_hostile_memory_cap_is_refused_on_the_hosts_and_the_workers_wire(bad):
    """Cap (daemon to host) and Go.mem_cap (host to worker): bytes from 1 to the bound."""
    frames = [
        ({"kind": "cap", "job": 1, "run": 1, "mem_cap": bad}, wire.TO_HOST),
        ({"kind": "go", "mem_cap": bad}, wire.TO_WORKER),
    ]
    for frame, kinds in frames:
        if bad is None and frame["kind"] == "go":
            assert wire.decode(json.dumps(frame).encode(), kinds).mem_cap is None  # no cap
            continue
        with pytest.raises(MessageError):
            wire.decode(json.dumps(frame).encode(), kinds)
    good = wire.decode(b'{"kind": "cap", "job": 1, "run": 2, "mem_cap": 1048576}', wire.TO_HOST)
    assert (good.job, good.run, good.mem_cap) == (1, 2, 1 << 20)


@pytest.mark.parametrize(
    "line",
    [
        b'{"kind": "done", "steps": NaN}',
        b'{"kind": "done", "steps": 1, "mem_peak": Infinity}',
        b'{"kind": "done", "steps": 1e400}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"kind": "done", "steps": ' + b"9" * 5000 + b"}",
        b"\xff\xfe not utf-8",
    ],
)
def test_frames_that_are_not_json_a_python_process_can_trust(line):
    with pytest.raises(MessageError):
        wire.decode(line, wire.FROM_WORKER)


def test_strings_are_checked_for_nul_utf8_and_length():
    spec = dict(
        id=1,
        run=1,
        argv=["/bin/true"],
        worker=False,
        cwd="/",
        env={},
        stdout="/o",
        stderr="/o",
        user="u",
        submit_time=1.0,
    )
    good = wire.encode(host_messages.Launch(host_messages.LaunchSpec(**spec)))
    assert wire.decode(good, wire.TO_HOST).job.argv == ["/bin/true"]
    for field, value, fragment in (
        ("argv", ["/bin/\x00true"], "NUL"),
        ("env", {"A=B": "1"}, "launch.job.env key"),
        ("env", {"A": "\ud800"}, "not JSON"),
        ("user", "u" * (defaults.MAX_NAME + 1), "launch.job.user: expected `str` of length <="),
        ("cwd", "/" * (defaults.MAX_PATH + 1), "launch.job.cwd: expected `str` of length <="),
        ("uid", -1, "launch.job.uid: expected `int` >= 0"),
        ("submit_time", defaults.MAX_TIMESTAMP * 2, "launch.job.submit_time: expected `float` <="),
        ("snapshot", "/spool/1/\x00s.sh", "NUL"),
        ("snapshot", 2**70, "snapshot"),
        (
            "script_name",
            "/" * (defaults.MAX_PATH + 1),
            "launch.job.script_name: expected `str` of length <=",
        ),
        ("script_name", ["/a.sh"], "script_name"),
    ):
        frame = json.loads(good)
        frame["job"][field] = value
        with pytest.raises(MessageError, match=fragment):
            wire.decode(json.dumps(frame).encode(), wire.TO_HOST)


def test_a_launchs_pids_limit_is_a_task_count_the_kernel_takes():
    """--max-pids travels in each launch: a host takes 1 to the kernel's PID_MAX_LIMIT, or
    none (null: no limit), and refuses anything else before it makes a cgroup."""
    spec = host_messages.LaunchSpec(
        id=1,
        run=1,
        argv=["/bin/true"],
        worker=False,
        cwd="/",
        env={},
        stdout="/o",
        stderr="/o",
        user="u",
        submit_time=1.0,
        max_pids=64,
    )
    good = json.loads(wire.encode(host_messages.Launch(spec)))
    for value, decoded in ((64, 64), (1, 1), (1 << 22, 1 << 22), (None, None)):
        good["job"]["max_pids"] = value
        assert wire.decode(json.dumps(good).encode(), wire.TO_HOST).job.max_pids == decoded
    for value in (0, -1, (1 << 22) + 1, 2**70, "64", 64.0, True, [64]):
        good["job"]["max_pids"] = value
        with pytest.raises(MessageError, match="launch.job.max_pids"):
            wire.decode(json.dumps(good).encode(), wire.TO_HOST)
    for text in ("NaN", "Infinity"):
        line = json.dumps(good).replace("[64]", text).encode()
        with pytest.raises(MessageError):
            wire.decode(line, wire.TO_HOST)


@pytest.mark.parametrize(
    "line",
    [
        b'{"kind": "ready", "x\\u0000": 1}',
        b'{"kind": "done", "steps": -1, "kind": "\\u0000"}',
        b'{"kind": "ready", "a\\nFAKE root: a line\\u001b[31m": 1}',
        b'{"kind": "\\u0000\\n"}',
    ],
)
def test_a_refusal_quotes_what_the_peer_sent_printably(line):
    """A refusal names what the peer sent (an unknown field, its kind), and goes into a
    job's reason and its exit report: a NUL there made that report one the daemon could
    never take, and a newline or an escape would forge a line."""
    with pytest.raises(MessageError) as refused:
        wire.decode(line, wire.FROM_WORKER)
    assert str(refused.value).isprintable(), str(refused.value)


@pytest.mark.parametrize(
    "line,table",
    [
        (b'{"x": ' + b"[" * 2000 + b"]" * 2000 + b', "kind": "ready"}', wire.FROM_WORKER),
        (b'{"kind": ' + b"[" * 998 + b"]" * 998 + b"}", wire.TO_WORKER),
        (b'{"x": ' + b"[" * 2000 + b"]" * 2000 + b', "kind": "list", "v": 7}', None),
        (b'{"kind": "list", "v": ' + b"[" * 995 + b"]" * 995 + b"}", None),
        (b'{"kind": "state", "version": "old", "pid": 1e999}', wire.TO_DAEMON),
        (
            b'{"op": "state", "version": "old", "pid": 5, "x": ' + b"[" * 993 + b"]" * 993 + b"}",
            wire.TO_DAEMON,
        ),
    ],
    ids=[
        "a deep value before the kind",
        "a deep kind",
        "a deep value in a request",
        "a deep version",
        "a foreign state's infinite pid",
        "a foreign state too deep to write back",
    ],
)
def test_deep_values_and_numbers_json_cannot_spell_are_refused_as_messages(line, table):
    """msgspec skips an unknown field's value recursively (a RecursionError got out of
    decode), and a foreign host's State written back for the decoder may hold inf."""
    try:
        if table is None:
            messages.decode(line, messages.REQUESTS)
        else:
            decoded = wire.decode(line, table)
            assert isinstance(decoded, host_messages.ForeignState)  # the draining fields
    except MessageError as exc:
        assert str(exc).isprintable()


def test_a_request_without_its_version_is_refused_as_of_another_version():
    for line in (b'{"kind": "list"}', b'{"kind": "list", "ended_since": 1e999}'):
        with pytest.raises(messages.VersionMismatch, match="protocol version None"):
            messages.decode(line, messages.REQUESTS)


def test_an_answer_the_plain_client_cannot_read_is_a_user_error_without_msgspec(tmp_path):
    """The scontrol shim reads answers plain in a job's interpreter, which may lack
    msgspec: an answer it did not expect is still a one-line UserError there."""
    version = defaults.PROTOCOL_VERSION
    answers = [
        b'{"kind":"report","lines":[],"v":%d}\n' % version,
        b'{"kind":"error","message":"refused: no","exit_code":3,"v":%d}\n' % version,
    ]
    code = f"""if True:
        import socket, sys, threading
        sys.modules["msgspec"] = None
        from gq import client
        from gq.errors import UserError
        from gq.home import SYSTEM, Home
        home = Home({str(tmp_path)!r}, SYSTEM)
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(home.socket_path)
        listener.listen(4)
        answers = {answers!r}
        def serve():
            for answer in answers:
                peer, _ = listener.accept()
                peer.recv(1 << 16)
                peer.sendall(answer)
                peer.close()
        threading.Thread(target=serve, daemon=True).start()
        for _ in answers:
            try:
                client.ask_plain("show", {{"label": "1"}}, "jobs", home)
            except UserError as exc:
                print(exc.exit_code, exc)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == [
        "2 malformed answer from the daemon to a 'show' request",
        "3 refused: no",
    ], done.stdout + done.stderr


def test_a_message_over_the_frame_is_refused_by_its_sender():
    huge = host_messages.LaunchFailed(1, 1, "x" * defaults.MAX_FRAME)
    with pytest.raises(FrameTooLarge):
        wire.encode(huge)
    left, right = socket.socketpair()
    try:
        with pytest.raises(FrameTooLarge):
            wire.Channel(left, wire.TO_HOST).send(huge)
    finally:
        left.close()
        right.close()


def test_a_foreign_hosts_state_is_read_for_what_draining_needs():
    line = json.dumps(
        {
            "kind": "state",
            "version": "0.0.1/1",
            "pid": 42,
            "residents": "?",
            "exited": [{"kind": "old"}],
            "draining": False,
        }
    ).encode()
    state = wire.decode(line, wire.TO_DAEMON)
    assert isinstance(state, host_messages.ForeignState)
    assert (state.pid, state.version) == (42, "0.0.1/1")


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.binary(max_size=300), max_size=8))
def test_a_channel_yields_checked_messages_or_ends_with_an_error(chunks):
    left, right = socket.socketpair()
    channel = wire.Channel(right, wire.FROM_WORKER)
    right.setblocking(False)
    try:
        for chunk in chunks:
            if chunk:
                left.sendall(chunk)
            for message in channel.receive():
                assert type(message) in wire.FROM_WORKER.classes.values()
                assert not channel.error
            if channel.error:
                assert channel.closed
                break
    finally:
        left.close()
        right.close()


# ----- the worker's end, in the standard library alone (gq.exec.job.worker_link) ----------
_WORKER_SAYS = st.one_of(
    st.just(("ready", {})),
    st.just(("finished", {})),
    st.tuples(
        st.just("done"),
        st.fixed_dictionaries(
            {"steps": st.integers(0, INT64_MAX)},
            optional={
                "mem_persistent": st.none() | st.integers(0, INT64_MAX),
                "mem_peak": st.none() | st.integers(0, INT64_MAX),
                "event": st.none() | st.binary(min_size=64, max_size=64).map(bytes.hex),
            },
        ),
    ),
    st.just(("drained", {})),
    st.tuples(st.just("total"), st.fixed_dictionaries({"steps": st.integers(1, INT64_MAX)})),
    st.tuples(st.just("progress"), st.fixed_dictionaries({"steps": st.integers(0, INT64_MAX)})),
    st.tuples(
        st.just("oom"),
        st.fixed_dictionaries(
            {"held": st.integers(0, INT64_MAX), "wanted": st.none() | st.integers(0, INT64_MAX)}
        ),
    ),
)


@settings(max_examples=200, deadline=None)
@given(said=_WORKER_SAYS)
def test_every_line_the_worker_writes_decodes_on_its_hosts_wire_as_said(said):
    """The worker writes its messages with the standard library (it may run under any
    Python); the host reads them with the one definition of each (worker_messages)."""
    from gq.exec.job.worker_link import line

    kind, fields = said
    message = wire.decode(line(kind, **fields).rstrip(b"\n"), wire.FROM_WORKER)
    assert message.kind == kind
    assert {name: getattr(message, name) for name in fields} == fields


@settings(max_examples=100, deadline=None)
@given(
    go=st.builds(
        worker_messages.Go,
        empty_cache=st.booleans(),
        mem_cap=st.none() | st.integers(1, defaults.MAX_HOST_MEM),
        lease=st.integers(0, INT64_MAX),
        hand_over=st.booleans(),
        after=st.none() | st.binary(min_size=64, max_size=64).map(bytes.hex),
    )
)
def test_the_worker_reads_every_go_its_host_can_send(go):
    from gq.exec.job.worker_link import Grant, WorkerChannel

    left, right = socket.socketpair()
    try:
        left.sendall(wire.encode(go) * 2)
        channel = WorkerChannel(right)
        expected = Grant(go.empty_cache, go.mem_cap, go.lease, go.hand_over, go.after)
        assert channel.receive_grant() == expected and channel.receive_grant() == expected
        left.sendall(wire.encode(host_messages.Kill(1, host_messages.StopWhy.CANCEL)))
        with pytest.raises(ConnectionError, match="sent 'kill', not a grant"):
            channel.receive_grant()
        left.close()
        with pytest.raises(EOFError):
            channel.receive_grant()
    finally:
        right.close()


def test_the_worker_side_of_gq_imports_no_dependency_of_gq():
    """A job run by another interpreter finds gq alone on its path: what its process
    imports of gq must not need msgspec (nor any other dependency)."""
    code = (
        "import sys; sys.modules['msgspec'] = None\n"
        "import gq, gq.exec.job.worker, gq.exec.job.console, gq.exec.job.notebook\n"
        "print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout == "ok\n", done.stderr


def test_a_flooding_worker_gets_a_bounded_turn_of_its_host():
    """A worker that floods its socket has at most WORKER_READ bytes decoded per turn of the
    host's loop (the rest waits in the socket), and what it sent still arrives in order."""
    left, right = socket.socketpair()
    right.setblocking(False)
    channel = wire.Channel(right, wire.FROM_WORKER, chunk=defaults.WORKER_READ)
    line = wire.encode(worker_messages.StepsTaken(7))
    left.sendall(line * 3000)
    turns = []
    while sum(turns) < 3000:
        turns.append(sum(1 for _ in channel.receive()))
    assert max(turns) <= defaults.WORKER_READ // len(line) + 1 and not channel.error
    assert sum(turns) == 3000 and len(turns) >= 3000 * len(line) // defaults.WORKER_READ
    left.close()
    right.close()


def test_client_requests_bound_every_field():
    base = messages.Submit("/w/s.sh", b"true\n", [], "/w", {}, 0o022, messages.SubmitOptions())
    assert messages.decode(messages.encode(base), messages.REQUESTS).script == b"true\n"
    for change, fragment in (
        ({"priority": 2**40}, "priority"),
        ({"gpus": -1}, "gpus"),
        ({"time_limit": 0}, "time_limit"),
        ({"steps": -5}, "steps"),
        ({"deadline": 1e21}, "deadline"),
        ({"name": "a\x00b"}, "NUL"),
        ({"host_mem": 2**70}, "host_mem"),
        ({"cpus": 0}, "cpus"),
        ({"ntasks": 2**70}, "ntasks"),
        ({"retries": -1}, "retries"),
        ({"warn_signal": "B:" * 40}, "warn_signal"),
        ({"nodelist": ["gpu0\x00"]}, "NUL"),
        ({"mail_user": "x" * 10_000}, "mail_user"),
        ({"gpu_type": 7}, "gpu_type"),
        ({"idle_timeout": 2**70}, "idle_timeout"),
        ({"idle_timeout": 0}, "idle_timeout"),
        ({"idle_timeout": "1:00"}, "idle_timeout"),
        ({"idle_timeout": [60]}, "idle_timeout"),
    ):
        request = msgspec.structs.replace(
            base, options=msgspec.structs.replace(base.options, **change)
        )
        with pytest.raises(MessageError, match=fragment):
            messages.decode(messages.encode(request), messages.REQUESTS)
    for name, raw in (
        ("retry_delay", b"NaN"),
        ("begin", b"Infinity"),
        ("retry_delay", b"-1e999"),
        ("idle_timeout", b"NaN"),
        ("idle_timeout", b"1e999"),
    ):
        options = msgspec.structs.replace(base.options, **{name: 12345.5})
        line = messages.encode(msgspec.structs.replace(base, options=options))
        with pytest.raises(MessageError):  # what no client of ours sends, a hostile one may
            messages.decode(line.replace(b"12345.5", raw), messages.REQUESTS)
    deep = (
        b'{"v": %d, "kind": "list", "users": ' % defaults.PROTOCOL_VERSION
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}"
    )
    with pytest.raises(MessageError, match="nested too deeply"):
        messages.decode(deep, messages.REQUESTS)


def test_a_field_of_a_type_json_cannot_spell_is_refused_whatever_is_sent():
    class Odd(codec.Message, tag="odd"):
        value: socket.socket

    for value in (1, "s", {}, [], None):
        with pytest.raises(MessageError, match="odd.value: expected `socket`"):
            codec.Wire(Odd).decode(json.dumps({"kind": "odd", "value": value}).encode())


def test_the_state_of_the_previous_releases_host_is_read_in_full_to_adopt_its_jobs():
    """What a host of the dict-based protocol (HOST_VERSION .../1) answered a hello with."""
    figures = {
        "steps_done": 5,
        "steps_total": None,
        "attained": 0.5,
        "mean_iteration": 0.1,
        "mean_gap": None,
        "mem_persistent": 1000,
        "mem_peak": 2000,
        "holds_lane": False,
    }
    line = json.dumps(
        {
            "op": "state",
            "version": "0.1.0/1",
            "pid": 4321,
            "device": "cpu",
            "lanes": 1,
            "policy": ["fifo", "always", "100ms"],
            "draining": False,
            "residents": [
                {
                    "job": 3,
                    "run": 1,
                    **figures,
                    "pid": 99,
                    "started": 1.7e9,
                    "time_limit": None,
                    "kill_why": None,
                }
            ],
            "exited": [
                {
                    "job": 4,
                    "run": 2,
                    **figures,
                    "op": "exited",
                    "code": 0,
                    "signal": None,
                    "kill_why": "cancel",
                    "end_time": 1.7e9,
                }
            ],
        }
    ).encode()
    state = wire.decode(line, wire.TO_DAEMON)
    assert isinstance(state, host_messages.State) and state.version == "0.1.0/1"
    assert [r.job for r in state.residents] == [3]
    assert (state.exited[0].job, state.exited[0].kill_why) == (4, host_messages.StopWhy.CANCEL)


def _lines(sock: socket.socket, count: int) -> list[bytes]:
    received = b""
    while received.count(b"\n") < count:
        received += sock.recv(1 << 16)
    return received.splitlines()


def test_a_suspend_says_the_room_for_a_checkpoint_only_where_there_is_one():
    """A host of the version before knows no host_room and refuses a field it does not know:
    a Suspend without one is the same line as it was."""
    left, right = socket.socketpair()
    try:
        channel = wire.Channel(right, wire.TO_DAEMON)
        channel.send(host_messages.Suspend(1, True))
        channel.send(host_messages.Suspend(2, True, 300 << 20))
        assert _lines(left, 2) == [
            b'{"kind":"suspend","job":1,"suspended":true}',
            b'{"kind":"suspend","job":2,"suspended":true,"host_room":314572800}',
        ]
    finally:
        left.close()
        right.close()


@pytest.mark.parametrize("as_before", [True, False], ids=["a host from before", "a host of now"])
def test_a_host_is_answered_in_the_framing_its_state_came_in(as_before):
    """A host from before this framing speaks {"op": ...} only (it dropped the daemon at its
    first suspend or kill, and the daemon it at its first exit report, so its jobs could be
    neither suspended nor cancelled while it drained): once its State came so, the
    daemon's channel to it reads and speaks that framing."""
    left, right = socket.socketpair()
    try:
        channel = wire.Channel(right, wire.TO_DAEMON)
        state = {"version": "0.1.0/13", "pid": 42, "device": "cpu", "lanes": 1}
        state |= {"policy": ["fifo"], "draining": False, "residents": [], "exited": []}
        left.sendall(json.dumps({"op" if as_before else "kind": "state", **state}).encode())
        left.sendall(b"\n")
        assert isinstance(channel.receive_one(), host_messages.State)
        # What it says after its State comes in its framing too.
        said = {"job": 3, "run": 1, "code": 0, "end_time": 1.7e9}
        left.sendall(json.dumps({"op" if as_before else "kind": "exited", **said}).encode())
        left.sendall(b"\n")
        exited = channel.receive_one()
        assert isinstance(exited, host_messages.Exited) and (exited.job, exited.code) == (3, 0)
        channel.send(host_messages.Kill(1, host_messages.StopWhy.SHUTDOWN))
        channel.send(host_messages.Suspend(1, False))
        channel.send(host_messages.Drain())
        tag = b'"op"' if as_before else b'"kind"'
        assert _lines(left, 3) == [
            b"{" + tag + b':"kill","job":1,"why":"shutdown"}',
            b"{" + tag + b':"suspend","job":1,"suspended":false}',
            b'{"op":"drain"}',  # as every host reads it
        ]
    finally:
        left.close()
        right.close()


@pytest.mark.parametrize(
    "encode",
    [
        lambda text: b"\xef\xbb\xbf" + text.encode(),  # a UTF-8 byte-order mark
        lambda text: text.encode("utf-16"),
        lambda text: text.encode("utf-32-le"),
    ],
)
def test_a_frame_in_anything_but_plain_utf8_is_refused(encode):
    """Every gq peer writes UTF-8 without a byte-order mark; json.loads would guess at the
    rest, the codec does not."""
    line = messages.encode(messages.ListJobs()).decode().strip()
    assert messages.decode(line.encode(), messages.REQUESTS).states is None
    with pytest.raises(MessageError, match="not JSON"):
        messages.decode(encode(line), messages.REQUESTS)


# ----- gq's JSON framing (gq/jsonline.py, on _json without importing json) ------------------
_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON_VALUES)
def test_the_framing_writes_what_json_writes_and_reads_it_back(value):
    from gq import jsonline

    text = jsonline.dumps(value)
    assert text == json.dumps(value, separators=(",", ":"), allow_nan=False)
    assert jsonline.loads(f" {text}\n") == value


@pytest.mark.parametrize(
    "text",
    ["NaN", "[Infinity]", "[-Infinity]", "{} x", "", " ", "{", "[1,]", "\ufeff{}", "{'a': 1}"],
)
def test_the_framing_reads_nothing_json_would_refuse_nor_a_number_that_is_not_finite(text):
    from gq import jsonline

    with pytest.raises(ValueError):
        jsonline.loads(text)


def test_the_framing_without_the_accelerator_reads_and_writes_alike():
    """Where _json is missing (another Python), the json module does the same work."""
    code = """if True:
        import sys
        sys.modules["_json"] = None
        from gq import jsonline
        assert not jsonline.ACCELERATED
        assert jsonline.dumps({"a": [1, 2.5, None, "\\u00e9"]}) == '{"a":[1,2.5,null,"\\\\u00e9"]}'
        assert jsonline.loads(' {"a": [1]} ') == {"a": [1]}
        for bad in ("NaN", "{} x", ""):
            try:
                jsonline.loads(bad)
            except ValueError:
                continue
            raise AssertionError(bad)
        try:
            jsonline.dumps({"a": float("nan")})
        except ValueError:
            print("refused")
    """
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout == "refused\n", result.stderr
    from gq import jsonline

    with pytest.raises(ValueError):
        jsonline.dumps({"a": math.inf})
    with pytest.raises(TypeError):
        jsonline.dumps({"a": object()})
