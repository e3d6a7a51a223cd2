"""What every command shares: options, the settings, the connection, stderr talk."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memctl import config as config_mod
from memctl.cli.render import Format

if TYPE_CHECKING:
    from memctl.db.memory import Memory

FormatOption = Annotated[
    Format,
    typer.Option("--format", "-f", help="Output format: table, json (one document), jsonl, csv."),
]


@dataclass
class State:
    database_url: str | None = None
    _settings: config_mod.Settings | None = None
    _conns: list[Any] = field(default_factory=list)

    @property
    def settings(self) -> config_mod.Settings:
        if self._settings is None:
            self._settings = config_mod.load()
        return self._settings


_STATE = State()


def state() -> State:
    """The invocation's state (one process runs one invocation; tests call reset())."""
    return _STATE


def reset() -> State:
    global _STATE
    close_all()
    _STATE = State()
    return _STATE


def close_all() -> None:
    while _STATE._conns:
        conn = _STATE._conns.pop()
        try:
            conn.close()
        except Exception:
            pass


def settings() -> config_mod.Settings:
    return state().settings


def warn(message: str) -> None:
    """Talk goes to stderr; stdout carries only data. Whoever wrote the message, whatever input it quotes: credentials
    in URLs masked, every other secret redacted (memctl.redact), control characters escaped (render.inert)."""
    sys.stderr.write(f"memctl: {clean(message)}\n")
    sys.stderr.flush()


def clean(message: str) -> str:
    """A message for a person: secrets masked and redacted, control characters escaped. The one filter of every
    message memctl prints (warn, usage errors)."""
    from memctl.cli.render import inert
    from memctl.redact import redact_text

    return inert(redact_text(config_mod.mask_secrets(message)) or "")


def target():
    from memctl import db

    st = state()
    return db.resolve(st.database_url, st.settings)


def connect(*, vector: bool = False, migrate: bool = True, reading: bool = False) -> Memory:
    """The memory handle with the invocation's settings, on the configured database (starting the embedded one,
    migrating it while it holds no memory); closed at exit. `reading`: the command only reads, so a schema newer
    than this memctl's is a warning."""
    from memctl import db

    st = state()
    conn = db.open_database(
        target(), report=warn, vector=vector, migrate=migrate, reading=reading, settings=st.settings
    )
    st._conns.append(conn)
    return conn


def connect_read(*, vector: bool = False) -> Memory:
    """For commands that only read: the replica named by [database] read_url, else connect().

    Accesses recorded on the replica are written to the primary, opened only when there is
    something to record. A replica that is down or behind the primary's schema is reported
    on stderr and the primary answers instead.
    """
    from memctl import db
    from memctl.errors import DatabaseUnavailable, SchemaBehind
    from memctl.records import access

    st = state()
    replica = db.resolve_read(st.settings)
    if replica is None:
        return connect(vector=vector, reading=True)
    try:
        conn = db.open_replica(replica, vector=vector, settings=st.settings)
    except (DatabaseUnavailable, SchemaBehind) as exc:
        warn(f"{exc}; reading from the primary")
        return connect(vector=vector, reading=True)
    st._conns.append(conn)
    access.route_to_primary(conn, connect, note=warn)
    return conn


def read_text_arg(value: str, limit: str | None = None, what: str = "content") -> str:
    """TEXT or '-' for stdin, decoded strictly as UTF-8. `limit`: the [limits] setting that bounds it (e.g.
    episode_bytes): stdin is read up to one byte past it, and refused there (exit 2) without reading on.

    The one rule of stdin (README): a single trailing newline ends the text and is no part of it (`echo 10.0.0.1 |
    memctl fact set k -` stores 10.0.0.1; a text's own inner and further newlines stay), and a stdin that gives
    nothing, or that one newline alone, is refused (jsonl.empty_stdin, exit 2)."""
    from memctl.files import jsonl
    from memctl.errors import BadValue

    if value != "-":
        return value
    bound = None
    if limit is None:
        data = sys.stdin.buffer.read()
    else:
        from memctl.write import values

        bound = getattr(values.Limits.of(settings()), limit)
        data = sys.stdin.buffer.read(
            bound + 3
        )  # the text, the newline that ends it (CRLF: 2 bytes), one more
    data = data[:-2] if data.endswith(b"\r\n") else data[:-1] if data.endswith(b"\n") else data
    if bound is not None and limit is not None and len(data) > bound:
        raise BadValue(values.too_long(what, None, bound, limit), what)
    if not data:
        raise jsonl.empty_stdin()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(
            f"stdin is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r}): memctl takes "
            "UTF-8 text",
            what,
        ) from None


# --- batch modes: the one rule (README, exit codes) ---------------------------------------------------------


def batch_error(number: int, exc: Exception) -> dict:
    """The error object a --batch mode writes in a bad line's place: {line, field, error, exit_code}."""
    from memctl.files.jsonl import LineError

    reason = exc.reason if isinstance(exc, LineError) else str(exc)
    return {
        "line": number,
        "field": getattr(exc, "field", None),
        "error": f"line {number}: {reason}" if not reason.startswith(f"line {number}:") else reason,
        "exit_code": getattr(exc, "exit_code", 1),
    }


def batch_write(slots: list, results, answer) -> None:
    """Write a --batch mode's lines in order: a failed line's error object (batch_error), else `answer(slot,
    its result)` -> (the line, warnings); the warnings said once each on stderr. Then exit with the first failed
    line's code, said on stderr; 0 when every line was answered."""
    from memctl.cli.render import to_json

    results, warnings = iter(results), {}
    for slot in slots:
        if isinstance(slot, dict):
            line = slot
        else:
            line, said = answer(slot, next(results))
            warnings.update(dict.fromkeys(said))
        sys.stdout.write(to_json(line) + "\n")
    for message in warnings:
        warn(message)
    failed = [s for s in slots if isinstance(s, dict)]
    if failed:
        warn(f"{len(failed)} of {len(slots)} line(s) failed (their error objects say why)")
        raise typer.Exit(failed[0]["exit_code"])


# --- option values, checked where they enter (typer callbacks: exit 2 naming the option) -------------


def _option(param) -> str:
    return max(param.opts, key=len) if getattr(param, "opts", None) else f"--{param.name}"


def since_value(param: typer.CallbackParam, value: str | None) -> str | None:
    """--since, --until, --as-of: checked where the option enters, as memctl.records.filters.parse_since
    will read it ('now', a duration back from now, or an ISO 8601 date/time); the text is kept, so a
    duration counts back from when the command reads it."""
    if value is None:
        return None
    from memctl.records.filters import parse_since

    parse_since(value, _option(param), clock_skew())
    return value


def clock_skew() -> float:
    """[limits] clock_skew in seconds: how far past now a time option may be (memctl.records.filters.moment)."""
    from memctl.write import values

    return values.Limits.of(settings()).clock_skew


def duration_value(param: typer.CallbackParam, value: str | None) -> str | None:
    """A duration option (e.g. --older-than 7d): a number and one of s, m, h, d, w, y, at most 1000y."""
    from memctl.errors import BadValue

    if value is None:
        return None
    try:
        config_mod.parse_duration(value)
    except ValueError as exc:
        option = _option(param)
        raise BadValue(f"{option}: {exc}", option) from None
    return value


def time_value(param: typer.CallbackParam, value: str | None) -> str | None:
    """An ISO 8601 date/time option (e.g. --created-at; no zone: UTC), checked by the gate's own reading
    (memctl.write.values.parse_time), whose error names the option."""
    if value is None:
        return None
    from memctl.write.values import parse_time

    parse_time(value, _option(param))
    return value


def json_object(option: str, value: str | None) -> dict | None:
    """A JSON object given as an option's value (e.g. --meta '{"ticket": 12}'), parsed."""
    import json

    from memctl.errors import BadValue

    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise BadValue(
            f"{option} is not valid JSON: {exc.msg} at column {exc.colno}", option
        ) from None
    if not isinstance(parsed, dict):
        raise BadValue(
            f"{option} must be a JSON object ({{...}}), got {type(parsed).__name__}", option
        )
    return parsed


def json_object_value(param: typer.CallbackParam, value: str | None) -> str | None:
    """Callback: the option's value must be a JSON object (parse it with json_object)."""
    json_object(_option(param), value)
    return value


def choice_value(*choices: str):
    """A callback refusing anything but one of `choices`."""

    def check(param: typer.CallbackParam, value: str | None) -> str | None:
        from memctl.errors import BadValue

        if value is not None and value not in choices:
            option = _option(param)
            raise BadValue(f"{option} {value!r}: choose one of {', '.join(choices)}", option)
        return value

    return check
