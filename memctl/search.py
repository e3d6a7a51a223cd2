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
starve it; the text half matches any wanted word (OR), leaves out words in
nearly every episode when the vector half has found something, ranks by BM25,
and finds episodes not embedded yet.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from memctl import bm25, episodes, models
from memctl.config import Settings, parse_duration
from memctl.errors import EmbedderUnavailable, UnknownModel, UsageError

MODES = ("hybrid", "vector", "text")
TS_CONFIG = "english"
# [search] settings beyond memctl.config's schema, with their defaults (chosen on
# the LoCoMo tuning split and the operations sets; see tests/bench/retrieval.py).
DEFAULTS = {
    "fusion": "weighted",  # or "rrf": reciprocal rank fusion with rrf_k
    "text_weight": 0.5,  # share of the BM25 score (÷ the best) against cosine similarity
    "context_weight": 0.5,  # share of the best neighbour's score an episode adds
    "context_kinds": "conversation",  # kinds whose entries are read in context (comma-separated)
    "context_window": "1h",  # neighbours further apart in time are not context
    "common_terms": 0.1,  # leave out words in more than this share of episodes (hybrid)
    "bm25_k1": 1.2,
    "bm25_b": 0.5,
}


@dataclass
class Query:
    text: str
    k: int = 5
    agent: str | None = None
    kind: str | None = None
    source: str | None = None
    since: str | None = None
    mode: str = "hybrid"

    def check(self) -> None:
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise UsageError("the query is empty")
        if "\x00" in self.text:
            raise UsageError("the query contains a NUL character")
        if not 1 <= int(self.k) <= 1000:
            raise UsageError(f"k must be between 1 and 1000, got {self.k}")


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
TEXT_HALF = """
SELECT e.id AS episode_id, NULL::text AS content, {score} AS rank
FROM episodes e
WHERE e.tsv @@ %(match)s::tsquery {filters}
ORDER BY rank DESC, e.id DESC
LIMIT %(n)s
"""
# Each piece of the query (a word, a "quoted phrase") becomes its own tsquery text:
# lexemes as PostgreSQL's english configuration makes them, phrases with <->.
PIECES = """
SELECT p.ord, phraseto_tsquery('english', p.piece)::text AS q
FROM unnest(%s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
# Every candidate (and context neighbour) scored by both halves: its best chunk's
# exact distance to the query vector and its BM25 score, so fusion never has to
# guess the half an episode was not found by.
SCORES = """
SELECT e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content,
       {distance} AS distance, {score} AS text_score
FROM episodes e WHERE e.id = ANY(%(ids)s)
"""
DISTANCE = """(SELECT min(v.embedding <=> %(q)b::{type}) FROM chunks c
  JOIN {table} v ON v.agent = c.agent AND v.chunk_id = c.id WHERE c.agent = e.agent AND c.episode_id = e.id)"""
# The entries just before and after an episode in its agent's log (by id), when
# they are of the same kind, close in time and pass the query's filters.
NEIGHBOURS = """
SELECT c.id, b.id AS before, a.id AS after
FROM episodes c
LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                   WHERE e.agent = c.agent AND e.id < c.id ORDER BY e.id DESC LIMIT 1) b
       ON b.kind = c.kind AND abs(extract(epoch FROM c.created_at - b.created_at)) <= %(window)s {before}
LEFT JOIN LATERAL (SELECT e.id, e.agent, e.kind, e.source, e.created_at FROM episodes e
                   WHERE e.agent = c.agent AND e.id > c.id ORDER BY e.id LIMIT 1) a
       ON a.kind = c.kind AND abs(extract(epoch FROM a.created_at - c.created_at)) <= %(window)s {after}
WHERE c.id = ANY(%(ids)s) AND c.kind = ANY(%(kinds)s)
"""
SET_SCAN = "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), set_config('hnsw.ef_search', %s, true)"


def _filters(query: Query):
    return episodes.filters(agent=query.agent, kind=query.kind, source=query.source, since=query.since)


def vector_half(conn, model: models.Model, vector, query: Query, n: int, ef_search: int) -> list[dict]:
    """The nearest chunks by the active model's HNSW index, iterative scan on, filters applied."""
    from psycopg import sql

    conditions, params = [], {}
    if query.agent is not None:  # on the vector table itself: the index scan filters as it goes
        conditions.append(sql.SQL("v.agent = {}").format(sql.Placeholder("agent")))
        params["agent"] = query.agent
    needs_join = any(v is not None for v in (query.kind, query.source, query.since))
    if needs_join:
        extra, values = episodes.filters(kind=query.kind, source=query.source, since=query.since)
        conditions += extra
        params.update(values)
    statement = sql.SQL(VECTOR_HALF).format(
        type=sql.SQL(model.storage), table=sql.Identifier(model.table_name),
        join=sql.SQL(JOIN_EPISODES) if needs_join else sql.SQL(""),
        where=episodes.where(conditions))
    with conn.transaction():
        conn.execute(SET_SCAN, (str(ef_search),))
        return conn.execute(statement, {**params, "q": _query_vector(conn, vector, model), "n": n},
                            prepare=False).fetchall()


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


def pieces(conn, text: str) -> Terms:
    """The query's wanted and excluded pieces as tsquery texts ('' for a piece of stopwords only)."""
    terms = split_terms(text)
    every = terms.wanted + terms.excluded
    if not every:
        return Terms([], [])
    parsed = [r["q"] for r in conn.execute(PIECES, (every,), prepare=False).fetchall()]
    return Terms(parsed[: len(terms.wanted)], parsed[len(terms.wanted):])


def match_query(wanted: list[str], excluded: list[str]) -> str | None:
    """`(w1 | w2 | 'disk' <-> 'full') & !'nginx' & !('dry' <-> 'run')`; None without a wanted piece."""
    kept = [f"( {q} )" for q in wanted if q]
    if not kept:
        return None  # only stopwords or only exclusions: nothing, rather than everything
    return " & ".join(["( " + " | ".join(kept) + " )", *(f"!( {q} )" for q in excluded if q)])


def text_query(conn, text: str) -> str | None:
    """The tsquery of the text half: any wanted piece, and none of the excluded ones."""
    parsed = pieces(conn, text)
    return match_query(parsed.wanted, parsed.excluded)


EXCLUDED_IDS = "SELECT id FROM episodes WHERE id = ANY(%s) AND tsv @@ %s::tsquery"


def excluded_ids(conn, text: str, ids: list[int], parsed: Terms | None = None) -> set[int]:
    """Of these episodes, the ones holding an excluded (-word, -"phrase") piece of the query.

    The text half never finds them; this keeps the vector half and context from bringing them back.
    """
    parsed = parsed or pieces(conn, text)
    parts = [f"( {q} )" for q in parsed.excluded if q]
    if not parts or not ids:
        return set()
    return {r["id"] for r in conn.execute(EXCLUDED_IDS, (list(ids), " | ".join(parts)), prepare=False)}


def setting(settings: Settings, key: str) -> Any:
    value = settings.get("search", key)
    return DEFAULTS[key] if value is None else value


def text_half(conn, query: Query, n: int, plan: bm25.Plan, stats: bm25.TermStats, settings: Settings,
              excluded: list[str]) -> list[dict]:
    """Episodes matching any kept term of the query and no excluded piece, best BM25 first."""
    from psycopg import sql

    match = match_query(plan.terms, excluded)
    if match is None:
        return []
    clauses, params = _filters(query)
    filters = sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)
    score = sql.SQL(bm25.SCORE).format(tsv=sql.SQL("e.tsv"))
    statement = sql.SQL(TEXT_HALF).format(score=score, filters=filters)
    values = bm25.parameters(plan, stats, setting(settings, "bm25_k1"), setting(settings, "bm25_b"))
    return conn.execute(statement, {**params, **values, "match": match, "n": n}, prepare=False).fetchall()


def score_rows(conn, ids: list[int], model, vector, plan: bm25.Plan | None, stats, settings) -> dict[int, dict]:
    """Episode rows with both halves' scores (distance None without a vector or chunk vectors)."""
    from psycopg import sql

    params: dict[str, Any] = {"ids": list(ids)}
    distance = sql.SQL("NULL::float8")
    if vector is not None and model is not None:
        distance = sql.SQL(DISTANCE).format(type=sql.SQL(model.storage), table=sql.Identifier(model.table_name))
        params["q"] = _query_vector(conn, vector, model)
    score = sql.SQL("0::float8")
    if plan is not None and plan.terms:
        score = sql.SQL(bm25.SCORE).format(tsv=sql.SQL("e.tsv"))
        params.update(bm25.parameters(plan, stats, setting(settings, "bm25_k1"), setting(settings, "bm25_b")))
    statement = sql.SQL(SCORES).format(distance=distance, score=score)
    return {r["id"]: r for r in conn.execute(statement, params, prepare=False).fetchall()}


def neighbours(conn, query: Query, ids: list[int], settings: Settings) -> dict[int, list[int]]:
    """Episode id -> the ids of its context neighbours, for episodes of the context kinds."""
    from psycopg import sql

    kinds = [k.strip() for k in str(setting(settings, "context_kinds")).split(",") if k.strip()]
    if not kinds or not ids or setting(settings, "context_weight") == 0:
        return {}
    parts = {}
    params: dict[str, Any] = {}
    for alias in ("b", "a"):
        clauses, values = episodes.filters(agent=query.agent, kind=query.kind, source=query.source,
                                           since=query.since, alias=alias)
        parts["before" if alias == "b" else "after"] = sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)
        params.update(values)
    window = parse_duration(str(setting(settings, "context_window")))
    statement = sql.SQL(NEIGHBOURS).format(**parts)
    rows = conn.execute(statement, {**params, "ids": list(ids), "kinds": kinds, "window": window},
                        prepare=False).fetchall()
    return {r["id"]: [i for i in (r["before"], r["after"]) if i is not None] for r in rows}


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
         accessed: dict | None = None) -> list[Hit]:
    conf = settings.section("search")
    half_life = parse_duration(conf["recency_half_life"])
    by_vector = _ranks(vector_rows or [])
    by_text = _ranks(text_rows or [])
    relevance_of = relevances(settings, vector_rows, text_rows, scored, context)
    hits = []
    for episode_id in candidates:
        row = scored.get(episode_id)
        if row is None or episode_id not in relevance_of:
            continue  # deleted meanwhile, excluded, or (rrf) found by neither half
        v, t = by_vector.get(episode_id), by_text.get(episode_id)
        relevance = relevance_of[episode_id]
        anchor = (accessed or {}).get(episode_id) or row["created_at"]
        age = max(0.0, (now - anchor).total_seconds())
        recency = 0.5 ** (age / half_life)
        importance_term = row["importance"] / 10
        score = relevance + conf["recency_weight"] * recency + conf["importance_weight"] * importance_term
        hits.append(Hit(
            id=episode_id, score=round(score, 6), agent=row["agent"], kind=row["kind"], source=row["source"],
            importance=row["importance"], created_at=row["created_at"], content=row["content"],
            relevance=round(relevance, 6), recency=round(recency, 6), importance_term=importance_term,
            vector_rank=v[0] if v else None, text_rank=t[0] if t else None,
            distance=None if row["distance"] is None else round(float(row["distance"]), 6),
            text_score=round(float(row["text_score"]), 6) if row["text_score"] else None,
            chunk=v[1]["content"] if v else None))
    hits.sort(key=lambda h: (-h.score, -h.id))
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


def _run(conn, settings, query: Query, model, vector, outcome: Outcome, cache: dict) -> Outcome:
    conf = settings.section("search")
    n = max(conf["candidates"], query.k * 4)
    vector_rows = text_rows = None
    if outcome.mode in ("hybrid", "vector") and model is not None and vector is not None:
        vector_rows = vector_half(conn, model, vector, query, n, conf["ef_search"])
    parsed = pieces(conn, query.text)
    plan = stats = None
    if outcome.mode in ("hybrid", "text") and any(parsed.wanted):
        if "stats" not in cache:
            cache["stats"] = bm25.term_stats(conn)
        stats = cache["stats"]
        # words in nearly every episode are left out only when the vector half has found something
        share = setting(settings, "common_terms") if vector_rows else None
        plan = bm25.plan(conn, stats, parsed.wanted, common_share=share)
    if outcome.mode in ("hybrid", "text"):
        text_rows = text_half(conn, query, n, plan, stats, settings, parsed.excluded) if plan else []
    candidates = {r["episode_id"] for r in (vector_rows or []) + (text_rows or [])}
    context = {} if setting(settings, "fusion") == "rrf" else neighbours(conn, query, list(candidates), settings)
    candidates |= {j for near in context.values() for j in near}
    candidates -= excluded_ids(conn, query.text, list(candidates), parsed)
    scored = score_rows(conn, list(candidates), model, vector if vector_rows is not None else None, plan, stats,
                        settings) if candidates else {}
    now = datetime.datetime.now(datetime.timezone.utc)
    accessed = None
    if conf["recency_from"] == "accessed" and scored:
        from memctl import access

        accessed = access.last_accessed(conn, list(scored))
    outcome.hits = fuse(settings, vector_rows, text_rows, scored, candidates, context, now, accessed)[: query.k]
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
