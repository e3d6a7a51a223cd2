"""The one statement of a query: both halves, the context neighbours and the scoring of every candidate.

A query costs two statements: one parses it and counts its rare words (memctl.reading.pieces), one runs
both halves, the context neighbours and the scoring of every candidate by both halves
(HYBRID, built by `statement`), inside a transaction that sets the HNSW scan (memctl.reading.scan).
With an agent filter every part of the statement names the agent, so that Citus routes the
whole statement to the agent's shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memctl.config import Settings, parse_duration
from memctl.embedding import models
from memctl.reading import bm25
from memctl.reading.scan import query_vector, vector_where
from memctl.reading.query import Query, context_kinds, match_query
from memctl.reading.when import Period
from memctl.records import filters as episode_filters

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# One statement per query: both halves, the context neighbours and every candidate scored by
# both halves (so fusion never guesses the half an episode was not found by). Its parts.
# The statement is prepared once used a few times, and PostgreSQL then plans it once (a generic
# plan) when that costs about what planning each query would: planning was a sixth of its server
# time. The LIMITs are written in, not parameters: a generic plan that knows how many rows it reads
# keeps the HNSW index scan, whose answers are the custom plan's (tests/test_search.py).
VECTOR_SCAN = """
{vec} AS MATERIALIZED (
    SELECT v.agent, v.chunk_id, v.embedding <=> %(q)b::{type} AS distance
    FROM {table} v {join}
    {where}
    ORDER BY v.embedding <=> %(q)b::{type}
    LIMIT {n}
)"""
# the nearest chunks' episodes, each with its best chunk
VECTOR_HITS = """
{hits} AS MATERIALIZED (
    SELECT DISTINCT ON (c.agent, c.episode_id) c.agent, c.episode_id AS id, h.distance, c.content AS chunk
    FROM {vec} h JOIN chunks c ON c.agent = h.agent AND c.id = h.chunk_id {agent_c}
    ORDER BY c.agent, c.episode_id, h.distance
)"""
VECTOR_CTE = VECTOR_SCAN + "," + VECTOR_HITS
# The text half reads firsts only: a repeat's first is found by the same words (docs/repeats.md).
TEXT_CTE = """
{hits} AS MATERIALIZED (
    SELECT e.agent, e.id, {score} AS text_score
    FROM episodes e
    WHERE e.tsv @@ %(match)s::tsquery AND e.repeat_of IS NULL {filters}
    ORDER BY text_score DESC, e.id DESC
    LIMIT {n}
)"""
# A query that names a period (memctl.reading.when) runs each half twice: over everything, and over what
# was written in the period (or a first whose repeats were seen in it), so that the period's episodes are
# candidates even where the same words and meaning fill the rest of the log (what was told of it in the
# days after is scored, as before, when a half finds it). Each half's hits are the union of its two runs
# (found by both: once, with its best chunk). The period's episodes are read first, at most PERIOD_EXACT + 1 of
# them: when they are that few, each half ranks them exactly; when more, each half runs on its index with
# the period as a filter. An HNSW scan filtered to a narrow period reads most of the index before it has
# its rows, so ranking a few thousand episodes exactly is the cheaper way up to about PERIOD_EXACT of them;
# in a larger table the filtered scan costs more, the period being a smaller share of the index it walks
# (the figures: docs/benchmarks.md, "Figures behind the code"; tests/bench/period.py). The bound is
# therefore also a share of the table: exact up to 1% of the episodes, in steps of PERIOD_EXACT, so that
# the statement's text (its LIMIT written in, as the halves') stays the same while the table grows.
PERIOD_EXACT = 5000
PERIOD_EXACT_SHARE = 0.01


def period_exact(episodes: float) -> int:
    """How many episodes of a named period each half ranks exactly, in a table of `episodes` (more: on
    the indexes): PERIOD_EXACT, or PERIOD_EXACT_SHARE of the table, rounded down to a multiple of
    PERIOD_EXACT, when that is more."""
    return max(PERIOD_EXACT, int(PERIOD_EXACT_SHARE * episodes) // PERIOD_EXACT * PERIOD_EXACT)


PERIOD_EPISODES = """
period_eps AS MATERIALIZED (
    SELECT e.agent, e.id FROM episodes e
    WHERE e.repeat_of IS NULL AND {period} {filters}
    LIMIT {bound}
),
period_few AS MATERIALIZED (SELECT count(*) <= {exact} AS few FROM period_eps)"""
PERIOD_VECTOR = """
period_vec AS MATERIALIZED (
    (SELECT v.agent, v.chunk_id, v.embedding <=> %(q)b::{type} AS distance
     FROM period_eps p JOIN chunks c0 ON c0.agent = p.agent AND c0.episode_id = p.id {agent_c0}
     JOIN {table} v ON v.agent = c0.agent AND v.chunk_id = c0.id
     WHERE (SELECT few FROM period_few)
     ORDER BY distance LIMIT {n})
    UNION ALL
    (SELECT v.agent, v.chunk_id, v.embedding <=> %(q)b::{type} AS distance
     FROM {table} v {join}
     {where} AND NOT (SELECT few FROM period_few)
     ORDER BY v.embedding <=> %(q)b::{type}
     LIMIT {n})
)"""
PERIOD_TEXT = """
period_thits AS MATERIALIZED (
    (SELECT e.agent, e.id, {score} AS text_score
     FROM period_eps p JOIN episodes e ON e.agent = p.agent AND e.id = p.id {agent_e}
     WHERE (SELECT few FROM period_few) AND e.tsv @@ %(match)s::tsquery
     ORDER BY text_score DESC, e.id DESC LIMIT {n})
    UNION ALL
    (SELECT e.agent, e.id, {score} AS text_score
     FROM episodes e
     WHERE NOT (SELECT few FROM period_few) AND e.tsv @@ %(match)s::tsquery AND e.repeat_of IS NULL {filters}
     ORDER BY text_score DESC, e.id DESC LIMIT {n})
)"""
PERIOD_UNION = """
{hits} AS MATERIALIZED (
    SELECT DISTINCT ON (agent, id) * FROM (SELECT * FROM {everywhere} UNION ALL SELECT * FROM {inside}) u
    ORDER BY agent, id, {best}
)"""
# Found by either half, one row per episode with what each half said of it.
FOUND_BOTH = """
found AS MATERIALIZED (
    SELECT coalesce(vh.agent, th.agent) AS agent, coalesce(vh.id, th.id) AS id, vh.distance, vh.chunk, th.text_score
    FROM vhits vh FULL JOIN thits th ON th.agent = vh.agent AND th.id = vh.id
)"""
FOUND_VECTOR = """
found AS MATERIALIZED (SELECT agent, id, distance, chunk, NULL::float8 AS text_score FROM vhits)"""
FOUND_TEXT = """
found AS MATERIALIZED (SELECT agent, id, NULL::float8 AS distance, NULL::text AS chunk, text_score FROM thits)"""
# The entries just before and after a found episode in its agent's log (by id), when they are of
# the same kind, close in time and pass the query's filters; they join the candidates. Repeat rows
# (memctl.write.repeats) are never candidates: their first stands for them, with its count.
NEAR_CTE = """
near AS MATERIALIZED (
    SELECT c.agent, c.id, b.id AS before, a.id AS after
    FROM found f JOIN episodes c ON c.agent = f.agent AND c.id = f.id {agent_c}
    LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                       WHERE e.agent = c.agent AND e.id < c.id AND e.repeat_of IS NULL ORDER BY e.id DESC LIMIT 1) b
           ON b.kind = c.kind AND abs(extract(epoch FROM c.created_at - b.created_at)) <= %(window)s {before}
    LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                       WHERE e.agent = c.agent AND e.id > c.id AND e.repeat_of IS NULL ORDER BY e.id LIMIT 1) a
           ON a.kind = c.kind AND abs(extract(epoch FROM a.created_at - c.created_at)) <= %(window)s {after}
    WHERE c.kind = ANY(%(kinds)s)
),
every AS (
    SELECT f.agent, f.id, f.distance, f.chunk, f.text_score, ARRAY[nb.before, nb.after] AS neighbours
    FROM found f LEFT JOIN near nb ON nb.agent = f.agent AND nb.id = f.id
    UNION ALL
    SELECT DISTINCT nb.agent, n.id, NULL::float8, NULL::text, NULL::float8, NULL::bigint[]
    FROM near nb CROSS JOIN LATERAL (VALUES (nb.before), (nb.after)) n(id)
    WHERE n.id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM found f WHERE f.agent = nb.agent AND f.id = n.id)
)"""
NO_NEAR = """
every AS (SELECT agent, id, distance, chunk, text_score, NULL::bigint[] AS neighbours FROM found)"""
HYBRID = """
WITH {ctes},{found},{near}
SELECT e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content, e.repeats, e.last_seen_at,
       {distance} AS distance, x.distance AS vector_distance, x.chunk,
       {text_score} AS text_score, x.text_score IS NOT NULL AS text_found, x.neighbours
FROM every x JOIN episodes e ON e.agent = x.agent AND e.id = x.id {agent_e}
{excluded}
"""
# The exact distance of an episode found by words alone: its best chunk's.
DISTANCE = """(SELECT min(v.embedding <=> %(q)b::{type}) FROM chunks c
  JOIN {table} v ON v.agent = c.agent AND v.chunk_id = c.id WHERE c.agent = e.agent AND c.episode_id = e.id {agent_c})"""
# With an agent filter, every part of the statement says so itself: Citus then plans the whole
# statement for the one shard that holds the agent (it prunes shards per subquery, by its own conditions).
AGENT = " AND {}.agent = %(agent)s"


def _filters(query: Query, alias: str = "e"):
    return episode_filters.filters(
        agent=query.agent,
        kind=query.kind,
        source=query.source,
        since=query.since,
        until=query.until,
        alias=alias,
    )


# the period's bounds on an episodes alias (parameters set by statement()): written in it, or a first
# whose repeats were seen in it (created before it, last seen in it or after: episodes_last_seen_idx)
PERIOD_CLAUSE = (
    "(({0}.created_at >= %(period_start)s AND {0}.created_at < %(period_end)s) OR "
    "({0}.last_seen_at >= %(period_start)s AND {0}.created_at < %(period_start)s))"
)


@dataclass
class StatementCall:
    """A statement a query's steps ask to run (search._steps), and how."""

    text: bytes | str
    params: Any
    prepare: bool | None = None  # psycopg's: None prepares it once used a few times
    binary: bool = False  # rows in binary
    stage: int = (
        0  # 0: what the query runs first (its answer leads to another statement); 1: the last
    )


@dataclass
class StatementParts:
    """What one query's statement is built from: the vector half (model, vector), the text half (plan), context."""

    model: models.Model | None = None
    vector: Any = None
    plan: bm25.Plan | None = None  # the text half: scores with plan.terms, finds with plan.matched
    stats: bm25.TermStats | None = None
    excluded: list[str] = field(default_factory=list)
    context: bool = False
    period: Period | None = None  # the period the query names: each half also runs inside it
    period_exact: int | None = (
        None  # how many of its episodes are ranked exactly (period_exact; None: PERIOD_EXACT)
    )
    in_role: bool = (
        False  # the connection is in an agent's role (Memory.in_agent_role): bm25.matched_in_role
    )

    @property
    def vector_runs(self) -> bool:
        """Whether the vector half runs: there is a model and a query vector."""
        return self.vector is not None and self.model is not None

    @property
    def scoring(self) -> bool:
        """Whether the text half scores: its plan has words to score with."""
        return self.plan is not None and bool(self.plan.terms)

    @property
    def exact(self) -> int:
        """The named period's exact bound the statement is written with (period_exact, else PERIOD_EXACT)."""
        return PERIOD_EXACT if self.period_exact is None else self.period_exact


# Composed statements by their shape (_shape): composing one costs more Python than the
# rest of a query's, and a batch repeats a few shapes. Bounded: a long-running process (the MCP
# server) may be asked for any k and any number of words; cleared when full.
_TEXTS: dict[tuple, bytes] = {}
TEXTS_SIZE = 1024


def _shape(query: Query, parts: StatementParts, matching: bool, n: int) -> tuple:
    """What the statement's text depends on: the halves that run, which filters are set, the number
    of scored words, whether words find, the neighbours, the exclusions, whether in an agent's role, the
    candidates each half reads, a named period's exact bound, last (the other values are parameters)."""
    model, plan = parts.model if parts.vector_runs else None, parts.plan if parts.scoring else None
    return (
        int(n),
        (model.table_name, model.storage) if model is not None else None,
        tuple(
            v is not None for v in (query.agent, query.kind, query.source, query.since, query.until)
        ),
        len(plan.terms) if plan is not None else None,
        matching,
        parts.context,
        any(parts.excluded),
        parts.in_role,
        parts.exact if parts.period is not None else None,
    )


def statement(query: Query, parts: StatementParts, settings: Settings, n: int):
    """The one statement of a query (bytes) and its parameters; None when no half can run."""
    plan = parts.plan if parts.scoring else None
    match = match_query(plan.matched, parts.excluded) if plan is not None else None
    params: dict[str, Any] = {}
    if not parts.vector_runs and match is None:
        return None, params
    params.update(_filters(query)[1])  # the filters' values, under the names every part uses
    if plan is not None:
        assert parts.stats is not None  # what the plan was made with
        params.update(
            bm25.parameters(plan, parts.stats, settings.search.bm25_k1, settings.search.bm25_b)
        )
    if match is not None:
        params["match"] = match
    if parts.context:
        params.update(
            kinds=context_kinds(settings),
            window=parse_duration(str(settings.search.context_window)),
        )
    if parts.period is not None:
        params.update(period_start=parts.period.start, period_end=parts.period.end)
    unwanted = [f"( {q} )" for q in parts.excluded if q]
    if unwanted:
        params["excluded"] = " | ".join(unwanted)
    shape = _shape(query, parts, match is not None, n)
    text = _TEXTS.get(shape)
    if text is None:
        if len(_TEXTS) >= TEXTS_SIZE:
            _TEXTS.clear()
        text = _TEXTS[shape] = _compose(query, parts, match is not None, n).as_bytes(None)
    return text, params


def _compose(query: Query, parts: StatementParts, matching: bool, n: int):
    """The statement's text (psycopg.sql) for statement()'s shape."""
    from psycopg import sql

    limit = sql.Literal(int(n))
    model, plan = parts.model if parts.vector_runs else None, parts.plan if parts.scoring else None
    ctes = []
    agent_c = agent_e = sql.SQL("")
    if query.agent is not None:
        agent_c, agent_e = sql.SQL(AGENT.format("c")), sql.SQL(AGENT.format("e"))
    clauses, _ = _filters(query)
    period = parts.period is not None and (parts.vector_runs or matching)
    if (
        period
    ):  # the period's episodes, and whether they are few enough to rank exactly (PERIOD_EXACT)
        ctes.append(
            sql.SQL(PERIOD_EPISODES).format(
                period=sql.SQL(PERIOD_CLAUSE.format("e")),
                bound=sql.Literal(parts.exact + 1),
                exact=sql.Literal(parts.exact),
                filters=episode_filters.and_joined(clauses),
            )
        )
    prefix = "every_" if period else ""
    if model is not None:
        where, join, _ = vector_where(query)
        ctes.append(
            sql.SQL(VECTOR_CTE).format(
                agent_c=agent_c,
                type=sql.SQL(model.storage),
                n=limit,
                table=sql.Identifier(model.table_name),
                join=join,
                where=where,
                vec=sql.SQL(prefix + "vec"),
                hits=sql.SQL(prefix + "vhits"),
            )
        )
        if period:
            where, join, _ = vector_where(query, sql.SQL(PERIOD_CLAUSE.format("e")))
            agent_c0 = sql.SQL(AGENT.format("c0")) if query.agent is not None else sql.SQL("")
            ctes.append(
                sql.SQL(PERIOD_VECTOR).format(
                    type=sql.SQL(model.storage),
                    n=limit,
                    join=join,
                    where=where,
                    table=sql.Identifier(model.table_name),
                    agent_c0=agent_c0,
                )
            )
            ctes.append(
                sql.SQL(VECTOR_HITS).format(
                    agent_c=agent_c, vec=sql.SQL("period_vec"), hits=sql.SQL("period_vhits")
                )
            )
            ctes.append(
                sql.SQL(PERIOD_UNION).format(
                    hits=sql.SQL("vhits"),
                    everywhere=sql.SQL("every_vhits"),
                    inside=sql.SQL("period_vhits"),
                    best=sql.SQL("distance"),
                )
            )
    score = bm25.score(plan, "e.tsv") if plan is not None else sql.SQL("0::float8")
    if matching:
        filters = sql.SQL(
            bm25.matched_in_role(parts.in_role, "%(match)s")
        ) + episode_filters.and_joined(clauses)
        ctes.append(
            sql.SQL(TEXT_CTE).format(
                score=score, n=limit, hits=sql.SQL(prefix + "thits"), filters=filters
            )
        )
        if period:
            ctes.append(
                sql.SQL(PERIOD_TEXT).format(
                    score=score,
                    n=limit,
                    agent_e=agent_e,
                    filters=episode_filters.and_joined(
                        [*clauses, sql.SQL(PERIOD_CLAUSE.format("e"))]
                    ),
                )
            )
            ctes.append(
                sql.SQL(PERIOD_UNION).format(
                    hits=sql.SQL("thits"),
                    everywhere=sql.SQL("every_thits"),
                    inside=sql.SQL("period_thits"),
                    best=sql.SQL("text_score DESC"),
                )
            )
    found = (
        FOUND_BOTH
        if parts.vector_runs and matching
        else FOUND_VECTOR
        if parts.vector_runs
        else FOUND_TEXT
    )
    near: sql.Composable = sql.SQL(NO_NEAR)
    if parts.context:
        filters = {}
        for alias, name in (("b", "before"), ("a", "after")):
            filters[name] = episode_filters.and_joined(_filters(query, alias)[0])
        near = sql.SQL(NEAR_CTE).format(agent_c=agent_c, **filters)
    distance: sql.Composable = sql.SQL("NULL::float8")
    if model is not None:
        exact = sql.SQL(DISTANCE).format(
            agent_c=agent_c, type=sql.SQL(model.storage), table=sql.Identifier(model.table_name)
        )
        distance = sql.SQL("coalesce(x.distance, {})").format(exact)
    text_score = sql.SQL("coalesce(x.text_score, {})").format(score) if parts.scoring else score
    excluded = (
        sql.SQL("WHERE NOT e.tsv @@ %(excluded)s::tsquery") if any(parts.excluded) else sql.SQL("")
    )
    return sql.SQL(HYBRID).format(
        agent_e=agent_e,
        ctes=sql.SQL(",").join(ctes),
        found=sql.SQL(found),
        near=near,
        distance=distance,
        text_score=text_score,
        excluded=excluded,
    )


def statement_call(
    conn: Memory, query: Query, parts: StatementParts, n: int
) -> StatementCall | None:
    """The query's one statement, to run in a transaction with the scan set (ScanTransactions); None when no
    half can run (read_rows(None, parts) is then its answer)."""
    text, params = statement(query, parts, conn.settings, n)
    if text is None:
        return None
    if parts.vector_runs:
        assert parts.model is not None  # vector_runs: there is one
        params["q"] = query_vector(conn, parts.vector, parts.model)
    # rows in binary: a query's hundred or so candidates, their times, numbers and arrays load faster so
    return StatementCall(text, params, prepare=None, binary=True, stage=1)


def read_rows(rows: list[dict] | None, parts: StatementParts):
    """(vector rows, text rows, scored, context) of one query, from its statement's rows (None: it ran none).

    vector rows and text rows are None for a half that did not run; their order is their half's ranking.
    """
    if rows is None:
        return ([] if parts.vector_runs else None), ([] if parts.plan is not None else None), {}, {}
    scored = {r["id"]: r for r in rows}
    vector_rows = None
    if parts.vector_runs:
        vector_rows = [
            {"episode_id": r["id"], "content": r["chunk"]}
            for r in sorted(
                (r for r in rows if r["vector_distance"] is not None),
                key=lambda r: (r["vector_distance"], -r["id"]),
            )
        ]
    text_rows = None
    if parts.plan is not None:
        text_rows = [
            {"episode_id": r["id"]}
            for r in sorted(
                (r for r in rows if r["text_found"]), key=lambda r: (-r["text_score"], -r["id"])
            )
        ]
    return vector_rows, text_rows, scored, neighbours(rows)


def neighbours(rows: list[dict]) -> dict[int, tuple[int | None, int | None]]:
    """Candidate -> (the entry just before it, the one just after it) in its agent's log, None for none.

    The statement names them for what either half found; a neighbour it added beside a found entry has
    that entry as its own neighbour (the entry after A has A just before it), so a reply added beside
    the question it answers is scored with that question (memctl.reading.fusion)."""
    pairs = {r["id"]: (r["neighbours"][0], r["neighbours"][1]) for r in rows if r["neighbours"]}
    added: dict[int, list] = {}
    for i, (before, after) in pairs.items():
        if before is not None and before not in pairs:
            added.setdefault(before, [None, None])[1] = i
        if after is not None and after not in pairs:
            added.setdefault(after, [None, None])[0] = i
    pairs.update((i, (b, a)) for i, (b, a) in added.items())
    return pairs
