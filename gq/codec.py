"""One typed layer for every wire between gq's processes (client and daemon, daemon and
host, host and worker), on msgspec: a message is a ``Message`` struct, sent as one line of
JSON ``{"kind": ..., fields...}``, and decoding it is its only validation.

What decoding guarantees, whatever the peer sent:
- the line is JSON (no NaN or Infinity, valid UTF-8, no lone surrogates), an object of a
  kind its wire receives, with every required field and no unknown one;
- integers are integers (not booleans) within their ``Bounds`` (int64 for ``Int``), floats
  are finite and within theirs;
- strings and lists hold at most ``MaxLen`` characters or items, no string holds a NUL,
  enums are one of their values, bytes travel as base64;
- ``Where(pattern, what)`` adds a rule a string must match (an environment key has no
  ``=``).

Anything else raises :class:`MessageError` naming the message and the field
(``total.steps: expected `int`, got `null```), so a hostile frame costs its sender its own
channel and nothing more.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Union

import msgspec

from gq import jsonline
from gq.validation import INT64_MAX, printable

INT64_MIN = -INT64_MAX - 1
DEFAULT_TEXT = 1 << 16  # characters of a string field typed Str


class MessageError(Exception):
    """A line that is not a well-formed message of its wire."""


class VersionMismatch(MessageError):
    def __init__(self, theirs: object, ours: object):
        # What the peer sent may be anything JSON holds: only a short, printable version
        # of it is kept.
        theirs = theirs if isinstance(theirs, int) else printable(repr(theirs)[:40])
        super().__init__(f"protocol version {theirs}, expected {ours!r}")
        self.theirs = theirs


class FrameTooLarge(ValueError):
    """A message that would not fit in its wire's frame: a sender's bug, never sent."""


def Bounds(low: float, high: float) -> msgspec.Meta:
    """Inclusive range of an int or float field."""
    return msgspec.Meta(ge=None if math.isinf(low) else low, le=None if math.isinf(high) else high)


def MaxLen(limit: int) -> msgspec.Meta:
    """Most characters of a string, items of a list or dict."""
    return msgspec.Meta(max_length=limit)


def Where(pattern: str, what: str) -> msgspec.Meta:
    """A string's further rule: it matches ``pattern``; ``what`` says in words what it is."""
    return msgspec.Meta(pattern=pattern, description=what)


Int = Annotated[int, Bounds(INT64_MIN, INT64_MAX)]
Str = Annotated[str, MaxLen(DEFAULT_TEXT)]
Count = Annotated[int, Bounds(0, INT64_MAX)]  # ids, steps, bytes: never negative
Positive = Annotated[int, Bounds(1, INT64_MAX)]
Pid = Annotated[int, Bounds(1, (1 << 31) - 1)]
NonNegative = Annotated[float, Bounds(0.0, math.inf)]


class Record(msgspec.Struct, forbid_unknown_fields=True, eq=False):
    """A record messages carry (a job, a device): its fields, checked as a message's are.
    No generated equality: records are compared by identity, as they are used."""


class Message(Record, tag_field="kind"):
    """A message: a record sent on its own, named on the wire by its ``kind``."""

    @property
    def kind(self) -> str:
        return kind_of(type(self))


def kind_of(cls: type) -> str:
    """The kind a message class is sent as."""
    return cls.__struct_config__.tag  # type: ignore[attr-defined]


class _Envelope(msgspec.Struct):
    """What any line says of itself, read leniently to explain why it was refused."""

    kind: Any = None
    v: Any = None


_ENVELOPE = msgspec.json.Decoder(_Envelope)


class Wire:
    """The messages one end of one wire receives, and their decoder. ``version``: every
    message on it says its protocol version (a client's wire), checked first."""

    def __init__(self, *classes: type, version: object = None):
        self.classes = {kind_of(cls): cls for cls in classes}
        self.version = version
        # What a refusal names where the line has no kind: a record's class.
        self.name = classes[0].__name__ if len(classes) == 1 else ""
        # A union of a tuple of classes, which X | Y cannot spell.
        self._decoder = msgspec.json.Decoder(Union[classes])  # noqa: UP007

    def decode(self, line: bytes) -> Any:
        """The message a line holds, every field checked; MessageError otherwise
        (VersionMismatch where the line says another version than this wire's, or none:
        checked first, so that a peer of another version hears that, whatever else its
        line holds)."""
        try:
            if self.version is not None:
                theirs = _ENVELOPE.decode(line).v
                if theirs != self.version:
                    raise VersionMismatch(theirs, self.version)
            message = self._decoder.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise self._refusal(exc, line) from None
        except RecursionError:  # msgspec skips an unknown field's value recursively
            raise MessageError("nested too deeply") from None
        if b"\\u0000" in line:
            self._refuse_nul(message)
        return message

    def _refusal(self, exc: Exception, line: bytes) -> MessageError:
        """Why a line was refused, in one printable line: msgspec's words quote what the
        peer sent (an unknown field's name), which may hold anything."""
        try:
            envelope = _ENVELOPE.decode(line)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError):
            envelope = None
        except RecursionError:
            return MessageError("nested too deeply")
        if isinstance(exc, UnicodeDecodeError):
            return MessageError("not JSON (not valid UTF-8)")
        if not isinstance(exc, msgspec.ValidationError):  # (which is a DecodeError too)
            return MessageError(f"not JSON ({printable(str(exc)[:100])})")
        if envelope is None:
            return MessageError("not a JSON object")
        reason, _, path = str(exc).partition(" - at ")
        if path == "`$.kind`" or "missing required field `kind`" in reason:
            return MessageError(f"unknown kind {str(envelope.kind)[:40]!r}")
        kind = envelope.kind if isinstance(envelope.kind, str) else self.name
        where = printable(kind[:40] + _where(path)[:200])
        return MessageError(f"{where}: {printable(reason[:1].lower() + reason[1:200])}")

    def _refuse_nul(self, message: Any) -> None:
        """A line whose JSON escapes a NUL: refused where a decoded string holds one."""
        where = _nul_in(message, "")
        if where is not None:
            kind = getattr(message, "kind", self.name)
            raise MessageError(f"{kind}{where}: holds a NUL character")


def _where(path: str) -> str:
    """msgspec's ``$.a.b[0]`` (or ``key`` in ``$.env``) as ``.a.b[0]`` (``.env key``)."""
    path = path.strip("`")
    if path.startswith("key` in `"):
        return path.removeprefix("key` in `").removeprefix("$") + " key"
    return path.removeprefix("$")


def _nul_in(value: Any, where: str) -> str | None:
    """Where in a decoded value a string holds a NUL (``.job.env['A']``), None if nowhere."""
    if isinstance(value, str):
        return where if "\0" in value else None
    if isinstance(value, Record):
        items = [(f"{where}.{name}", getattr(value, name)) for name in value.__struct_fields__]
    elif isinstance(value, list):
        items = [(f"{where}[{index}]", item) for index, item in enumerate(value)]
    elif isinstance(value, dict):
        if any("\0" in key for key in value):
            return f"{where} key"
        items = [(f"{where}[{key!r}]", item) for key, item in value.items()]
    else:
        return None
    for inner, item in items:
        found = _nul_in(item, inner)
        if found is not None:
            return found
    return None


def encode(message: Any, limit: int | None = None) -> bytes:
    """One line of JSON; FrameTooLarge past ``limit`` bytes (newline included), ValueError
    for a float that is not finite (a sender's bug: JSON has no NaN, and msgspec's own
    encoder would send it as null)."""
    what = getattr(message, "kind", type(message).__name__)
    return frame(msgspec.to_builtins(message), what, limit)


def frame(data: dict[str, Any], what: str, limit: int | None = None) -> bytes:
    """Plain JSON values as one line of a wire; FrameTooLarge past ``limit`` bytes
    (``what``: the message, as the error names it)."""
    line = jsonline.line(data)
    if limit is not None and len(line) > limit:
        raise FrameTooLarge(f"{what!r} message of {len(line)} bytes is over the {limit}-byte frame")
    return line


def checked(message: Any) -> Any:
    """``message`` (or a record inside one) as its receiver will decode it, every field
    within its bounds; else MessageError. For messages built from what users gave (a
    launch) or from what a worker said (a report on its job): refused here, such a value
    costs its own job, not the receiver's trust in the whole channel."""
    wire = _ALONE.get(type(message))
    if wire is None:
        wire = _ALONE[type(message)] = Wire(type(message))
    try:
        line = encode(message)
    except ValueError as exc:
        raise MessageError(str(exc)) from None
    return wire.decode(line)


_ALONE: dict[type, Wire] = {}


def fields_of(message: Any) -> dict[str, Any]:
    """A message's (or a record's) fields as plain JSON values, without its kind."""
    data = msgspec.to_builtins(message)
    if message.__struct_config__.tag is not None:
        del data[message.__struct_config__.tag_field]
    return data
