"""Blocked sources: a write from a blocked source is refused with the reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memctl import redact
from memctl.db import locks
from memctl.errors import NotFound
from memctl.write import gate, store

if TYPE_CHECKING:
    from memctl.db.memory import Memory

ALL = "SELECT source, reason, blocked_at FROM blocked_sources ORDER BY source"
UNBLOCK = "DELETE FROM blocked_sources WHERE source = ANY(%s) RETURNING source"


def blocked_set(conn: Memory) -> dict[str, str | None]:
    return {row["source"]: row["reason"] for row in conn.execute(ALL).fetchall()}


def block(conn: Memory, source: str, reason: str | None = None) -> dict:
    """Block a source. Waits for the writes that already confirmed their sources (their commits); a write
    still running refuses itself when it confirms (memctl.db.locks)."""
    admitted = gate.Gate(conn, None, redact.Redactor()).blocked_source(source, reason)
    with conn.transaction():
        conn.execute(locks.BLOCK_LOCK)
        row = store.insert_blocked(conn, admitted)
    return {"source": row["source"], "reason": row["reason"], "blocked_at": row["blocked_at"]}


def unblock(conn: Memory, source: str) -> str:
    """Unblock SOURCE, named as it was blocked or as it is stored (redacted); returns the name removed."""
    row = conn.execute(UNBLOCK, (list(gate.source_forms(source)),)).fetchone()
    if row is None:
        raise NotFound(f"source {gate.stored_name(source)!r} is not blocked")
    return row["source"]


def list_blocked(conn: Memory) -> list[dict]:
    return conn.execute(ALL).fetchall()
