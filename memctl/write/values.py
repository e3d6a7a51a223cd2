"""The checks every field of a record passes at the gate (memctl.write.gate): types, NUL, UTF-8, lengths.

Bad values raise errors.BadValue naming the field (exit 2), text PostgreSQL cannot hold (NUL, lone surrogates)
included: bad input is exit 2 wherever it comes from (an argument, stdin, a field, a JSONL line).
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import Any, Literal, overload

from memctl.errors import BadValue

MAX_KEY = 255
# C0 and C1 controls and DEL: in a key or a name they break every table and line that shows it (a newline
# splits a row, an escape sequence rewrites the terminal). Text and values may hold them; keys and names not.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
MAX_NAME = 200  # agent, kind, source, namespace: names, not texts
DEFAULT_NAMESPACE = "default"  # a fact's namespace when none is given
# Leads every statement that puts or changes data in a memory table (memctl.write.store's writers, and the
# few UPDATEs listed in docs/testing.md "The writer check"): the test suite's trigger refuses a write without it.
WRITER = "/* memctl:writer */\n"
EARLIEST = datetime.datetime(
    1900, 1, 1, tzinfo=datetime.timezone.utc
)  # no memory is older than this


@dataclass(frozen=True)
class Limits:
    """[limits]: the one size limit of every write (bytes of UTF-8), and how far ahead a created_at may be.

    Every path reaches them through the gate (memctl.write.gate); the readers of stdin and of JSONL lines
    read at most what a record within them can take (`line_bytes`), so an oversized input is refused before
    it is held in memory.
    """

    episode_bytes: int
    value_bytes: int
    meta_bytes: int
    clock_skew: float  # seconds

    @classmethod
    def of(cls, settings) -> "Limits":
        from memctl import config

        conf = settings.limits if settings is not None else config.Limits()
        return cls(
            conf.episode_bytes,
            conf.value_bytes,
            conf.meta_bytes,
            config.parse_duration(conf.clock_skew),
        )

    def line_bytes(self) -> int:
        """The longest JSONL line of `episode import` or `fact import`: a record at the limits, every byte
        escaped (\\u0001 is 6 bytes for 1), with room for its other fields."""
        return 6 * max(self.episode_bytes + self.meta_bytes, self.value_bytes) + LINE_SLACK

    def export_line_bytes(self) -> int:
        """The longest line of `memctl import`: an episode at the limit with its chunks and their vectors as
        JSON text (up to about 110 bytes a byte of text with 4,000-dimension vectors), or a fact's history."""
        return EXPORT_LINE_FACTOR * self.episode_bytes + LINE_SLACK


LINE_SLACK = 64 * 1024
EXPORT_LINE_FACTOR = 128


def within(value: str, limit: int, what: str, setting: str) -> str:
    """VALUE, refused (BadValue, exit 2) when its UTF-8 is longer than LIMIT bytes, naming the setting."""
    if len(value) * 4 <= limit:  # at most 4 bytes a character: no need to count
        return value
    size = len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise BadValue(too_long(what, size, limit, setting), what)
    return value


def too_long(what: str, size: int | None, limit: int, setting: str) -> str:
    has = (
        f"{size:,} bytes, over the limit of {limit:,}"
        if size is not None
        else f"over the limit of {limit:,} bytes"
    )
    return f"{what}: {has} ([limits] {setting}); nothing was written: split it, or raise the limit"


def in_time(
    when: datetime.datetime,
    limits: Limits,
    what: str = "created_at",
    now: datetime.datetime | None = None,
) -> datetime.datetime:
    """An episode's time: not before 1900, not more than [limits] clock_skew after now (BadValue, exit 2)."""
    if when < EARLIEST:
        raise BadValue(
            f"{what} {when.isoformat()}: before {EARLIEST.date().isoformat()}, the earliest time memctl "
            "takes (a typo, or a clock that was never set?)",
            what,
        )
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if (when - now).total_seconds() > limits.clock_skew:
        raise BadValue(
            f"{what} {when.isoformat()}: in the future (it is {now.isoformat(timespec='seconds')}), "
            f"more than the {_seconds(limits.clock_skew)} [limits] clock_skew allows; nothing was "
            "written: memory holds what happened",
            what,
        )
    return when


def _seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def no_nul(value: str | None, what: str) -> None:
    if value is not None and "\x00" in value:
        raise BadValue(
            f"the {what} contains a NUL character (\\0) at position {value.index(chr(0))}; "
            "PostgreSQL text cannot store it: remove or escape it",
            what,
        )
    utf8(value, what)


def utf8(value: str | None, what: str, error: type = BadValue) -> None:
    """Refuse a str UTF-8 cannot hold: a lone surrogate (invalid bytes in an argument, a \\uD800 escape)."""
    if value is None or value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        message = f"the {what} is not valid UTF-8 text (a lone surrogate at position {exc.start})"
        raise (error(message, what) if error is BadValue else error(message)) from None


def parse_time(value: Any, what: str = "created_at") -> datetime.datetime:
    """ISO 8601 to an aware datetime; a time without a zone is taken as UTC."""
    if isinstance(value, datetime.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise BadValue(
                f"{what}: not an ISO 8601 date/time: {value[:80]!r} (e.g. 2026-08-11T09:30:00Z)",
                what,
            ) from None
    else:
        raise BadValue(f"{what}: must be an ISO 8601 string, got {type(value).__name__}", what)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    try:
        parsed.astimezone(datetime.timezone.utc)
    except OverflowError:
        raise BadValue(
            f"{what}: out of range: {str(value)[:80]!r} falls before the year 1 or after 9999 in UTC",
            what,
        ) from None
    return parsed


@overload
def name(value: Any, what: str, *, default: str, optional: bool = ...) -> str: ...
@overload
def name(value: Any, what: str, *, default: None = ..., optional: Literal[False] = ...) -> str: ...
@overload
def name(
    value: Any, what: str, *, default: str | None = ..., optional: bool = ...
) -> str | None: ...
def name(
    value: Any, what: str, *, default: str | None = None, optional: bool = False
) -> str | None:
    """A name field (agent, kind, source, namespace): a non-empty string without NUL, of bounded length."""
    if value is None:
        if default is not None or optional:
            return default
        raise BadValue(f"{what}: required", what)
    if not isinstance(value, str) or not value.strip():
        raise BadValue(f"{what}: must be a non-empty string, got {shown(value)}", what)
    if "\x00" in value:
        raise BadValue(f"{what}: contains a NUL character (\\0)", what)
    utf8(value, what, BadValue)
    if len(value) > MAX_NAME:
        raise BadValue(f"{what}: at most {MAX_NAME} characters (got {len(value)})", what)
    no_control(value, what)
    return value


def integer(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadValue(f"{what}: must be an integer from {low} to {high}, got {shown(value)}", what)
    return value


def shown(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_key(key: Any) -> str:
    if not isinstance(key, str):
        raise BadValue(f"key: must be a string, got {shown(key)}", "key")
    if not key:
        raise BadValue("key: a fact key must not be empty", "key")
    if len(key) > MAX_KEY:
        raise BadValue(f"key: a fact key has at most {MAX_KEY} characters (got {len(key)})", "key")
    if "\x00" in key:
        raise BadValue(
            "key: contains a NUL character (\\0), which PostgreSQL text cannot store", "key"
        )
    utf8(key, "key", BadValue)
    no_control(key, "key")
    return key


def no_control(value: str, what: str) -> None:
    """A key or name with a control character (a newline, a tab, an escape) is refused: exit 2, naming it."""
    found = CONTROL.search(value)
    if found is not None:
        raise BadValue(
            f"{what}: contains a control character ({found.group()!r} at position {found.start()}); "
            "keys and names are one line of printable text",
            what,
        )


def check_value(
    value: Any, what: str = "value", limit: int | None = None, setting: str = "value_bytes"
) -> str:
    """A text field's value; with LIMIT, at most that many bytes (the [limits] SETTING)."""
    if not isinstance(value, str):
        raise BadValue(f"{what}: must be a string, got {shown(value)}", what)
    if limit is not None:
        within(value, limit, what, setting)
    if "\x00" in value:
        raise BadValue(
            f"the {what} contains a NUL character (\\0), which PostgreSQL text cannot store", what
        )
    utf8(value, what)
    return value
