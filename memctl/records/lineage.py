"""Summary lineage: which episodes each summary was built from (table summary_sources), and the one rule
that asks it, "an episode some summary holds".

The lineage has no foreign key to its sources: prune deletes a source once a summary holds it, and the
lineage outlives it (the source's id, created_at and content hash stay provable). Deleting a summary
deletes its lineage rows (ON DELETE CASCADE).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memctl.db.memory import Memory

SUMMARY_KIND = "summary"
SOURCE_PREFIX = "summarize:"

# An episode, aliased `e`, that some summary holds. Every "already summarized" check (summarize's windows
# and sources, prune's wait for a summary, the overdue warning) is this fragment, composed into its statement.
SUMMARIZED = (
    "EXISTS (SELECT 1 FROM summary_sources l WHERE l.agent = e.agent AND l.source_id = e.id)"
)
UNSUMMARIZED = "NOT " + SUMMARIZED

SOURCES_OF = """
SELECT l.source_id AS id, l.source_created_at AS created_at, encode(l.source_hash, 'hex') AS content_hash,
       e.id IS NOT NULL AS exists
FROM summary_sources l LEFT JOIN episodes e ON e.agent = l.agent AND e.id = l.source_id
WHERE l.agent = %s AND l.summary_id = %s ORDER BY l.source_created_at, l.source_id
"""
SUMMARIZED_IN = """
SELECT l.summary_id AS id, s.created_at, s.source FROM summary_sources l
JOIN episodes s ON s.agent = l.agent AND s.id = l.summary_id
WHERE l.agent = %s AND l.source_id = %s ORDER BY l.summary_id
"""


def lineage(conn: Memory, agent: str, episode_id: int) -> dict:
    """An episode's place in the lineage: the sources a summary was built from, the summaries built from it."""
    return {
        "sources": conn.execute(SOURCES_OF, (agent, episode_id)).fetchall(),
        "summarized_in": conn.execute(SUMMARIZED_IN, (agent, episode_id)).fetchall(),
    }


# Summaries built from a source's episodes: through the lineage while those episodes exist, and by the source
# names each summary records, once prune has deleted them. With since, by the sources' created_at (or, for a
# summary whose sources are gone, its window's end).
BUILT_FROM = """
SELECT s.id, s.agent, s.created_at, s.meta->>'window_start' AS window_start FROM episodes s
WHERE s.kind = 'summary' AND s.source LIKE 'summarize:%%' AND (
    EXISTS (SELECT 1 FROM summary_sources l JOIN episodes e ON e.agent = l.agent AND e.id = l.source_id
            WHERE l.agent = s.agent AND l.summary_id = s.id AND e.source = %(source)s
              AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s))
    OR (s.meta->'source_names' ? %(source)s AND (%(since)s::timestamptz IS NULL OR s.created_at > %(since)s)))
ORDER BY s.agent, s.id
"""


def built_from(conn: Memory, source: str, since: datetime.datetime | None = None) -> list[dict]:
    return conn.execute(BUILT_FROM, {"source": source, "since": since}).fetchall()
