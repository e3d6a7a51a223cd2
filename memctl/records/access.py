"""Access tracking: when recall or search last returned an episode, and how often.

One upsert per call, into episode_access (sql/0007_access.sql), never into
episodes. Tracking is best effort: an episode deleted meanwhile is skipped, and
a read-only database (a standby) leaves the counts alone rather than failing
the read that asked.

A read connection to a replica ([database] read_url) is routed to the primary
with route_to_primary(): its accesses are written there, and the primary is
opened only when a call has something to record. A primary that cannot be
reached costs the counts of that invocation and one note, never the read.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# Rows are written in key order so that two concurrent calls lock them in the
# same order (no deadlock); an id returned twice in one call counts twice.
RECORD = """
INSERT INTO episode_access AS a (agent, episode_id, last_accessed_at, access_count)
SELECT e.agent, e.id, now(), u.times
FROM (SELECT agent, id, count(*) AS times
      FROM unnest(%(agents)s::text[], %(ids)s::bigint[]) AS r(agent, id)
      GROUP BY agent, id) u
JOIN episodes e ON e.agent = u.agent AND e.id = u.id
ORDER BY e.agent, e.id
ON CONFLICT (agent, episode_id) DO UPDATE
   SET access_count = a.access_count + excluded.access_count,
       last_accessed_at = excluded.last_accessed_at
"""
LAST_ACCESSED = """
SELECT episode_id, max(last_accessed_at) AS at FROM episode_access
WHERE episode_id = ANY(%s) GROUP BY episode_id
"""
STATS = """
SELECT agent, episode_id, access_count, last_accessed_at FROM episode_access
WHERE episode_id = ANY(%s) ORDER BY agent, episode_id
"""


@dataclass
class _Route:
    open_primary: Callable[[], Any]
    note: Callable[[str], None] | None
    primary: Any = None
    failed: bool = False

    def writer(self) -> Memory | None:
        """The primary's connection, opened at the first call; None (noted once) when it cannot be."""
        from memctl.errors import MemctlError

        if self.primary is None and not self.failed:
            try:
                self.primary = self.open_primary()
            except MemctlError as exc:
                self.failed = True
                self.report(f"access counts not recorded: cannot open the primary ({exc})")
        return self.primary

    def report(self, message: str) -> None:
        if self.note is not None:
            self.note(message)


def route_to_primary(
    read_conn: Memory, open_primary: Callable[[], Any], *, note: Callable[[str], None] | None = None
) -> None:
    """Write the accesses recorded on `read_conn` (a replica) through `open_primary()` instead.

    `open_primary` runs at most once, at the first record() with something to write; `note`
    receives one line if it fails (the counts of this connection are then skipped). The route is kept by
    the read handle (Memory.route), and goes with it.
    """
    read_conn.route_counts_to(_Route(open_primary, note))


def record(conn: Memory, episodes: Iterable[tuple[str, int]]) -> int:
    """Count one access of each (agent, episode id) now; returns the rows written.

    On a connection routed with route_to_primary() the rows are written on the primary.
    """
    import psycopg

    pairs = list(episodes)
    if not pairs:
        return 0
    params = {"agents": [agent for agent, _ in pairs], "ids": [int(i) for _, i in pairs]}
    route = conn.route
    if route is not None:
        primary = route.writer()
        if primary is None:
            return 0
        conn = primary
    try:
        return conn.execute(RECORD, params, prepare=False).rowcount
    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.ForeignKeyViolation):
        return 0  # a standby, or an episode deleted between the read and this write
    except psycopg.OperationalError as exc:
        if route is None:
            raise
        route.report(
            f"access counts not recorded on the primary: {str(exc).strip().splitlines()[0]}"
        )
        return 0


def last_accessed(conn: Memory, episode_ids: list[int]) -> dict[int, datetime.datetime]:
    """Episode id -> when it was last returned, for the ids that ever were."""
    if not episode_ids:
        return {}
    return {
        row["episode_id"]: row["at"] for row in conn.execute(LAST_ACCESSED, (list(episode_ids),))
    }


def stats(conn: Memory, episode_ids: list[int]) -> list[dict]:
    """Access rows (agent, episode_id, access_count, last_accessed_at) of these episodes."""
    return conn.execute(STATS, (list(episode_ids),)).fetchall()
