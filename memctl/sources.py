"""Blocked sources: a write from a blocked source is refused with the reason."""

from __future__ import annotations

from memctl.errors import Blocked, InvalidInput, NotFound

CHECK = "SELECT reason FROM blocked_sources WHERE source = %s"
ALL = "SELECT source, reason, blocked_at FROM blocked_sources ORDER BY source"
BLOCK = """
INSERT INTO blocked_sources (source, reason) VALUES (%s, %s)
ON CONFLICT (source) DO UPDATE SET reason = excluded.reason
RETURNING source, reason, blocked_at
"""
UNBLOCK = "DELETE FROM blocked_sources WHERE source = %s RETURNING source"


def refuse(source: str, reason: str | None) -> None:
    because = f": {reason}" if reason else ""
    raise Blocked(f"source {source!r} is blocked{because} (memctl source unblock {source!r} to allow it again)")


def check_allowed(conn, source: str | None) -> None:
    if source is None:
        return
    row = conn.execute(CHECK, (source,)).fetchone()
    if row is not None:
        refuse(source, row["reason"])


def blocked_set(conn) -> dict[str, str | None]:
    return {row["source"]: row["reason"] for row in conn.execute(ALL).fetchall()}


def block(conn, source: str, reason: str | None = None) -> dict:
    if not source or "\x00" in source:
        raise InvalidInput("a source must be a non-empty string without NUL characters")
    return conn.execute(BLOCK, (source, reason)).fetchone()


def unblock(conn, source: str) -> None:
    if conn.execute(UNBLOCK, (source,)).fetchone() is None:
        raise NotFound(f"source {source!r} is not blocked")


def list_blocked(conn) -> list[dict]:
    return conn.execute(ALL).fetchall()
