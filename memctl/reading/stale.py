"""Find episodes that still mention a value a fact used to have.

Similarity search cannot prove it found every copy of a fact, so this runs
both halves: every chunk containing an old value word for word (case
insensitive), and the chunks nearest in meaning to "key: old value".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from memctl.embedding import models
from memctl.errors import NotFound
from memctl.reading import search
from memctl.reading.query import Query
from memctl.reading.scan import vector_half
from memctl.records import facts

if TYPE_CHECKING:
    from memctl.db.memory import Memory

PAST_VALUES = """
SELECT DISTINCT v FROM (
    SELECT old_value AS v FROM fact_history WHERE namespace = %(ns)s AND key = %(key)s
    UNION SELECT new_value FROM fact_history WHERE namespace = %(ns)s AND key = %(key)s
) s
WHERE v IS NOT NULL AND v <> '' AND v IS DISTINCT FROM %(current)s
"""
MENTIONS = """
SELECT DISTINCT ON (e.id) e.id, e.agent, e.kind, e.source, e.created_at, c.content AS chunk
FROM chunks c JOIN episodes e ON e.agent = c.agent AND e.id = c.episode_id
WHERE strpos(lower(c.content), lower(%s)) > 0
ORDER BY e.id
LIMIT %s
"""

EPISODE = "SELECT id, agent, kind, source, created_at FROM episodes WHERE id = %s"


@dataclass
class StaleMention:
    id: int
    agent: str
    kind: str
    source: str | None
    created_at: object
    old_value: str
    found_by: str  # "text" or "meaning"
    distance: float | None
    chunk: str

    def to_dict(self) -> dict:
        return asdict(self)


def past_values(conn: Memory, key: str, namespace: str) -> list[str]:
    try:
        current = facts.get_fact(conn, key, namespace=namespace).value
    except NotFound:
        current = None
    facts.history(conn, key, namespace=namespace)  # NotFound for a key that never existed
    return [
        r["v"] for r in conn.execute(PAST_VALUES, {"ns": namespace, "key": key, "current": current})
    ]


def find(
    conn: Memory,
    key: str,
    *,
    namespace: str = facts.DEFAULT_NAMESPACE,
    limit: int = 100,
    max_distance: float = 0.35,
) -> tuple[list[StaleMention], str | None]:
    """Mentions of past values; the warning says when the meaning half could not run."""
    settings = conn.settings
    found: dict[tuple[int, str], StaleMention] = {}
    values = past_values(conn, key, namespace)
    for value in values:
        for row in conn.execute(MENTIONS, (value, limit)).fetchall():
            found[(row["id"], value)] = StaleMention(
                old_value=value, found_by="text", distance=None, **row
            )
    warning = None
    model = models.active(conn)
    if values:
        vectors, warning = search.embed_queries(settings, model, [f"{key}: {v}" for v in values])
        for value, vector in zip(values, vectors or []):
            query = Query(f"{key} {value}", k=10, mode="vector")
            assert model is not None  # the vectors were made with it
            for row in vector_half(conn, model, vector, query, 10):
                if row["distance"] > max_distance or (row["episode_id"], value) in found:
                    continue
                episode = conn.execute(EPISODE, (row["episode_id"],)).fetchone()
                if episode:
                    found[(row["episode_id"], value)] = StaleMention(
                        old_value=value,
                        found_by="meaning",
                        distance=round(float(row["distance"]), 4),
                        chunk=row["content"],
                        **episode,
                    )
    return sorted(found.values(), key=lambda m: (m.found_by != "text", m.id)), warning
