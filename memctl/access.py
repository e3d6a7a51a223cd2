"""Access tracking: when recall or search last returned an episode, and how often.

One upsert per call, into episode_access (sql/0007_access.sql), never into
episodes. Tracking is best effort: an episode deleted meanwhile is skipped, and
a read-only database (a standby) leaves the counts alone rather than failing
the read that asked.
"""

from __future__ import annotations

import datetime
from typing import Iterable

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


def record(conn, episodes: Iterable[tuple[str, int]]) -> int:
    """Count one access of each (agent, episode id) now; returns the rows written."""
    import psycopg

    pairs = list(episodes)
    if not pairs:
        return 0
    params = {"agents": [agent for agent, _ in pairs], "ids": [int(i) for _, i in pairs]}
    try:
        return conn.execute(RECORD, params, prepare=False).rowcount
    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.ForeignKeyViolation):
        return 0  # a standby, or an episode deleted between the read and this write


def last_accessed(conn, episode_ids: list[int]) -> dict[int, datetime.datetime]:
    """Episode id -> when it was last returned, for the ids that ever were."""
    if not episode_ids:
        return {}
    return {row["episode_id"]: row["at"] for row in conn.execute(LAST_ACCESSED, (list(episode_ids),))}


def stats(conn, episode_ids: list[int]) -> list[dict]:
    """Access rows (agent, episode_id, access_count, last_accessed_at) of these episodes."""
    return conn.execute(STATS, (list(episode_ids),)).fetchall()
