"""The HNSW scan: its settings for a transaction (set_scan, ScanTransactions), the query vector, and
the vector half run alone (vector_half: model comparisons, stale-fact checks).

The one statement of a query, which runs both halves in these transactions, is
memctl.reading.statement's (docs/search.md).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from memctl.embedding import models
from memctl.reading.query import Query
from memctl.records import filters as episode_filters

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# The vector half alone (model comparisons, stale-fact checks): the nearest chunks by the index.
VECTOR_HALF = """
WITH hits AS MATERIALIZED (
    SELECT v.agent, v.chunk_id, v.embedding <=> %(q)b::{type} AS distance
    FROM {table} v {join}
    {where}
    ORDER BY v.embedding <=> %(q)b::{type}
    LIMIT %(n)s
)
SELECT h.agent, h.chunk_id, h.distance, c.episode_id, c.content
FROM hits h JOIN chunks c ON c.agent = h.agent AND c.id = h.chunk_id
ORDER BY h.distance
"""
JOIN_EPISODES = """JOIN chunks c0 ON c0.agent = v.agent AND c0.id = v.chunk_id
JOIN episodes e ON e.agent = c0.agent AND e.id = c0.episode_id"""
# hnsw.* for the transaction, on every node it reaches: Citus forwards SET LOCAL (never set_config)
# to the workers once citus.propagate_set_commands is 'local'; on one server that is a placeholder.
# One simple-protocol round trip, run by set_scan (SET takes no parameters: ef_search is a
# sql.Literal). In a pipeline (a batch: search._run_steps), the three go as statements of their own:
# a pipeline takes one statement per query.
SCAN_SETTINGS = (
    "SET LOCAL citus.propagate_set_commands = 'local'",
    "SET LOCAL hnsw.iterative_scan = relaxed_order",
    "SET LOCAL hnsw.ef_search = {ef}",
)


def vector_where(query: Query, *more):
    """The vector half's filters and whether they need the episodes joined, with their parameters;
    `more`: conditions on the episodes (`e`) besides, whose parameters are the caller's."""
    from psycopg import sql

    conditions, params = [], {}
    if query.agent is not None:  # on the vector table itself: the index scan filters as it goes
        conditions.append(sql.SQL("v.agent = {}").format(sql.Placeholder("agent")))
        params["agent"] = query.agent
    needs_join = bool(more) or any(
        v is not None for v in (query.kind, query.source, query.since, query.until)
    )
    if needs_join:
        extra, values = episode_filters.filters(
            kind=query.kind, source=query.source, since=query.since, until=query.until
        )
        conditions += extra
        params.update(values)
    conditions += more
    join = sql.SQL(JOIN_EPISODES) if needs_join else sql.SQL("")
    return episode_filters.where(conditions), join, params


def vector_half(conn: Memory, model: models.Model, vector, query: Query, n: int) -> list[dict]:
    """The nearest chunks by the active model's HNSW index, iterative scan on, filters applied."""
    from psycopg import sql

    where, join, params = vector_where(query)
    statement = sql.SQL(VECTOR_HALF).format(
        type=sql.SQL(model.storage), table=sql.Identifier(model.table_name), join=join, where=where
    )
    with conn.transaction():
        set_scan(conn)
        return conn.execute(
            statement, {**params, "q": query_vector(conn, vector, model), "n": n}, prepare=False
        ).fetchall()


def set_scan(conn: Memory, *, pipelined: bool = False) -> None:
    """Iterative HNSW scan and the handle's ef_search (Memory.ef_search, from its settings) for the current
    transaction, on every node it reaches.

    The one place search's transactions (vector_half, ScanTransactions) get them.
    """
    from psycopg import sql

    commands = [sql.SQL(c).format(ef=sql.Literal(int(conn.ef_search))) for c in SCAN_SETTINGS]
    if pipelined:
        for command in commands:
            conn.execute(command)
    else:
        conn.execute(sql.SQL("; ").join(commands))


class ScanTransactions:
    """Transactions that set the HNSW scan once (set_scan, with the handle's ef_search) for every query run in them.

    A batch's queries share them: BEGIN, the settings and COMMIT are three round trips, which a
    query would otherwise pay each time (about a tenth of a hybrid query: docs/benchmarks.md).
    Each lasts at most `seconds` (begin() starts a new one after that), so a batch holds the
    share locks its reads take, which DDL such as a model switch waits for, only briefly at a time.
    Reads only: a transaction open here is never written in. `pipelined`: the connection is in
    pipeline mode (search._run_steps), where the settings go as statements of their own.
    """

    seconds = 1.0

    def __init__(self, conn: Memory, *, pipelined: bool = False):
        self.conn, self.pipelined = conn, pipelined
        self._open: contextlib.AbstractContextManager[Any] | None = None
        self._since = 0.0

    def __enter__(self) -> "ScanTransactions":
        return self

    def begin(self) -> None:
        """With nothing in flight: the current transaction, or a new one when it has lasted
        `seconds`."""
        if self._open is not None and time.monotonic() - self._since < self.seconds:
            return
        self.end()
        self._open = self.conn.transaction()
        self._open.__enter__()
        self._since = time.monotonic()
        set_scan(self.conn, pipelined=self.pipelined)

    def end(self, *exc) -> None:
        if self._open is not None:
            current, self._open = self._open, None
            current.__exit__(*(exc or (None, None, None)))

    def __exit__(self, *exc) -> None:
        self.end(*exc)


def query_vector(conn: Memory, vector, model: models.Model):
    """The query vector as a pgvector value, sent as a binary parameter (%b), not a text literal."""
    from pgvector import HalfVector, Vector
    from psycopg.adapt import PyFormat

    try:
        conn.adapters.get_dumper(Vector, PyFormat.BINARY)
    except Exception:  # a connection opened without pgvector's types (db.connect(vector=False))
        from memctl.db import register_vector

        register_vector(conn)

    values = vector.to_list() if hasattr(vector, "to_list") else [float(x) for x in vector]
    return HalfVector(values) if model.storage == "halfvec" else Vector(values)
