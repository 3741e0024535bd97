"""JSON as every gq wire frames it: one compact object per line, no NaN or Infinity.

Built straight on CPython's ``_json`` accelerator, which ``json`` itself wraps: importing
``json`` also imports ``re`` and ``enum``, about as long as Python takes to start, and
``gq status`` and ``gq submit`` speak this framing on every call. The output is byte for
byte what ``json.dumps(data, separators=(",", ":"), allow_nan=False)`` gives.
"""

from __future__ import annotations

try:
    from _json import encode_basestring_ascii, make_encoder, make_scanner

    ACCELERATED = True
except ImportError:  # another Python: the json module, slower to import, same results
    ACCELERATED = False


class _Reading:
    """What the scanner reads from ``json.JSONDecoder``: its options, as ours are."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name: str) -> None:
        raise ValueError(f"{name} is not a number")


def _unserialisable(value: object) -> None:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


if ACCELERATED:
    # (its stub asks for a make_scanner, but the scanner reads only the options above, as
    # json.decoder's JSONDecoder has them: the stub says so in a TODO)
    _scan = make_scanner(_Reading())  # type: ignore[arg-type]
    # No markers (None): a dict of them would be shared by every call, and keep the ids
    # of an encoding that raised; gq's messages hold no cycles.
    _encode = make_encoder(
        None, _unserialisable, encode_basestring_ascii, None, ":", ",", False, False, False
    )
else:
    import json

    _decoder = json.JSONDecoder(parse_constant=_Reading.parse_constant)


def dumps(data: object) -> str:
    """``data`` as compact JSON; ValueError for a float that is not finite."""
    if not ACCELERATED:
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    return "".join(_encode(data, 0))


def line(data: object) -> bytes:
    """``data`` as one line of a wire: its compact JSON and a newline."""
    return dumps(data).encode() + b"\n"


def loads(text: str) -> object:
    """The one JSON value ``text`` holds (whitespace around it allowed); ValueError for
    anything else, NaN and Infinity included."""
    if not ACCELERATED:
        return _decoder.decode(text)
    start = len(text) - len(text.lstrip(" \t\n\r"))
    try:
        value, end = _scan(text, start)
    except StopIteration as exc:
        raise ValueError(f"expecting a value at character {exc.value}") from None
    if text[end:].strip(" \t\n\r"):
        raise ValueError(f"extra data at character {end}")
    return value
