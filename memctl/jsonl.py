"""The one JSONL reader: every command that reads JSONL goes through it, with one error format.

Rules: UTF-8, one JSON value per line, blank lines skipped, a line numbered from 1 as a text
editor counts it. Every problem is reported as `line N: <what>` (LineError), whether the
reader found it (not UTF-8, not JSON, not an object, an unknown or missing field) or the
caller did while validating the record (`at(number, exc)`).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Iterator

from memctl.errors import InvalidInput


class LineError(InvalidInput):
    """A bad JSONL line: the message names it."""

    def __init__(self, number: int, reason: str):
        super().__init__(f"line {number}: {reason}")
        self.number = number
        self.reason = reason


def at(number: int, exc: Exception | str) -> LineError:
    """The error for line `number`, from a validation error raised while handling it."""
    return LineError(number, exc.reason if isinstance(exc, LineError) else str(exc))


def parse(raw: bytes | str, *, fields: Iterable[str] | None = None, required: Iterable[str] = ()) -> Any:
    """One line's value (None for a blank line); raises InvalidInput with the reason alone."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if not text.strip():
        return None
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if fields is None and not required:
        return item
    if not isinstance(item, dict):
        raise InvalidInput("expected a JSON object")
    if fields is not None:
        unknown = set(item) - set(fields)
        if unknown:
            raise InvalidInput(f"unknown field(s): {', '.join(sorted(unknown))}")
    for name in required:
        if name not in item:
            raise InvalidInput(f"'{name}' is required")
    return item


def read(lines: Iterable[bytes | str], *, fields: Iterable[str] | None = None, required: Iterable[str] = (),
         on_error: Callable[[LineError], None] | None = None) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line.

    `fields` (allowed keys) or `required` make every line a JSON object. A bad line raises
    LineError, or, with `on_error`, is handed to it and skipped.
    """
    allowed = None if fields is None else frozenset(fields)
    for number, raw in enumerate(lines, start=1):
        try:
            item = parse(raw, fields=allowed, required=required)
        except InvalidInput as exc:
            error = at(number, exc)
            if on_error is None:
                raise error from None
            on_error(error)
            continue
        if item is not None:
            yield number, item


def open_input(path: str, stdin=None):
    """A binary handle on a file, or on stdin for '-'; an unreadable file is InvalidInput."""
    if path == "-":
        import sys

        return stdin if stdin is not None else sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
