"""What `memctl ingest` reads: one line of a log in, the fields of one episode out (docs/ingest.md).

Formats: `lines` (the line is the text), `jsonl` (memctl's episode import format), `journal` (journald's
JSON export, `journalctl -o json`) and `syslog` (RFC 5424, RFC 3164, and rsyslog's RFC 3339 file format).
Every parser is a fixed number of passes over its line (str methods and anchored patterns with no nested
repetition): a hostile line costs time linear in its length. A line that cannot be read raises
BadLine (bad input) with the reason; the caller reports it by number and goes on.

Severity to importance (syslog PRI % 8, journald PRIORITY), the one table both use:

| severity | 0 emerg | 1 alert | 2 crit | 3 err | 4 warning | 5 notice | 6 info | 7 debug |
| importance | 10 | 9 | 8 | 7 | 5 | 4 | 3 | 1 |
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

from memctl.files.jsonl import BadLine  # a line that is not a record: bad input, exit 2 (README)

IMPORTANCE = (10, 9, 8, 7, 5, 4, 3, 1)  # by severity 0..7
SEVERITY = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
LOG_KIND = "log"
UTC = datetime.timezone.utc


@dataclass
class Record:
    """One episode's fields as read (validated later, by the gate's rules) and where the stream stood after it."""

    content: str
    created_at: datetime.datetime | str | None = None
    source: str | None = None
    kind: str | None = None
    importance: int | None = None
    agent: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    cursor: str | None = None  # journald's __CURSOR


def text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadLine(f"not valid UTF-8 (byte {exc.start})") from None


def importance_of(severity: int) -> int:
    return IMPORTANCE[severity]


# --- journald -----------------------------------------------------------------------------------------------

JOURNAL_SOURCE = ("_SYSTEMD_UNIT", "_SYSTEMD_USER_UNIT", "SYSLOG_IDENTIFIER", "_COMM")


def journal(raw: bytes) -> Record:
    """One entry of `journalctl -o json`: MESSAGE (a string, or an array of bytes when not UTF-8 text),
    __REALTIME_TIMESTAMP (microseconds since the epoch), the unit, PRIORITY, __CURSOR."""
    try:
        entry = json.loads(text(raw))
    except json.JSONDecodeError as exc:
        raise BadLine(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(entry, dict):
        raise BadLine("expected a journald entry (a JSON object)")
    message = _journal_text(entry.get("MESSAGE"))
    if message is None:
        raise BadLine("no MESSAGE (journalctl leaves out a binary one over 4 KiB unless --all)")
    stamp = _one(entry.get("__REALTIME_TIMESTAMP"))
    if not isinstance(stamp, str) or not stamp.isdigit() or len(stamp) > 17:
        raise BadLine("__REALTIME_TIMESTAMP: not microseconds since the epoch")
    at = datetime.datetime.fromtimestamp(0, UTC) + datetime.timedelta(microseconds=int(stamp))
    source = next(
        (v for v in (_one(entry.get(k)) for k in JOURNAL_SOURCE) if isinstance(v, str) and v), None
    )
    priority = _one(entry.get("PRIORITY"))
    importance = (
        importance_of(int(priority))
        if isinstance(priority, str) and priority in "01234567" and len(priority) == 1
        else None
    )
    meta = {
        k: v
        for k, v in (("host", _one(entry.get("_HOSTNAME"))), ("pid", _one(entry.get("_PID"))))
        if isinstance(v, str)
    }
    if importance is not None:
        meta["priority"] = SEVERITY[int(priority)]
    cursor = entry.get("__CURSOR")
    return Record(
        message,
        at,
        source,
        LOG_KIND,
        importance,
        None,
        meta,
        cursor if isinstance(cursor, str) else None,
    )


def _one(value: Any) -> Any:
    """A field journald gave twice is an array of its values: the first."""
    return (
        value[0] if isinstance(value, list) and value and not isinstance(value[0], int) else value
    )


def _journal_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        # not UTF-8 text (or holding control bytes): kept readable, bad bytes as U+FFFD, NUL dropped
        return bytes(value).decode("utf-8", errors="replace").replace("\x00", "")
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


def journal_position(cursor: str) -> tuple[str, int] | None:
    """(seqnum id, seqnum) of a journald cursor (`s=...;i=...;...`): entries of one seqnum id are ordered by i."""
    parts = dict(p.split("=", 1) for p in cursor.split(";") if "=" in p)
    try:
        return parts["s"], int(parts["i"], 16)
    except (KeyError, ValueError):
        return None


# --- syslog -------------------------------------------------------------------------------------------------

_PRI = re.compile(r"<(\d{1,3})>")
_RFC3164_TIME = re.compile(r"([A-Z][a-z]{2}) ([ \d]\d) (\d\d):(\d\d):(\d\d) ")
_RFC3339_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d) ")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"),
        start=1,
    )
}
TAG_MAX = 128  # how far a tag's colon is looked for (RFC 3164 says 32; programs go past it)


def syslog(raw: bytes, now: datetime.datetime) -> Record:
    """An RFC 5424 or RFC 3164 message (`<PRI>` optional, as in /var/log/syslog), or rsyslog's file format
    (an RFC 3339 time, host, tag): time, host, app (the source), severity (the importance), message."""
    line = text(raw)
    severity, rest = None, line
    pri = _PRI.match(line)
    if pri:
        value = int(pri.group(1))
        if value > 191:
            raise BadLine(f"PRI {value} is over 191")
        severity, rest = value % 8, line[pri.end() :]
    if rest.startswith("1 ") and pri:
        at, host, app, pid, message = _rfc5424(rest)
    else:
        at, host, app, pid, message = _rfc3164(rest, now)
    if (
        pri is None and at is None
    ):  # neither <PRI> nor a time starts it: a line of something else, not stored as now
        raise BadLine(
            "not a syslog line: neither <PRI> nor a timestamp (RFC 5424, RFC 3164, RFC 3339) starts it"
        )
    if not message.strip():
        raise BadLine("no message")
    meta = {k: v for k, v in (("host", host), ("pid", pid)) if v}
    if severity is not None:
        meta["priority"] = SEVERITY[severity]
    return Record(
        message,
        at or now,
        app,
        LOG_KIND,
        None if severity is None else importance_of(severity),
        None,
        meta,
    )


Parsed = tuple[
    datetime.datetime | None, str | None, str | None, str | None, str
]  # time, host, app, pid, message


def _rfc5424(rest: str) -> Parsed:
    parts = rest.split(" ", 6)
    if len(parts) < 7:
        raise BadLine(
            "RFC 5424: fewer fields than VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD"
        )
    _, stamp, host, app, procid, _msgid, tail = parts
    at = None if stamp == "-" else _iso(stamp)
    message = _after_structured_data(tail)
    return (
        at,
        None if host == "-" else host,
        None if app == "-" else app,
        None if procid == "-" else procid,
        message.removeprefix("\ufeff"),
    )


def _after_structured_data(tail: str) -> str:
    """The MSG after STRUCTURED-DATA ('-' or [id k="v" ...]...; `\\]` `\\"` escaped in values): one pass."""
    if tail.startswith("-"):
        return tail[2:]
    i, n = 0, len(tail)
    while i < n and tail[i] == "[":
        quoted = False
        i += 1
        while i < n:
            c = tail[i]
            if c == "\\" and quoted:
                i += 2
                continue
            if c == '"':
                quoted = not quoted
            elif c == "]" and not quoted:
                break
            i += 1
        if i >= n:
            raise BadLine("RFC 5424: STRUCTURED-DATA without its closing ]")
        i += 1
    if i == 0:
        raise BadLine("RFC 5424: STRUCTURED-DATA is neither - nor [...]")
    return tail[i + 1 :] if i < n else ""


def _rfc3164(rest: str, now: datetime.datetime) -> Parsed:
    at = None
    stamp = _RFC3164_TIME.match(rest)
    if stamp:
        at, rest = _bsd_time(stamp, now), rest[stamp.end() :]
    else:
        iso = _RFC3339_TIME.match(rest)
        if iso:
            at, rest = _iso(rest[: iso.end() - 1]), rest[iso.end() :]
    host = None
    if at is not None:  # a time is followed by the host
        host, _, rest = rest.partition(" ")
    colon = rest.find(":", 0, TAG_MAX)
    if colon <= 0 or " " in rest[:colon].rstrip("]"):
        return at, host, None, None, rest
    tag = rest[:colon]
    bracket = tag.find("[")
    app = tag[:bracket] if bracket > 0 else tag
    pid = tag[bracket + 1 : -1] if bracket > 0 and tag.endswith("]") else None  # sshd[123]: pid 123
    return at, host, app or None, pid or None, rest[colon + 1 :].removeprefix(" ")


def _bsd_time(stamp: re.Match, now: datetime.datetime) -> datetime.datetime:
    """`Dec  5 14:12:17`: no year, no zone. The local zone, this year, or last year when that would be more
    than a day ahead (a December line read in January)."""
    month = _MONTHS.get(stamp.group(1))
    if month is None:
        raise BadLine(f"not a month: {stamp.group(1)!r}")
    local = now.astimezone()
    try:
        at = local.replace(
            year=local.year,
            month=month,
            day=int(stamp.group(2)),
            hour=int(stamp.group(3)),
            minute=int(stamp.group(4)),
            second=int(stamp.group(5)),
            microsecond=0,
        )
        if at - local > datetime.timedelta(days=1):
            at = at.replace(year=local.year - 1)
    except ValueError as exc:
        raise BadLine(f"not a date: {stamp.group(0).strip()!r} ({exc})") from None
    return at


def _iso(stamp: str) -> datetime.datetime:
    if len(stamp) > 40:
        raise BadLine("TIMESTAMP: longer than an RFC 3339 time")
    try:
        at = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        raise BadLine(f"TIMESTAMP: not an RFC 3339 time: {stamp!r}") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


# --- the other two ------------------------------------------------------------------------------------------


def jsonl_record(raw: bytes, fields: tuple[str, ...]) -> Record | None:
    """memctl's episode import line (memctl.files.jsonl's rules); None for a blank line."""
    from memctl.files import jsonl

    item = jsonl.parse(raw, fields=fields, required=("content",))
    if item is None:
        return None
    return Record(
        item["content"],
        item.get("created_at"),
        item.get("source"),
        item.get("kind"),
        item.get("importance"),
        item.get("agent"),
        item.get("meta") or {},
    )
