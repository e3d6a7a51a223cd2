"""Hybrid search over episodes: vectors and full text, fused, then weighted.

Scoring, for every candidate (the top `candidates` of each half, plus the
context neighbours of episodes of the context kinds), scored by both halves:

    base       = (1 - text_weight) * cosine similarity of its best chunk
                 + text_weight * BM25 / the best BM25 (memctl.bm25)
    relevance  = base + context_weight * the best base of its neighbours (the
                 entries just before and after it in its agent's log, same kind,
                 within context_window), divided by the best so 1.0 is the top
    recency    = 0.5 ** (age / recency_half_life)        (age since created_at,
                 or since last access with search.recency_from = "accessed")
    score      = relevance + recency_weight * recency + importance_weight * importance / 10

fusion = "rrf" keeps reciprocal rank fusion (rrf_k) instead. The vector half
runs on the active model's HNSW index with iterative scan, so filters never
starve it; the text half matches any wanted word (OR), ranks by BM25, and finds
episodes not embedded yet. With the vector half running, the text half leaves
out words in nearly every episode and matches only the query's rarest words, up
to `match_rows` episodes (memctl.bm25); when the vector half then finds nothing,
the query runs again on all its words.

A query costs two statements: one parses it and counts its rare words, one runs
both halves, the context neighbours and the scoring of every candidate by both
halves (HYBRID), inside a transaction that sets the HNSW scan.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from memctl import bm25, episodes, gate, models
from memctl.config import DurationTooLong, Settings, default, parse_duration
from memctl.errors import BadValue, EmbedderUnavailable, MemctlError, UnknownModel, UsageError

MODES = ("hybrid", "vector", "text")
TS_CONFIG = "english"
# The [search] settings and their defaults are memctl.config's schema (the defaults chosen on the
# LoCoMo tuning split and the operations sets; see tests/bench/retrieval.py).


@dataclass
class Query:
    text: str
    k: int = 5
    agent: str | None = None
    kind: str | None = None
    source: str | None = None
    since: str | None = None
    mode: str = "hybrid"
    until: str | None = None  # exclusive

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise UsageError("the query is empty")
        if "\x00" in self.text:
            raise UsageError("the query contains a NUL character")
        for name in ("text", "agent", "kind", "source"):
            gate.utf8(getattr(self, name), "query" if name == "text" else name, BadValue)
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= MAX_K:
            raise UsageError(f"k must be an integer from 1 to {MAX_K}, got {self.k!r}")


MAX_K = 1000
BATCH_FIELDS = ("query", "agent", "k", "kind", "source", "since", "until", "mode")


def batch_query(item: dict, number: int) -> Query:
    """One line of `episode search --batch`, every field checked where it enters.

    A field given must hold its type (leave it out for the default): query a non-empty string, k an
    integer from 1 to MAX_K (not "3", not 2.5, not true), agent/kind/source strings without NUL, since a
    duration or ISO 8601 date/time, mode one of MODES. BadValue names the line and the field.
    """
    def bad(name: str, why: str) -> BadValue:
        return BadValue(f"line {number}: field {name}: {why}", name)

    def shown(value: Any) -> str:
        text = json.dumps(value, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    for name in (n for n in ("query", "agent", "kind", "source", "since", "until", "mode") if n in item):
        value = item[name]
        if not isinstance(value, str) or not value.strip():
            raise bad(name, f"must be a non-empty string, got {shown(value)}")
        if "\x00" in value:
            raise bad(name, "contains a NUL character (\\0)")
        try:
            gate.utf8(value, name, BadValue)
        except BadValue:
            raise bad(name, "is not valid UTF-8 text (a lone surrogate)") from None
    k = item.get("k", 5)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise bad("k", f"must be an integer from 1 to {MAX_K}, got {shown(k)}")
    mode = item.get("mode", "hybrid")
    if mode not in MODES:
        raise bad("mode", f"must be one of {', '.join(MODES)}, got {shown(mode)}")
    for name in ("since", "until"):
        when = item.get(name)
        if when is None:
            continue
        try:
            parse_duration(when)
        except DurationTooLong as exc:
            raise bad(name, str(exc)) from None
        except ValueError:
            try:
                episodes.parse_since(when)
            except MemctlError:
                raise bad(name, f"{shown(when)} is neither a duration back from now (30m, 12h, 7d) nor an "
                                "ISO 8601 date/time (2026-08-11T09:30:00Z)") from None
    return Query(item["query"], k=k, agent=item.get("agent"), kind=item.get("kind"), source=item.get("source"),
                 since=item.get("since"), until=item.get("until"), mode=mode)


@dataclass
class Hit:
    id: int
    score: float
    agent: str
    kind: str
    source: str | None
    importance: int
    created_at: datetime.datetime
    content: str
    relevance: float
    recency: float
    importance_term: float
    vector_rank: int | None = None
    text_rank: int | None = None
    distance: float | None = None
    text_score: float | None = None
    chunk: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    hits: list[Hit] = field(default_factory=list)
    mode: str = "hybrid"  # the mode that actually ran
    warning: str | None = None


# The vector half alone (model comparisons, stale-fact checks): the nearest chunks by the HNSW index.
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
# Each piece of the query (a word, a "quoted phrase") becomes its own tsquery text:
# lexemes as PostgreSQL's english configuration makes them, phrases with <->.
PIECES = """
SELECT p.ord, phraseto_tsquery('english', p.piece)::text AS q
FROM unnest(%s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
PIECES_PROBED = """
SELECT p.ord, phraseto_tsquery('english', p.piece)::text AS q, false AS rare, 0::float8 AS df, {probe} AS context
FROM unnest(%(pieces)s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
# Whether any episode the query could reach is of a context kind: without one, the query's statement
# leaves the neighbours out (they cost a third of its planning).
# The kinds are the configuration's, written into the statement so that its prepared (generic) plan
# still knows how rare they are and probes episodes_kind_created_idx rather than scanning.
PROBE = "EXISTS (SELECT 1 FROM episodes e WHERE e.kind = ANY({kinds}) {filters})"
# The same, with the document frequency of each wanted piece that is not a common lexeme (those
# come from the statistics): one GIN scan per rare piece, joined rather than a correlated subquery,
# so Citus can plan it too (the tsqueries stay text inside: Citus ships a CTE's rows to the
# workers as text, and the empty tsquery of a stopword does not read back). Scoped to one agent
# (on Citus, so that the count runs on its shard alone), pieces() scales the counts by the agent's
# share to the whole table's, which the common lexemes' frequencies are of.
PIECES_COUNTED = """
WITH p AS MATERIALIZED (
    SELECT p.ord, phraseto_tsquery('english', p.piece)::text AS q
    FROM unnest(%(pieces)s::text[]) WITH ORDINALITY AS p(piece, ord)
),
rare AS MATERIALIZED (
    SELECT ord, q FROM p WHERE ord <= %(wanted)s AND numnode(q::tsquery) > 0 AND NOT q = ANY(%(common)s)
),
counted AS (
    SELECT r.ord, count(*)::float8 AS df FROM rare r JOIN episodes e ON e.tsv @@ r.q::tsquery {agent} GROUP BY r.ord
)
SELECT p.ord, p.q, r.ord IS NOT NULL AS rare, coalesce(c.df, 0) AS df, {probe} AS context
FROM p LEFT JOIN rare r USING (ord) LEFT JOIN counted c USING (ord)
ORDER BY p.ord
"""
# hnsw.* for the transaction, on every node it reaches: Citus forwards SET LOCAL (never set_config)
# to the workers once citus.propagate_set_commands is 'local'; on one server that is a placeholder.
# One simple-protocol round trip, run by set_scan (SET takes no parameters: ef_search is a sql.Literal).
SCAN_SETTINGS = ("SET LOCAL citus.propagate_set_commands = 'local'; SET LOCAL hnsw.iterative_scan = relaxed_order; "
                 "SET LOCAL hnsw.ef_search = {ef}")

# One statement per query: both halves, the context neighbours and every candidate scored by
# both halves (so fusion never guesses the half an episode was not found by). Its parts:
VECTOR_CTE = """
vec AS MATERIALIZED (
    SELECT v.agent, v.chunk_id, v.embedding <=> %(q)b::{type} AS distance
    FROM {table} v {join}
    {where}
    ORDER BY v.embedding <=> %(q)b::{type}
    LIMIT %(n)s
),
vhits AS MATERIALIZED (
    SELECT DISTINCT ON (c.agent, c.episode_id) c.agent, c.episode_id AS id, h.distance, c.content AS chunk
    FROM vec h JOIN chunks c ON c.agent = h.agent AND c.id = h.chunk_id {agent_c}
    ORDER BY c.agent, c.episode_id, h.distance
)"""
TEXT_CTE = """
thits AS MATERIALIZED (
    SELECT e.agent, e.id, {score} AS text_score
    FROM episodes e
    WHERE e.tsv @@ %(match)s::tsquery {filters}
    ORDER BY text_score DESC, e.id DESC
    LIMIT %(n)s
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
# the same kind, close in time and pass the query's filters; they join the candidates.
NEAR_CTE = """
near AS MATERIALIZED (
    SELECT c.agent, c.id, b.id AS before, a.id AS after
    FROM found f JOIN episodes c ON c.agent = f.agent AND c.id = f.id {agent_c}
    LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                       WHERE e.agent = c.agent AND e.id < c.id ORDER BY e.id DESC LIMIT 1) b
           ON b.kind = c.kind AND abs(extract(epoch FROM c.created_at - b.created_at)) <= %(window)s {before}
    LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                       WHERE e.agent = c.agent AND e.id > c.id ORDER BY e.id LIMIT 1) a
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
SELECT e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content,
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


def _filters(query: Query):
    return episodes.filters(agent=query.agent, kind=query.kind, source=query.source, since=query.since,
                            until=query.until)


def _vector_where(query: Query):
    """The vector half's filters and whether they need the episodes joined, with their parameters."""
    from psycopg import sql

    conditions, params = [], {}
    if query.agent is not None:  # on the vector table itself: the index scan filters as it goes
        conditions.append(sql.SQL("v.agent = {}").format(sql.Placeholder("agent")))
        params["agent"] = query.agent
    needs_join = any(v is not None for v in (query.kind, query.source, query.since, query.until))
    if needs_join:
        extra, values = episodes.filters(kind=query.kind, source=query.source, since=query.since,
                                         until=query.until)
        conditions += extra
        params.update(values)
    return episodes.where(conditions), sql.SQL(JOIN_EPISODES) if needs_join else sql.SQL(""), params


def vector_half(conn, model: models.Model, vector, query: Query, n: int, ef_search: int) -> list[dict]:
    """The nearest chunks by the active model's HNSW index, iterative scan on, filters applied."""
    from psycopg import sql

    where, join, params = _vector_where(query)
    statement = sql.SQL(VECTOR_HALF).format(
        type=sql.SQL(model.storage), table=sql.Identifier(model.table_name), join=join, where=where)
    with conn.transaction():
        set_scan(conn, ef_search)
        return conn.execute(statement, {**params, "q": _query_vector(conn, vector, model), "n": n},
                            prepare=False).fetchall()


def set_scan(conn, ef_search: int) -> None:
    """Iterative HNSW scan and ef_search for the current transaction, on every node it reaches.

    The one place search's transactions (vector_half, run_statement) get them.
    """
    from psycopg import sql

    conn.execute(sql.SQL(SCAN_SETTINGS).format(ef=sql.Literal(int(ef_search))))


def _query_vector(conn, vector, model: models.Model):
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


@dataclass
class Terms:
    """A query split the way websearch syntax reads it: words and "phrases", each wanted or -excluded."""

    wanted: list[str]
    excluded: list[str]


_TERM = re.compile(r'(-?)"([^"]*)"?|(\S+)')


def split_terms(text: str) -> Terms:
    """`deploy -nginx "disk full" -"dry run"`: wanted deploy and the phrase, excluded nginx and the phrase.

    A lone `-` or a word like `api-v2` is not a negation (only a leading dash is), and
    `or` is just a word: OR is already how wanted terms combine.
    """
    wanted, excluded = [], []
    for match in _TERM.finditer(text):
        negated, phrase, word = match.group(1), match.group(2), match.group(3)
        if phrase is not None:
            (excluded if negated else wanted).append(phrase)
        elif word.startswith("-") and len(word) > 1:
            excluded.append(word[1:])
        else:
            wanted.append(word)
    return Terms([t for t in wanted if t.strip()], [t for t in excluded if t.strip()])


@dataclass
class Parsed(Terms):
    context: bool = True  # an episode of a context kind is within the query's reach


def pieces(conn, text: str, stats: bm25.TermStats | None = None, *, probe: tuple[list[str], Query] | None = None,
           scope: str | None = None) -> Parsed:
    """The query's wanted and excluded pieces as tsquery texts ('' for a piece of stopwords only).

    With `stats`, the same statement counts the wanted pieces' document frequencies into
    stats.counted (all but the common lexemes, which the statistics know): in the episodes of
    `scope` (an agent) when given, scaled by its share of the table.
    With `probe` (context kinds, query), it also says whether an episode of those kinds passes
    the query's agent and kind filters.
    """
    from psycopg import sql

    terms = split_terms(text)
    every = terms.wanted + terms.excluded
    if not every:
        return Parsed([], [])
    if stats is None and probe is None:
        parsed = [r["q"] for r in conn.execute(PIECES, (every,), prepare=False).fetchall()]
        return Parsed(parsed[: len(terms.wanted)], parsed[len(terms.wanted):])
    params: dict[str, Any] = {"pieces": every}
    check = sql.SQL("true")
    if probe is not None:
        kinds, query = probe
        clauses, values = episodes.filters(agent=query.agent, kind=query.kind)
        check = sql.SQL(PROBE).format(kinds=sql.Literal(list(kinds)),
                                      filters=sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses))
        params.update(values)
    if stats is None or not terms.wanted:
        statement = sql.SQL(PIECES_PROBED).format(probe=check)
    else:
        agent = scope
        share = 1.0
        within = sql.SQL("")
        if agent is not None:
            share = bm25.agent_share(conn, stats, agent)
            within = sql.SQL(" AND e.agent = {}").format(sql.Placeholder("agent"))
            params["agent"] = agent
        statement = sql.SQL(PIECES_COUNTED).format(probe=check, agent=within)
        params.update(wanted=len(terms.wanted), common=stats.common_queries)
    rows = conn.execute(statement, params).fetchall()  # prepared once used
    if stats is not None and terms.wanted:
        stats.counted.update((r["q"], r["df"] / share if r["df"] and share > 0 else r["df"])
                             for r in rows if r["rare"])
    parsed = [r["q"] for r in rows]
    return Parsed(parsed[: len(terms.wanted)], parsed[len(terms.wanted):], context=rows[0]["context"])


def match_query(wanted: list[str], excluded: list[str]) -> str | None:
    """`(w1 | w2 | 'disk' <-> 'full') & !'nginx' & !('dry' <-> 'run')`; None without a wanted piece."""
    kept = [f"( {q} )" for q in wanted if q]
    if not kept:
        return None  # only stopwords or only exclusions: nothing, rather than everything
    return " & ".join(["( " + " | ".join(kept) + " )", *(f"!( {q} )" for q in excluded if q)])


def setting(settings: Settings, key: str) -> Any:
    """A [search] setting; its default in memctl.config's schema when `settings` lacks it."""
    value = settings.get("search", key)
    return default("search", key) if value is None else value


def _kinds(settings: Settings) -> list[str]:
    return [k.strip() for k in str(setting(settings, "context_kinds")).split(",") if k.strip()]


@dataclass
class Halves:
    """What one query runs: the vector half (model and vector), the text half (plan), context."""

    model: models.Model | None = None
    vector: Any = None
    plan: bm25.Plan | None = None  # the text half: scores with plan.terms, finds with plan.matched
    stats: bm25.TermStats | None = None
    excluded: list[str] = field(default_factory=list)
    context: bool = False


def statement(query: Query, halves: Halves, settings: Settings, n: int):
    """The one statement of a query (psycopg.sql) and its parameters; None when no half can run."""
    from psycopg import sql

    parts = []
    params: dict[str, Any] = {"n": n}
    vector = halves.vector is not None and halves.model is not None
    agent_c = agent_e = sql.SQL("")
    if query.agent is not None:
        agent_c, agent_e = sql.SQL(AGENT.format("c")), sql.SQL(AGENT.format("e"))
        params["agent"] = query.agent
    scoring = halves.plan is not None and bool(halves.plan.terms)
    if vector:
        model = halves.model
        where, join, values = _vector_where(query)
        parts.append(sql.SQL(VECTOR_CTE).format(agent_c=agent_c, type=sql.SQL(model.storage),
                                                table=sql.Identifier(model.table_name), join=join, where=where))
        params.update(values)
    score = sql.SQL("0::float8")
    if scoring:
        score = bm25.score(halves.plan, "e.tsv")
        params.update(bm25.parameters(halves.plan, halves.stats, setting(settings, "bm25_k1"),
                                      setting(settings, "bm25_b")))
    match = match_query(halves.plan.matched, halves.excluded) if scoring else None
    if match is not None:
        clauses, values = _filters(query)
        params.update(values)
        params["match"] = match
        parts.append(sql.SQL(TEXT_CTE).format(score=score,
                                              filters=sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)))
    if not parts:
        return None, params
    found = FOUND_BOTH if vector and match is not None else FOUND_VECTOR if vector else FOUND_TEXT
    near = sql.SQL(NO_NEAR)
    if halves.context:
        filters = {}
        for alias, name in (("b", "before"), ("a", "after")):
            clauses, values = episodes.filters(agent=query.agent, kind=query.kind, source=query.source,
                                               since=query.since, until=query.until, alias=alias)
            filters[name] = sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)
            params.update(values)
        near = sql.SQL(NEAR_CTE).format(agent_c=agent_c, **filters)
        params.update(kinds=_kinds(settings), window=parse_duration(str(setting(settings, "context_window"))))
    distance = sql.SQL("NULL::float8")
    if vector:
        exact = sql.SQL(DISTANCE).format(agent_c=agent_c, type=sql.SQL(halves.model.storage),
                                         table=sql.Identifier(halves.model.table_name))
        distance = sql.SQL("coalesce(x.distance, {})").format(exact)
    text_score = sql.SQL("coalesce(x.text_score, {})").format(score) if scoring else score
    excluded = sql.SQL("")
    unwanted = [f"( {q} )" for q in halves.excluded if q]
    if unwanted:
        excluded = sql.SQL("WHERE NOT e.tsv @@ %(excluded)s::tsquery")
        params["excluded"] = " | ".join(unwanted)
    text = sql.SQL(HYBRID).format(agent_e=agent_e, ctes=sql.SQL(",").join(parts), found=sql.SQL(found), near=near,
                                  distance=distance, text_score=text_score, excluded=excluded)
    return text, params


def run_statement(conn, query: Query, halves: Halves, settings: Settings, n: int):
    """(vector rows, text rows, scored, context) of one query, from its one statement.

    vector rows and text rows are None for a half that did not run; their order is their half's ranking.
    """
    text, params = statement(query, halves, settings, n)
    vector_ran = halves.vector is not None and halves.model is not None
    if text is None:
        return ([] if vector_ran else None), ([] if halves.plan is not None else None), {}, {}
    if vector_ran:
        params["q"] = _query_vector(conn, halves.vector, halves.model)
        with conn.transaction():
            set_scan(conn, settings.get("search", "ef_search"))
            rows = conn.execute(text, params, prepare=False).fetchall()
    else:
        rows = conn.execute(text, params, prepare=False).fetchall()
    scored = {r["id"]: r for r in rows}
    vector_rows = None
    if vector_ran:
        vector_rows = [{"episode_id": r["id"], "content": r["chunk"]}
                       for r in sorted((r for r in rows if r["vector_distance"] is not None),
                                       key=lambda r: (r["vector_distance"], -r["id"]))]
    text_rows = None
    if halves.plan is not None:
        text_rows = [{"episode_id": r["id"]}
                     for r in sorted((r for r in rows if r["text_found"]), key=lambda r: (-r["text_score"], -r["id"]))]
    context = {r["id"]: [i for i in r["neighbours"] if i is not None] for r in rows if r["neighbours"]}
    return vector_rows, text_rows, scored, context


def _ranks(rows: list[dict]) -> dict[int, tuple[int, dict]]:
    """Episode id -> (rank of its best chunk, that chunk's row), ranks from 1."""
    ranked: dict[int, tuple[int, dict]] = {}
    for row in rows:
        if row["episode_id"] not in ranked:
            ranked[row["episode_id"]] = (len(ranked) + 1, row)
    return ranked


def relevances(settings: Settings, vector_rows, text_rows, scored: dict[int, dict],
               context: dict[int, list[int]]) -> dict[int, float]:
    """Episode id -> relevance, 1.0 for the best: weighted scores, or reciprocal rank fusion."""
    if setting(settings, "fusion") == "rrf":
        rrf_k = settings.get("search", "rrf_k")
        halves = [_ranks(h) for h in (vector_rows, text_rows) if h is not None]
        fused = {i: sum(1 / (rrf_k + h[i][0]) for h in halves if i in h) for i in scored}
        best = len(halves) / (rrf_k + 1)
        return {i: f / best for i, f in fused.items() if f > 0}
    text_share = setting(settings, "text_weight") if vector_rows is not None else 1.0
    if text_rows is None:
        text_share = 0.0
    best_text = max((r["text_score"] or 0 for r in scored.values()), default=0) or 1.0

    def base(i: int) -> float:
        row = scored[i]
        similarity = 0.0 if row["distance"] is None else max(0.0, 1 - float(row["distance"]))
        return (1 - text_share) * similarity + text_share * float(row["text_score"] or 0) / best_text

    beta = setting(settings, "context_weight")
    raw = {i: base(i) + beta * max([base(j) for j in context.get(i, []) if j in scored] or [0]) for i in scored}
    top = max(raw.values(), default=0) or 1.0
    return {i: r / top for i, r in raw.items()}


def fuse(settings: Settings, vector_rows: list[dict] | None, text_rows: list[dict] | None, scored: dict,
         candidates: set[int], context: dict[int, list[int]], now: datetime.datetime,
         accessed: dict | None = None, k: int | None = None) -> list[Hit]:
    """The candidates as hits, best first (the first k when given)."""
    conf = settings.section("search")
    half_life = parse_duration(conf["recency_half_life"])
    recency_weight, importance_weight = conf["recency_weight"], conf["importance_weight"]
    relevance_of = relevances(settings, vector_rows, text_rows, scored, context)
    ranked = []
    for episode_id in candidates:
        row = scored.get(episode_id)
        if row is None or episode_id not in relevance_of:
            continue  # deleted meanwhile, excluded, or (rrf) found by neither half
        anchor = (accessed or {}).get(episode_id) or row["created_at"]
        recency = 0.5 ** (max(0.0, (now - anchor).total_seconds()) / half_life)
        score = relevance_of[episode_id] + recency_weight * recency + importance_weight * row["importance"] / 10
        ranked.append((round(score, 6), episode_id, recency))
    ranked.sort(key=lambda r: (-r[0], -r[1]))
    by_vector = _ranks(vector_rows or [])
    by_text = _ranks(text_rows or [])
    hits = []
    for score, episode_id, recency in ranked[:k]:
        row = scored[episode_id]
        v, t = by_vector.get(episode_id), by_text.get(episode_id)
        hits.append(Hit(
            id=episode_id, score=score, agent=row["agent"], kind=row["kind"], source=row["source"],
            importance=row["importance"], created_at=row["created_at"], content=row["content"],
            relevance=round(relevance_of[episode_id], 6), recency=round(recency, 6),
            importance_term=row["importance"] / 10,
            vector_rank=v[0] if v else None, text_rank=t[0] if t else None,
            distance=None if row["distance"] is None else round(float(row["distance"]), 6),
            text_score=round(float(row["text_score"]), 6) if row["text_score"] else None,
            chunk=v[1]["content"] if v else None))
    return hits


def query_embedder(settings: Settings, model: models.Model):
    """An embedder for the active model's query vectors, with the short search timeout."""
    from memctl.embedding import make_embedder

    return make_embedder(settings, registered=model, timeout=settings.get("embedding", "search_timeout"))


def configured_warning(settings: Settings, model: models.Model) -> str | None:
    """A warning when the configuration names another model than the database's (which search uses)."""
    from memctl.embedding import make_embedder

    return models.mismatch_warning(model, make_embedder(settings))


EMBED_FAILURES = (EmbedderUnavailable, UnknownModel)
MAX_CONSECUTIVE_FAILURES = 2  # then the embedder is taken as down for the rest of the batch


@dataclass
class QueryVectors:
    vectors: list[list[float] | None]  # one per text; None where that text fell back to words
    warning: str | None = None
    degraded: int = 0


def _sub_batch_size(settings: Settings, embedder) -> int:
    limit = getattr(embedder, "max_batch", None) or settings.get("embedding", "batch_size") or 32
    return max(1, int(limit))


def embed_query_texts(settings: Settings, model: models.Model | None, texts: list[str],
                      embedder=None) -> QueryVectors:
    """Query vectors in sub-batches sized to the embedder, each under its own (search) timeout.

    Only a sub-batch that really fails falls back to text search; after
    MAX_CONSECUTIVE_FAILURES failures in a row the embedder counts as down and the
    rest degrade at once, so a dead Ollama costs two timeouts, not one per sub-batch.
    """
    if model is None:
        return QueryVectors([None] * len(texts), "no embedding model registered yet (run memctl embed): "
                            "text search only", len(texts))
    embedder = embedder or query_embedder(settings, model)
    size = _sub_batch_size(settings, embedder)
    vectors: list[list[float] | None] = []
    failures, last_error = 0, None
    for start in range(0, len(texts), size):
        part = texts[start:start + size]
        if failures >= MAX_CONSECUTIVE_FAILURES:
            vectors.extend([None] * len(part))
            continue
        try:
            vectors.extend(embedder.embed(part).vectors)
            failures = 0
        except EMBED_FAILURES as exc:
            failures, last_error = failures + 1, exc
            vectors.extend([None] * len(part))
    degraded = sum(v is None for v in vectors)
    warning = None
    if degraded:
        scope = "text search only" if degraded == len(texts) else \
            f"{degraded} of {len(texts)} queries fell back to text search"
        warning = f"embedder unavailable, {scope}: {last_error}"
    return QueryVectors(vectors, warning, degraded)


def embed_queries(settings: Settings, model: models.Model | None, texts: list[str], embedder=None):
    """Query vectors, or (None, warning) when the embedder is down, slow or missing the model."""
    found = embed_query_texts(settings, model, texts, embedder)
    if found.degraded:
        return None, found.warning
    return found.vectors, None


def _vector_mode_refusal(warning: str | None) -> EmbedderUnavailable:
    return EmbedderUnavailable(f"--mode vector needs the embedder, and it is unavailable: {warning}; "
                               "use --mode hybrid or text to search by words")


def search(conn, settings: Settings, query: Query, *, vector=None, embedder=None,
           accessed_recency: bool | None = None, track: bool = False) -> Outcome:
    """Run one query; `vector` skips embedding (recall, benchmarks).

    The database's active model embeds the query, whatever the configuration names
    (a differing configuration adds a warning). With `track`, the hits returned count
    as accessed (memctl.access), in one statement.
    """
    return search_batch(conn, settings, [query], embedder, track=track,
                        vectors=None if vector is None else [vector])[0]


def _track(conn, outcomes: list[Outcome]) -> None:
    from memctl import access

    access.record(conn, [(h.agent, h.id) for o in outcomes for h in o.hits])


def _narrowed(plan: bm25.Plan) -> bool:
    """Whether the plan leaves a wanted word out of what finds episodes."""
    return bool(plan.left_out) or len(plan.matched) < len(plan.terms)


def _run(conn, settings, query: Query, model, vector, outcome: Outcome, cache: dict) -> Outcome:
    conf = settings.section("search")
    n = max(conf["candidates"], query.k * 4)
    vector_runs = outcome.mode in ("hybrid", "vector") and model is not None and vector is not None
    wants_text = outcome.mode in ("hybrid", "text")
    key = ("stats", query.agent)
    if wants_text and key not in cache:
        cache[key] = bm25.cached_term_stats(conn)
    # on Citus, a query for one agent counts its rare words in that agent's shard (scaled to the
    # table), so the whole query is routed; on one server over all episodes (LoCoMo dev recall@10
    # 0.706 against 0.701 counted per agent)
    scope = query.agent if wants_text and cache[key].citus else None
    kinds = _kinds(settings)
    context = setting(settings, "fusion") != "rrf" and bool(kinds) and setting(settings, "context_weight") != 0
    parsed = pieces(conn, query.text, cache[key] if wants_text else None,
                    probe=(kinds, query) if context else None, scope=scope)
    halves = Halves(model=model if vector_runs else None, vector=vector if vector_runs else None,
                    excluded=parsed.excluded, context=context and parsed.context)
    if wants_text and any(parsed.wanted):
        halves.stats = cache[key]
        # with the vector half running, words in nearly every episode are left out, and only the
        # rarest words find episodes (memctl.bm25); on words alone, every word counts
        hybrid = vector_runs
        halves.plan = bm25.plan(conn, halves.stats, parsed.wanted,
                                common_share=setting(settings, "common_terms") if hybrid else None,
                                match_rows=setting(settings, "match_rows") if hybrid else None)
    vector_rows, text_rows, scored, context = run_statement(conn, query, halves, settings, n)
    if vector_runs and halves.plan is not None and not vector_rows and _narrowed(halves.plan):
        # the vector half found nothing (nothing embedded yet, or not under these filters): the
        # words are all there is, so every one of them finds, as on words alone
        halves.plan = bm25.plan(conn, halves.stats, parsed.wanted, common_share=None)
        _, text_rows, scored, context = run_statement(conn, query, replace(halves, model=None, vector=None),
                                                      settings, n)
    if outcome.mode == "text" or (outcome.mode == "hybrid" and not vector_runs):
        vector_rows = None
    if outcome.mode == "vector":
        text_rows = None
    elif text_rows is None:
        text_rows = []
    candidates = set(scored)
    now = datetime.datetime.now(datetime.timezone.utc)
    accessed = None
    if conf["recency_from"] == "accessed" and scored:
        from memctl import access

        accessed = access.last_accessed(conn, list(scored))
    outcome.hits = fuse(settings, vector_rows, text_rows, scored, candidates, context, now, accessed, query.k)
    return outcome


def search_batch(conn, settings: Settings, queries: list[Query], embedder=None, *,
                 track: bool = False, vectors: list | None = None) -> list[Outcome]:
    """Many queries on one connection, their vectors embedded in sub-batches; `track` as in search().

    A query whose sub-batch failed to embed runs on words alone (its outcome says so);
    a query that asked for --mode vector is never answered by words: EmbedderUnavailable.
    """
    for q in queries:
        q.check()
    model = models.active(conn)
    wanting = [i for i, q in enumerate(queries) if q.mode != "text"]
    notes: list[str] = []
    by_index: dict[int, Any] = {}
    if vectors is not None:
        by_index = {i: v for i, v in zip(range(len(queries)), vectors) if v is not None}
    elif wanting:
        if model is not None and embedder is None:
            mismatch = configured_warning(settings, model)
            if mismatch:
                notes.append(mismatch)
        found = embed_query_texts(settings, model, [queries[i].text for i in wanting], embedder)
        by_index = {i: v for i, v in zip(wanting, found.vectors) if v is not None}
        if found.warning:
            if any(queries[i].mode == "vector" and i not in by_index for i in wanting):
                raise _vector_mode_refusal(found.warning)
            notes.append(found.warning)
    outcomes = []
    cache: dict = {}  # term statistics, read once per batch
    for i, q in enumerate(queries):
        outcome = Outcome(mode=q.mode)
        if q.mode != "text" and i not in by_index:
            if q.mode == "vector":
                raise _vector_mode_refusal("no query vector")
            outcome.mode = "text"
        outcome.warning = "; ".join(notes) or None
        outcomes.append(_run(conn, settings, q, model, by_index.get(i), outcome, cache))
    if track:
        _track(conn, outcomes)
    return outcomes
