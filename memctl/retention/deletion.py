"""Deleting episodes in batches: the machinery prune and purge share, and the dry run of a selection.

Deletes go in batches of a few thousand episodes, each batch its own short
transaction, so no lock is held for long and the embed worker keeps running.
A batch deletes episodes; the foreign keys' ON DELETE CASCADE removes their
chunks, queue rows, failures and the vectors of every model.

Space: deleted rows become dead tuples; VACUUM makes their space reusable by
new rows, but the table files rarely shrink. Reports give table sizes and dead
tuples before and after instead of "bytes freed".
"""

from __future__ import annotations

import datetime
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from memctl.embedding import models
from memctl.errors import UsageError
from memctl.write import repeats

if TYPE_CHECKING:
    from memctl.db.memory import Memory

DEFAULT_BATCH = 2000
NOW = "SELECT now() AS now"


@dataclass
class Selection:
    """A WHERE clause over `episodes e` with its parameters: the episodes of one prune kind, or of a purge."""

    where: str
    params: dict[str, Any]


# --- dry run: what a selection holds ------------------------------------------

SUMMARY = """
WITH doomed AS (
    SELECT e.agent, e.id, e.kind, e.created_at, pg_column_size(e.*) AS size FROM episodes e WHERE {where}
), episode_sizes AS (
    SELECT kind, count(*) AS rows, min(created_at) AS oldest, max(created_at) AS newest, sum(size) AS bytes
    FROM doomed GROUP BY kind
), chunk_sizes AS (
    SELECT d.kind, count(*) AS chunks, sum(pg_column_size(c.*)) AS bytes
    FROM chunks c JOIN doomed d ON c.agent = d.agent AND c.episode_id = d.id GROUP BY d.kind
), vector_sizes AS (
    SELECT kind, count(*) AS vectors, sum(size) AS bytes FROM ({vectors}) AS v GROUP BY kind
)
SELECT e.kind, e.rows, e.oldest, e.newest, coalesce(c.chunks, 0) AS chunks, coalesce(v.vectors, 0) AS vectors,
       (e.bytes + coalesce(c.bytes, 0) + coalesce(v.bytes, 0))::bigint AS bytes
FROM episode_sizes e LEFT JOIN chunk_sizes c USING (kind) LEFT JOIN vector_sizes v USING (kind)
ORDER BY e.kind
"""
SUMMARY_VECTORS = """
SELECT d.kind, pg_column_size(v.*) AS size FROM {table} v
JOIN chunks c ON c.agent = v.agent AND c.id = v.chunk_id
JOIN doomed d ON d.agent = c.agent AND d.id = c.episode_id
"""
NO_VECTORS = "SELECT NULL::text AS kind, 0 AS size WHERE false"


def vector_table_names(conn: Memory) -> list[str]:
    return [m.table_name for m in models.all_models(conn)]


def summarise(conn: Memory, selection: Selection, vector_tables: list[str]) -> list[dict]:
    """Per kind: rows, oldest and newest created_at, chunks, vectors, and the logical bytes they hold.

    Bytes are pg_column_size of the episode, chunk and vector rows (every
    model): row data, not file bytes; indexes are not counted.
    """
    from psycopg import sql

    parts = [sql.SQL(SUMMARY_VECTORS).format(table=sql.Identifier(t)) for t in vector_tables]
    vectors = sql.SQL(" UNION ALL ").join(parts) if parts else sql.SQL(NO_VECTORS)
    query = sql.SQL(SUMMARY).format(where=sql.SQL(selection.where), vectors=vectors)
    return conn.execute(query, selection.params, prepare=False).fetchall()


# --- deleting in batches -----------------------------------------------------

# One batch, in one statement: the next episodes of a kind by keyset on
# (created_at, id), so no scan walks over rows earlier batches deleted; their
# queue rows locked; the episodes deleted, and the foreign keys' ON DELETE
# CASCADE (run at the end of the statement) removes their chunks, queue rows,
# failures and the vectors of every model. The ids never leave the server.
#
# The lock: the embed worker holds its claimed queue rows (FOR UPDATE) while
# it embeds, then writes vectors whose foreign key locks the chunk. Deleting
# the chunk first would wait for the worker while the worker waits for us: a
# deadlock. Locking the queue rows first, in a fixed order, makes us wait for
# its batch instead (and the worker skips the rows we hold).
#
# Measured (tests/bench/prune.py, 200k episodes): deleting vectors and chunks
# with explicit set-based DELETEs before the episodes ran 2x slower, as the
# cascade triggers still fire and probe every table.
#
# Repeats (memctl.write.repeats): a selection is deleted in two passes, its repeats first, then its firsts
# that no repeat is left of (PASSES). Deleting a repeat uncounts it from its first (repeats.RECOUNT, from the
# rows `gone` returns); a first is deleted only with its count at 0 (checked again by the DELETE itself, so a
# repeat linked meanwhile keeps it): a first stays while any repeat of it does (kept by importance, awaiting a
# summary, younger than the cutoff).
DELETE_BATCH = """
WITH batch AS MATERIALIZED (
    SELECT e.agent, e.id, e.created_at FROM episodes e
    WHERE {where} AND e.created_at >= %(after_t)s AND (e.created_at, e.id) > (%(after_t)s, %(after_id)s)
    ORDER BY e.created_at, e.id LIMIT %(limit)s
), locked AS (
    SELECT 1 FROM embed_queue q
    JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
    JOIN batch b ON b.agent = c.agent AND b.id = c.episode_id
    ORDER BY q.agent, q.chunk_id, q.model_id
    FOR UPDATE OF q
), gone AS (
    DELETE FROM episodes e USING batch b, (SELECT count(*) FROM locked) AS l
    WHERE e.agent = b.agent AND e.id = b.id AND (e.repeat_of IS NOT NULL OR e.repeats = 0)
    RETURNING e.agent, e.repeat_of, e.created_at
)
SELECT count(*) AS selected, (SELECT count(*) FROM gone) AS deleted, min(created_at) AS oldest,
       max(created_at) AS last_t, max(id) FILTER (WHERE created_at = (SELECT max(created_at) FROM batch)) AS last_id,
       (SELECT json_agg(json_build_array(g.agent, g.repeat_of, g.n, g.newest)) FROM (
            SELECT agent, repeat_of, count(*) AS n, max(created_at) AS newest FROM gone
            WHERE repeat_of IS NOT NULL GROUP BY 1, 2) g) AS uncount
FROM batch
"""
# The two passes over a selection, and what still matches it afterwards (a first some repeat of which is kept
# is not a leftover: it stays by the rule).
PASSES = ("e.repeat_of IS NOT NULL", "e.repeat_of IS NULL AND e.repeats = 0")
LEFT = "(e.repeat_of IS NOT NULL OR e.repeats = 0)"
# Rows this backend deleted from each table, cascades included, not yet flushed
# to the shared statistics: read before and after the DELETE, in its transaction
# (nothing is flushed inside a transaction), the difference is what it deleted.
DELETED_IN_TX = """
SELECT coalesce(pg_stat_get_xact_tuples_deleted(to_regclass(quote_ident(t.name))), 0) AS n
FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i) ORDER BY t.i
"""
# A batch is idempotent: if a crash loses the last commits, the next run deletes
# those rows again. Not waiting for each commit's WAL flush makes many small
# transactions cost about what one large one does.
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
COUNT_BY_KIND = "SELECT e.kind, count(*) AS n FROM episodes e WHERE {where} GROUP BY e.kind"


@dataclass
class Deleted:
    """What a run of batches removed, per kind."""

    rows: Counter = field(default_factory=Counter)
    chunks: Counter = field(default_factory=Counter)
    vectors: Counter = field(default_factory=Counter)
    oldest: dict[str, datetime.datetime] = field(default_factory=dict)
    newest: dict[str, datetime.datetime] = field(default_factory=dict)
    batches: int = 0
    max_transaction_s: float = 0.0

    def note(self, kind: str, batch: dict, chunks: int, vectors: int) -> None:
        self.batches += 1
        self.rows[kind] += batch["deleted"]
        self.chunks[kind] += chunks
        self.vectors[kind] += vectors
        self.oldest[kind] = min(self.oldest.get(kind, batch["oldest"]), batch["oldest"])
        self.newest[kind] = max(self.newest.get(kind, batch["last_t"]), batch["last_t"])

    def kind_row(self, kind: str) -> dict:
        return {
            "rows": self.rows[kind],
            "chunks": self.chunks[kind],
            "vectors": self.vectors[kind],
            "oldest": self.oldest.get(kind),
            "newest": self.newest.get(kind),
        }


# On Citus (episodes distributed by agent) a batch is selected without a lock across the shards,
# then deleted agent by agent, each statement routed to that agent's shard: Citus refuses a
# FOR UPDATE across shards, and the transaction statistics that count the cascade's deletes stay
# on the workers. So the vectors and chunks are deleted explicitly (their rowcounts are the
# report), after the agent's queue rows are locked, in the same order as on one server.
SELECT_BATCH = """
SELECT e.agent, e.id, e.created_at FROM episodes e
WHERE {where} AND e.created_at >= %(after_t)s AND (e.created_at, e.id) > (%(after_t)s, %(after_id)s)
ORDER BY e.created_at, e.id LIMIT %(limit)s
"""
LOCK_AGENT_QUEUE = """
SELECT 1 FROM embed_queue q JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
WHERE q.agent = %(agent)s AND c.agent = %(agent)s AND c.episode_id = ANY(%(ids)s)
ORDER BY q.chunk_id, q.model_id
FOR UPDATE OF q
"""
DELETE_AGENT_VECTORS = """
DELETE FROM {table} v WHERE v.agent = %(agent)s
  AND v.chunk_id IN (SELECT c.id FROM chunks c WHERE c.agent = %(agent)s AND c.episode_id = ANY(%(ids)s))
"""
DELETE_AGENT_CHUNKS = "DELETE FROM chunks WHERE agent = %(agent)s AND episode_id = ANY(%(ids)s)"
DELETE_AGENT_EPISODES = """
DELETE FROM episodes WHERE agent = %(agent)s AND id = ANY(%(ids)s) AND (repeat_of IS NOT NULL OR repeats = 0)
RETURNING agent, repeat_of, created_at
"""


def _delete_batch_by_agent(
    conn: Memory, query, params: dict, vector_tables: list[str]
) -> tuple[dict, list[int]]:
    """One batch on Citus: (the batch row DELETE_BATCH would return, [chunks, vectors] deleted)."""
    from psycopg import sql

    rows = conn.execute(query, params, prepare=False).fetchall()
    batch = {"selected": len(rows), "deleted": 0}
    if not rows:
        return batch, [0, 0]
    last = rows[-1]
    batch.update(oldest=rows[0]["created_at"], last_t=last["created_at"], last_id=last["id"])
    ids: dict[str, list[int]] = {}
    for r in rows:
        ids.setdefault(r["agent"], []).append(r["id"])
    chunks = vectors = 0
    for agent in sorted(ids):
        one = {"agent": agent, "ids": ids[agent]}
        conn.execute(LOCK_AGENT_QUEUE, one).fetchall()
        for table in vector_tables:
            vectors += conn.execute(
                sql.SQL(DELETE_AGENT_VECTORS).format(table=sql.Identifier(table)), one
            ).rowcount
        chunks += conn.execute(DELETE_AGENT_CHUNKS, one).rowcount
        gone = conn.execute(DELETE_AGENT_EPISODES, one).fetchall()
        batch["deleted"] += len(gone)
        repeats.recount(conn, repeats.deleted_repeats(gone))
    return batch, [chunks, vectors]


def _deleted_in_tx(conn: Memory, tables: list[str]) -> list[int]:
    return [r["n"] for r in conn.execute(DELETED_IN_TX, (tables,)).fetchall()]


def delete_selected(
    conn: Memory, kind: str, selection: Selection, done: Deleted, *, batch_size: int = DEFAULT_BATCH
) -> None:
    """Delete every episode of one kind the selection matches, one short transaction per batch: its repeats,
    then its firsts no repeat is left of (PASSES; the first pass only when some repeat is stored)."""
    from memctl.db import cluster

    if batch_size <= 0:
        raise UsageError(f"the batch size must be positive, got {batch_size}")
    counted = ["chunks", *vector_table_names(conn)]
    by_agent = cluster.is_distributed(conn)
    for part in PASSES[0 if repeats.any_repeat(conn) else 1 :]:
        where = "(" + selection.where + ") AND " + part
        _delete_pass(
            conn, kind, Selection(where, selection.params), done, batch_size, counted, by_agent
        )


def _delete_pass(
    conn: Memory,
    kind: str,
    selection: Selection,
    done: Deleted,
    batch_size: int,
    counted: list[str],
    by_agent: bool,
) -> None:
    from psycopg import sql

    query = sql.SQL(SELECT_BATCH if by_agent else DELETE_BATCH).format(
        where=sql.SQL(selection.where)
    )
    after_t, after_id = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc), 0
    while True:
        params = {**selection.params, "after_t": after_t, "after_id": after_id, "limit": batch_size}
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(ASYNC_COMMIT)
            if by_agent:
                batch, counts = _delete_batch_by_agent(conn, query, params, counted[1:])
            else:
                before = _deleted_in_tx(conn, counted)
                batch = conn.one(query, params, prepare=False)
            if not batch["selected"]:
                break
            if not by_agent:
                counts = [n - b for n, b in zip(_deleted_in_tx(conn, counted), before)]
                repeats.recount(conn, batch["uncount"] or [])
        done.max_transaction_s = max(done.max_transaction_s, time.perf_counter() - started)
        done.note(kind, batch, counts[0], sum(counts[1:]))
        after_t, after_id = batch["last_t"], batch["last_id"]


def count_by_kind(conn: Memory, selection: Selection) -> Counter:
    """How many episodes still match, per kind (the check after deleting)."""
    from psycopg import sql

    query = sql.SQL(COUNT_BY_KIND).format(where=sql.SQL("(" + selection.where + ") AND " + LEFT))
    return Counter(
        {r["kind"]: r["n"] for r in conn.execute(query, selection.params, prepare=False).fetchall()}
    )


# --- table sizes and dead tuples ---------------------------------------------

FLUSH_STATS = "SELECT pg_stat_force_next_flush()"
TABLE_STATS = """
SELECT t.name AS table, pg_total_relation_size(to_regclass(quote_ident(t.name))) AS bytes,
       coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples
FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n)
LEFT JOIN pg_stat_user_tables s ON s.relid = to_regclass(quote_ident(t.name))
ORDER BY t.n
"""
BASE_TABLES = ("episodes", "chunks", "embed_queue", "embed_failures")


def table_stats(conn: Memory, tables: list[str]) -> list[dict]:
    """Total size (heap, TOAST, indexes) and live/dead tuples of each table.

    This session's own counters are flushed first (pg_stat_force_next_flush,
    PG 15+); other sessions' counters may lag by a second or so.
    """
    from memctl.db import cluster

    conn.execute(FLUSH_STATS)
    rows = conn.execute(TABLE_STATS, (list(tables),)).fetchall()
    shards = cluster.placement_figures(
        conn
    )  # on Citus: the workers' figures, not the coordinator's shells
    for row in rows:
        if row["table"] in shards:
            figures = shards[row["table"]]
            row.update(
                bytes=figures["total_bytes"],
                live_tuples=figures["live_tuples"],
                dead_tuples=figures["dead_tuples"],
            )
    return rows


def vacuum(conn: Memory, tables: list[str]) -> None:
    """VACUUM (ANALYZE) each table: dead tuples become reusable space; files rarely shrink."""
    from psycopg import sql

    conn.execute(
        FLUSH_STATS
    )  # else our deletes' counts, flushed after VACUUM, come back as dead tuples
    for table in tables:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))


def _before_after(before: list[dict], after: list[dict]) -> list[dict]:
    return [
        {
            "table": b["table"],
            "bytes_before": b["bytes"],
            "bytes_after": a["bytes"],
            "dead_tuples_before": b["dead_tuples"],
            "dead_tuples_after": a["dead_tuples"],
            "live_tuples_after": a["live_tuples"],
        }
        for b, a in zip(before, after)
    ]


# --- a run: delete, check, measure ---------------------------------------------


@dataclass
class Report:
    """What a prune or purge run did: per-kind rows, table sizes before/after, the batches."""

    kinds: list[dict]
    tables: list[dict]
    rows: int
    chunks: int
    vectors: int
    batches: int
    max_transaction_s: float
    elapsed_s: float
    remaining: int
    vacuumed: bool
    outcome: str = "ok"
    error: str | None = None
    facts: list[dict] = field(default_factory=list)
    job_log: list[dict] = field(default_factory=list)
    summaries: list[dict] = field(
        default_factory=list
    )  # purge: summaries built from the source's episodes
    removed: dict = field(
        default_factory=dict
    )  # purge: rows removed per table (memctl.records.erasures)
    ledger: str | None = None  # purge: its erasure ledger entry
    vacuum: dict | None = None  # purge --full: what ran (memctl.backup.erasure.vacuum_full)

    def to_dict(self) -> dict:
        return asdict(self)


def run(
    conn: Memory, selections: dict[str, Selection], *, batch_size: int, run_vacuum: bool
) -> tuple[Report, Deleted]:
    """Delete each kind's selection in batches, check that nothing still matches, measure the tables."""
    started = time.perf_counter()
    tables = [*BASE_TABLES, *vector_table_names(conn)]
    before = table_stats(conn, tables)
    done = Deleted()
    for kind, selection in selections.items():
        delete_selected(conn, kind, selection, done, batch_size=batch_size)
    kinds = [
        {"kind": kind, **done.kind_row(kind), "remaining": count_by_kind(conn, s)[kind]}
        for kind, s in selections.items()
    ]
    if run_vacuum:
        vacuum(conn, tables)
    after = table_stats(conn, tables)
    report = Report(
        kinds=kinds,
        tables=_before_after(before, after),
        rows=sum(done.rows.values()),
        chunks=sum(done.chunks.values()),
        vectors=sum(done.vectors.values()),
        batches=done.batches,
        max_transaction_s=round(done.max_transaction_s, 3),
        elapsed_s=round(time.perf_counter() - started, 3),
        remaining=sum(k["remaining"] for k in kinds),
        vacuumed=run_vacuum,
    )
    return report, done


def detail(report: Report, **extra) -> dict:
    """The report as a job's detail (its outcome and error are the job's own columns)."""
    found = report.to_dict()
    del found["outcome"], found["error"]
    return {**extra, **found}
