"""JSON in and out: the one JSONL reader, and the one conversion of values JSON has no type for.

Reading: UTF-8, one JSON value per line, blank lines skipped, a line numbered from 1 as a text
editor counts it. Every problem is reported as `line N: <what>` (LineError), whether the
reader found it (not UTF-8, not JSON, not an object, an unknown or missing field) or the
caller did while validating the record (`at(number, exc)`).

Writing: `dumps` and `plain` convert a value JSON has no type for as `json_value` does, for every
command's json and jsonl output, the MCP server's replies and `memctl export` alike.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import re
import uuid
from typing import Any, Callable, Iterable, Iterator

from memctl.errors import EXIT_USAGE, BadValue, InvalidInput


class BadLine(InvalidInput):
    """A line that is not a record (not UTF-8, not JSON, not an object, a field unknown or missing): bad input,
    exit 2 like a bad value in a field or an argument (README, exit codes)."""

    exit_code = EXIT_USAGE


class LineError(InvalidInput):
    """A bad JSONL line: the message names it. Bad input (exit 2) unless the error it came from says otherwise
    (a refused write: a blocked source, a secret in block mode, keeps its 1)."""

    exit_code = EXIT_USAGE

    def __init__(self, number: int, reason: str, exit_code: int | None = None):
        super().__init__(f"line {number}: {reason}")
        self.number = number
        self.reason = reason
        if exit_code is not None:
            self.exit_code = (
                exit_code  # a bad value (BadValue, exit 2) stays one with its line named
            )


def at(number: int, exc: Exception | str) -> LineError:
    """The error for line `number`, from a validation error raised while handling it (its exit code kept)."""
    code = getattr(exc, "exit_code", None)
    return LineError(number, exc.reason if isinstance(exc, LineError) else str(exc), code)


def parse(
    raw: bytes | str, *, fields: Iterable[str] | None = None, required: Iterable[str] = ()
) -> Any:
    """One line's value (None for a blank line); raises InvalidInput with the reason alone."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadLine(f"not valid UTF-8 (byte {exc.start})") from None
    else:
        text = raw
    if not text.strip():
        return None
    try:
        item = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if _SURROGATE_ESCAPE.search(text) and not _encodable(item):
        raise BadLine(
            "a \\uD800-\\uDFFF escape that is not a surrogate pair: not text UTF-8 can hold"
        )
    if fields is None and not required:
        return item
    if not isinstance(item, dict):
        raise BadLine("expected a JSON object")
    if fields is not None:
        unknown = set(item) - set(fields)
        if unknown:
            raise BadLine(f"unknown field(s): {', '.join(sorted(unknown))}")
    for name in required:
        if name not in item:
            raise BadLine(f"'{name}' is required")
    return item


# JSON may spell a UTF-16 surrogate as an escape; alone (not as a pair) it decodes to a str no UTF-8
# text column, hash or request can carry. Only a line holding such an escape is walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _encodable(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_encodable(k) and _encodable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_encodable(v) for v in value)
    return True


def read(
    lines: Iterable[bytes | str],
    *,
    fields: Iterable[str] | None = None,
    required: Iterable[str] = (),
    on_error: Callable[[LineError], None] | None = None,
) -> Iterator[tuple[int, Any]]:
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


def bounded(
    handle, limit: int, what: str, outcome: str = "nothing was imported"
) -> Iterator[bytes]:
    """HANDLE's lines, none held longer than LIMIT bytes: a longer one is refused (exit 2, naming the line and
    WHAT bounds it) once LIMIT + 1 bytes of it are read, so one endless line never fills memory."""
    number = 0
    while True:
        line = handle.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) > limit and not (len(line) == limit + 1 and line.endswith(b"\n")):
            from memctl.errors import EXIT_USAGE

            raise LineError(
                number, f"longer than {limit:,} bytes, the most {what} takes; {outcome}", EXIT_USAGE
            )
        yield line


def open_input(path: str, stdin=None):
    """A binary handle on a file, or on stdin for '-' (refused when empty: `Stdin`); an unreadable file is
    InvalidInput."""
    if path == "-":
        import sys

        return Stdin(stdin if stdin is not None else sys.stdin.buffer)
    try:
        return open(path, "rb")
    except IsADirectoryError:
        raise BadValue(f"{path} is a directory: give a file, or - for stdin", "FILE") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None


EMPTY_STDIN = (
    "stdin is empty: nothing came in (did a command before memctl in the pipeline fail?); memctl "
    "refuses an empty stdin rather than act on nothing"
)


def empty_stdin() -> BadValue:
    """The one rule of stdin (README): one that gives nothing at all is bad input (exit 2), everywhere, so a
    pipeline whose writer failed never stores a blank value or passes for an empty import."""
    return BadValue(EMPTY_STDIN, "stdin")


class Stdin:
    """stdin for a JSONL reader: refused (empty_stdin) when its first read finds the end; never closed here."""

    def __init__(self, handle) -> None:
        self.handle, self.started = handle, False

    def readline(self, size: int = -1) -> bytes:
        return self._seen(self.handle.readline(size))

    def read(self, size: int = -1) -> bytes:
        return self._seen(self.handle.read(size))

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")

    def close(self) -> None:
        pass

    def _seen(self, data: bytes) -> bytes:
        if not self.started and not data:
            raise empty_stdin()
        self.started = True
        return data


# --- writing --------------------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    """How memctl writes a value JSON has no type for (json.dumps' `default`): a date or a moment
    as ISO 8601, a duration in seconds, a Decimal as a float, bytes in hex, a UUID as its text,
    an Enum as its value. Any other is refused (TypeError), never written as its repr."""
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dumps(value: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """VALUE as one JSON text, non-ASCII characters kept, other values as json_value writes them;
    `compact`: no blank after a separator (an export's lines)."""
    return json.dumps(
        value,
        default=json_value,
        ensure_ascii=False,
        indent=indent,
        separators=(",", ":") if compact else None,
    )


def plain(value: Any) -> Any:
    """VALUE in JSON's own types, as dumps would write it: a mapping's keys as text, a tuple as a
    list, and json_value's form of every other value."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return json_value(value)
