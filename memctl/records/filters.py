"""The episode log's common filters (agent, kind, source, since, until) as SQL conditions.

Listing, search, export, prune and purge share them. Kept apart from memctl.records.episodes, the
write path, so that reading (memctl.reading) does not import the gate's redaction to filter.
"""

from __future__ import annotations

import datetime

from memctl.config import DurationTooLong, parse_duration
from memctl.errors import BadValue
from memctl.write.values import (
    parse_time,
    shown,
)  # the gate's reading of an ISO 8601 time; a value cut short

# What the period filters mean, said once: filters() writes them so (created_at >= since, created_at < until),
# and every description of them (the CLI's --since/--until, MCP's search tool) quotes these.
SINCE = "created at or after"
UNTIL = "created before (exclusive: not at)"


def moment(value: str, skew: float | None = None) -> datetime.datetime:
    """A moment to read at: 'now', a duration back from now ('7d', at most config.MAX_DURATION) or an
    ISO 8601 date/time (no zone: UTC), no later than `skew` seconds from now ([limits] clock_skew, the
    configuration's default when None: memory holds what happened, so a time past it is a typo).
    ValueError says why not, without naming where it was given.

    The one reading of --since, --until and --as-of: on the command line (checked where the option
    enters), in `episode search --batch` and `recall --batch` lines and through MCP."""
    now = datetime.datetime.now(datetime.timezone.utc)
    if str(value).strip().lower() == "now":
        return now
    try:
        seconds = parse_duration(value)
    except DurationTooLong as exc:
        raise ValueError(f"{exc}; give an ISO 8601 date/time for older") from None
    except ValueError:
        try:
            return _not_ahead(parse_time(value, "time"), now, skew)
        except BadValue:
            raise ValueError(
                f"{shown(value)} is neither 'now', a duration back from now (30m, 12h, 7d) nor an "
                "ISO 8601 date/time (2026-08-11T09:30:00Z)"
            ) from None
    try:
        return now - datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"{shown(value)} reaches back before the year 1") from None


def _not_ahead(
    when: datetime.datetime, now: datetime.datetime, skew: float | None
) -> datetime.datetime:
    from memctl.write.values import Limits

    skew = Limits.of(None).clock_skew if skew is None else skew
    if (when - now).total_seconds() > skew:
        raise ValueError(
            f"{when.isoformat()} is in the future (it is {now.isoformat(timespec='seconds')}), more "
            f"than the {int(skew)}s [limits] clock_skew allows: memory holds what happened"
        )
    return when


def parse_since(
    value: str, option: str = "--since", skew: float | None = None
) -> datetime.datetime:
    """moment(value, skew), or BadValue naming `option` (--since, --until, --as-of; as_of through MCP)."""
    try:
        return moment(value, skew)
    except ValueError as exc:
        raise BadValue(f"{option}: {exc}", option) from None


def filters(*, agent=None, kind=None, source=None, since=None, until=None, alias: str = "e"):
    """SQL conditions on the episodes table for the common filters, with named parameters.

    `since` and `until` take a duration back from now (7d) or an ISO 8601 time, and mean SINCE and UNTIL.
    """
    from psycopg import sql

    clauses, params = [], {}
    table = sql.Identifier(alias)
    for column, value in (("agent", agent), ("kind", kind), ("source", source)):
        if value is not None:
            clauses.append(
                sql.SQL("{}.{} = {}").format(table, sql.Identifier(column), sql.Placeholder(column))
            )
            params[column] = value
    if since is not None:
        clauses.append(sql.SQL("{}.created_at >= {}").format(table, sql.Placeholder("since")))
        params["since"] = parse_since(since)
    if until is not None:
        clauses.append(sql.SQL("{}.created_at < {}").format(table, sql.Placeholder("until")))
        params["until"] = parse_since(until, "--until")
    check_period(since, until)
    return clauses, params


def check_period(since: str | None, until: str | None) -> None:
    """--since at or after --until is an empty period: a usage error (exit 2), not a silent empty answer."""
    if (
        since is not None
        and until is not None
        and parse_since(since) >= parse_since(until, "--until")
    ):
        raise BadValue(
            f"--since {since} is not before --until {until}: that period is empty", "--since"
        )


def where(clauses):
    """The clauses as a WHERE clause ('' for none)."""
    from psycopg import sql

    if not clauses:
        return sql.SQL("")
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(clauses)


def and_joined(clauses):
    """The clauses as SQL that follows a condition: ' AND c1 AND c2' ('' for none)."""
    from psycopg import sql

    return sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)
