"""The checks every field of a record passes at the gate (memctl.records.gate): types, NUL, UTF-8, lengths.

Bad values raise errors.BadValue naming the field (exit 2); text PostgreSQL cannot hold raises InvalidInput.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from memctl.errors import BadValue, InvalidInput

MAX_KEY = 255
MAX_NAME = 200  # agent, kind, source, namespace: names, not texts
DEFAULT_NAMESPACE = "default"  # a fact's namespace when none is given
# Leads every statement that puts or changes data in a memory table (memctl.records.store's writers, and the
# few UPDATEs listed in docs/testing.md "The writer check"): the test suite's trigger refuses a write without it.
WRITER = "/* memctl:writer */\n"


def no_nul(value: str | None, what: str) -> None:
    if value is not None and "\x00" in value:
        raise InvalidInput(f"the {what} contains a NUL character (\\0) at position {value.index(chr(0))}; "
                           "PostgreSQL text cannot store it: remove or escape it")
    utf8(value, what)


def utf8(value: str | None, what: str, error: type = InvalidInput) -> None:
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
            raise BadValue(f"{what}: not an ISO 8601 date/time: {value[:80]!r} (e.g. 2026-08-11T09:30:00Z)",
                           what) from None
    else:
        raise BadValue(f"{what}: must be an ISO 8601 string, got {type(value).__name__}", what)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    try:
        parsed.astimezone(datetime.timezone.utc)
    except OverflowError:
        raise BadValue(f"{what}: out of range: {str(value)[:80]!r} falls before the year 1 or after 9999 in UTC",
                       what) from None
    return parsed


def name(value: Any, what: str, *, default: str | None = None, optional: bool = False) -> str | None:
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
        raise BadValue("key: contains a NUL character (\\0), which PostgreSQL text cannot store", "key")
    utf8(key, "key", BadValue)
    return key


def check_value(value: Any, what: str = "value") -> str:
    if not isinstance(value, str):
        raise BadValue(f"{what}: must be a string, got {shown(value)}", what)
    if "\x00" in value:
        raise InvalidInput(f"the {what} contains a NUL character (\\0), which PostgreSQL text cannot store")
    utf8(value, what)
    return value
