"""One codec for every wire between gq's processes (client and daemon, daemon and host,
host and worker): a message is a dataclass, sent as one line of JSON, and decoding checks
every field against its annotation before any handler sees it.

What decoding guarantees, whatever the peer sent:
- the line is JSON (no NaN or Infinity), an object, of a known kind, with every required
  field and no unknown one;
- integers are integers (not booleans) within their ``Bounds`` (int64 unless narrower),
  floats are finite and within theirs;
- strings are at most ``MaxLen`` characters (``DEFAULT_TEXT`` unless given), hold no NUL
  and are valid UTF-8 (no lone surrogates);
- lists and dicts have at most ``MaxLen`` items (``DEFAULT_ITEMS`` unless given), dict
  keys are checked like strings, enums are one of their values, bytes travel as base64;
- ``Where(test, what)`` adds any other rule (an environment key has no ``=``).

Anything else raises :class:`MessageError` naming the field, so a hostile frame costs its
sender its own channel and nothing more. Imports nothing beyond the standard library and
gq's JSON framing and integer bounds; a client imports it for any typed request.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

from gq import jsonline
from gq.validation import INT64_MAX

INT64_MIN = -INT64_MAX - 1
DEFAULT_TEXT = 1 << 16  # characters in a string field without its own MaxLen
DEFAULT_ITEMS = 1 << 20  # items in a list or dict field without its own MaxLen


class MessageError(Exception):
    """A line that is not a well-formed message of its protocol."""


class VersionMismatch(MessageError):
    def __init__(self, theirs: object, ours: object):
        super().__init__(f"protocol version {theirs!r}, expected {ours!r}")
        self.theirs = theirs


class FrameTooLarge(ValueError):
    """A message that would not fit in its wire's frame: a sender's bug, never sent."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Inclusive range of an int or float field."""

    low: float
    high: float


@dataclasses.dataclass(frozen=True)
class MaxLen:
    """Most characters of a string, items of a list or dict."""

    limit: int


@dataclasses.dataclass(frozen=True)
class Where:
    """A further rule: ``test(value)`` must hold; ``what`` says what it must be."""

    test: Callable[[Any], bool]
    what: str


Count = Annotated[int, Bounds(0, INT64_MAX)]  # ids, steps, bytes: never negative
Positive = Annotated[int, Bounds(1, INT64_MAX)]
Pid = Annotated[int, Bounds(1, (1 << 31) - 1)]
NonNegative = Annotated[float, Bounds(0.0, math.inf)]


@typing.dataclass_transform()  # for type checkers: a message class is a dataclass
def message(cls):
    """A message class: a dataclass without generated repr and eq, which cost the client
    much of its import time."""
    return dataclasses.dataclass(repr=False, eq=False)(cls)


# ----- encoding -----------------------------------------------------------------------
def to_wire(value: Any) -> Any:
    """Plain JSON values for a message (or any value inside one)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    names = _field_names(kind)
    if names is not None:
        return {name: to_wire(getattr(value, name)) for name in names}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list):
        return [to_wire(item) for item in value]
    if isinstance(value, dict):
        return {key: to_wire(item) for key, item in value.items()}
    return value


_PLAIN = frozenset({str, int, float, bool, type(None)})
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(kind: type) -> tuple[str, ...] | None:
    """A message class's field names, None for any other type (looked up once a type:
    encoding is on every boundary's path and every answer's)."""
    try:
        return _FIELD_NAMES[kind]
    except KeyError:
        names = (
            tuple(spec.name for spec in dataclasses.fields(kind))
            if dataclasses.is_dataclass(kind)
            else None
        )
        _FIELD_NAMES[kind] = names
        return names


def dumps(data: dict[str, Any], limit: int | None = None) -> bytes:
    """One line of JSON; FrameTooLarge past ``limit`` bytes (newline included)."""
    line = jsonline.line(data)
    if limit is not None and len(line) > limit:
        raise FrameTooLarge(
            f"{data.get('kind', data.get('op'))!r} message of {len(line)} "
            f"bytes is over the {limit}-byte frame"
        )
    return line


# ----- decoding -----------------------------------------------------------------------
def loads(line: bytes | str) -> dict[str, Any]:
    """The JSON object a line holds (UTF-8, no byte-order mark); MessageError for anything
    else."""
    try:
        text = line if isinstance(line, str) else line.decode("utf-8", "surrogatepass")
        data = jsonline.loads(text)
    except RecursionError:
        raise MessageError("nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MessageError(f"not JSON ({str(exc)[:100]})") from None
    if not isinstance(data, dict):
        raise MessageError("not a JSON object")
    return data


def build(cls: type, data: Any, where: str) -> Any:
    """An instance of the message class ``cls`` from decoded JSON, every field checked."""
    return _decoder(cls)(data, where)


Check = Callable[[Any, str], Any]
_DECODERS: dict[type, Check] = {}


def _decoder(cls: type) -> Check:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = _compile(cls)
    return decoder


def _compile(cls: type) -> Check:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = []
    for spec in dataclasses.fields(cls):
        required = (
            spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING
        )
        fields.append((spec.name, _checker(hints[spec.name]), required))
    names = frozenset(name for name, _, _ in fields)

    def decode(data: Any, where: str) -> Any:
        if not isinstance(data, dict):
            raise MessageError(f"{where}: expected an object")
        if not names.issuperset(data):
            unknown = sorted(str(k) for k in set(data) - names)[0]
            raise MessageError(f"{where}: unknown field {unknown[:40]!r}")
        values = {}
        for name, check, required in fields:
            if name in data:
                values[name] = check(data[name], f"{where}.{name}")
            elif required:
                raise MessageError(f"{where}: missing field {name!r}")
        return cls(**values)

    return decode


def _checker(hint: Any, meta: tuple = ()) -> Check:
    """A function that checks (and converts) one field's JSON value against ``hint``."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extra = typing.get_args(hint)
        return _checker(base, meta + tuple(extra))
    bounds = next((m for m in meta if isinstance(m, Bounds)), None)
    length = next((m.limit for m in meta if isinstance(m, MaxLen)), None)
    rules = [m for m in meta if isinstance(m, Where)]
    check = _base_checker(hint, origin, bounds, length)
    if not rules:
        return check

    def checked(value: Any, where: str) -> Any:
        value = check(value, where)
        for rule in rules:
            if not rule.test(value):
                raise MessageError(f"{where}: must be {rule.what}")
        return value

    return checked


def _base_checker(hint: Any, origin: Any, bounds: Bounds | None, length: int | None) -> Check:
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        rest = [option for option in options if option is not type(None)]
        if len(rest) == 1 and len(options) == 2:  # X | None
            inner = _checker(rest[0])
            return lambda value, where: None if value is None else inner(value, where)
        checks = [_checker(option) for option in options]

        def union(value: Any, where: str) -> Any:
            for check in checks:
                try:
                    return check(value, where)
                except MessageError:
                    continue
            raise MessageError(f"{where}: unexpected {type(value).__name__}")

        return union
    if hint is type(None):
        return _expect(lambda v: v is None, "null")
    if hint is bool:
        return _expect(lambda v: isinstance(v, bool), "a boolean")
    if hint is int:
        low, high = (bounds.low, bounds.high) if bounds else (INT64_MIN, INT64_MAX)
        return _integer(low, high)
    if hint is float:
        low, high = (bounds.low, bounds.high) if bounds else (-math.inf, math.inf)
        return _real(low, high)
    if hint is str:
        return _text(length or DEFAULT_TEXT)
    if hint is bytes:
        return _binary(length)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _member(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return _sequence(_checker(item), length or DEFAULT_ITEMS)
    if origin is dict:
        key, item = typing.get_args(hint)
        return _mapping(_checker(key), _checker(item), length or DEFAULT_ITEMS)
    if dataclasses.is_dataclass(hint):
        return lambda value, where: _decoder(hint)(value, where)
    raise TypeError(f"no wire form for {hint!r}")


def _expect(test: Callable[[Any], bool], what: str) -> Check:
    def check(value: Any, where: str) -> Any:
        if not test(value):
            raise MessageError(f"{where}: expected {what}, not {_kind(value)}")
        return value

    return check


def _integer(low: float, high: float) -> Check:
    def check(value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise MessageError(f"{where}: expected an integer, not {_kind(value)}")
        if not low <= value <= high:
            raise MessageError(
                f"{where}: {_short(value)} is out of range [{_short(low)}, {_short(high)}]"
            )
        return value

    return check


def _real(low: float, high: float) -> Check:
    def check(value: Any, where: str) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise MessageError(f"{where}: expected a number, not {_kind(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise MessageError(f"{where}: {_short(value)} is out of range") from None
        if not math.isfinite(number) or not low <= number <= high:
            raise MessageError(
                f"{where}: {_short(value)} is out of range [{_short(low)}, {_short(high)}]"
            )
        return number

    return check


def _text(limit: int) -> Check:
    def check(value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise MessageError(f"{where}: expected a string, not {_kind(value)}")
        if len(value) > limit:
            raise MessageError(f"{where}: longer than {limit} characters")
        if "\0" in value:
            raise MessageError(f"{where}: holds a NUL character")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise MessageError(f"{where}: not valid UTF-8 text") from None
        return value

    return check


def _binary(limit: int | None) -> Check:
    def check(value: Any, where: str) -> bytes:
        if not isinstance(value, str):
            raise MessageError(f"{where}: expected base64 text, not {_kind(value)}")
        if limit is not None and len(value) > (limit + 2) // 3 * 4:
            raise MessageError(f"{where}: longer than {limit} bytes")
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise MessageError(f"{where}: not base64") from None

    return check


def _member(kind: type[enum.Enum]) -> Check:
    values = {member.value: member for member in kind}

    def check(value: Any, where: str) -> enum.Enum:
        try:
            return values[value]
        except (KeyError, TypeError):
            raise MessageError(
                f"{where}: expected one of {', '.join(map(str, values))}, not {_short(value)}"
            ) from None

    return check


def _sequence(item: Check, limit: int) -> Check:
    def check(value: Any, where: str) -> list:
        if not isinstance(value, list):
            raise MessageError(f"{where}: expected a list, not {_kind(value)}")
        if len(value) > limit:
            raise MessageError(f"{where}: more than {limit} items")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

    return check


def _mapping(key: Check, item: Check, limit: int) -> Check:
    def check(value: Any, where: str) -> dict:
        if not isinstance(value, dict):
            raise MessageError(f"{where}: expected an object, not {_kind(value)}")
        if len(value) > limit:
            raise MessageError(f"{where}: more than {limit} items")
        return {key(k, f"{where} key"): item(v, f"{where}[{_short(k)}]") for k, v in value.items()}

    return check


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: Any) -> str:
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**20
        else f"{'-' if value < 0 else ''}a {len(str(abs(value)))}-digit number"
    )
    return text if len(text) <= 40 else text[:37] + "..."
