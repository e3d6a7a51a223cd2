"""The episode log's common filters (agent, kind, source, since, until) as SQL conditions.

Listing, search, export, prune and purge share them. Kept apart from memctl.records.episodes, the
write path, so that reading (memctl.reading) does not import the gate's redaction to filter.
"""

from __future__ import annotations

import datetime

from memctl.config import parse_duration
from memctl.errors import BadValue


def parse_since(value: str, option: str = "--since") -> datetime.datetime:
    """'7d' (a duration back from now) or an ISO 8601 date/time."""
    from memctl.records.gate import parse_time  # the gate's reading of a time, for an ISO 8601 one

    try:
        seconds = parse_duration(value)
    except ValueError:
        try:
            return parse_time(value, option)
        except BadValue:
            raise BadValue(f"{option} {value!r}: give a duration back from now (30m, 12h, 7d) "
                           "or an ISO 8601 date/time (2026-08-11T09:30:00Z)", option) from None
    try:
        return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise BadValue(f"{option} {value!r}: reaches back before the year 1", option) from None


def filters(*, agent=None, kind=None, source=None, since=None, until=None, alias: str = "e"):
    """SQL conditions on the episodes table for the common filters, with named parameters.

    `since` and `until` take a duration back from now (7d) or an ISO 8601 time; `until` is exclusive.
    """
    from psycopg import sql

    clauses, params = [], {}
    table = sql.Identifier(alias)
    for column, value in (("agent", agent), ("kind", kind), ("source", source)):
        if value is not None:
            clauses.append(sql.SQL("{}.{} = {}").format(table, sql.Identifier(column), sql.Placeholder(column)))
            params[column] = value
    if since is not None:
        clauses.append(sql.SQL("{}.created_at >= {}").format(table, sql.Placeholder("since")))
        params["since"] = parse_since(since)
    if until is not None:
        clauses.append(sql.SQL("{}.created_at < {}").format(table, sql.Placeholder("until")))
        params["until"] = parse_since(until, "--until")
    return clauses, params


def where(clauses):
    from psycopg import sql

    if not clauses:
        return sql.SQL("")
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(clauses)
