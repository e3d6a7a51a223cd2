"""Hybrid search over episodes: vectors and full text, fused, then weighted.

Scoring, for an episode found by either half (documented in the README):

    relevance  = sum over halves of 1 / (rrf_k + rank)   (reciprocal rank fusion,
                 rank of the episode's best chunk), divided by its maximum so 1.0
                 means first in every half that ran
    recency    = 0.5 ** (age / recency_half_life)        (age since created_at,
                 or since last access with search.recency_from = "accessed")
    score      = relevance + recency_weight * recency + importance_weight * importance / 10

The vector half runs on the active model's HNSW index with iterative scan, so
filters never starve it; the text half is PostgreSQL full text with OR
semantics over each episode's tsvector, ranked by ts_rank_cd, and finds
episodes not embedded yet.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from memctl import episodes, models
from memctl.config import Settings, parse_duration
from memctl.errors import EmbedderUnavailable, UnknownModel, UsageError

MODES = ("hybrid", "vector", "text")
TS_CONFIG = "english"


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
SELECT e.id AS episode_id, NULL::text AS content, ts_rank_cd(e.tsv, q.query) AS rank
FROM episodes e, (SELECT %(tsquery)s::tsquery AS query) q
WHERE e.tsv @@ q.query {filters}
ORDER BY rank DESC, e.id DESC
LIMIT %(n)s
"""
# Each piece of the query (a word, a "quoted phrase") becomes its own tsquery text:
# lexemes as PostgreSQL's english configuration makes them, phrases with <->.
PIECES = """
SELECT p.ord, phraseto_tsquery('english', p.piece)::text AS q
FROM unnest(%s::text[]) WITH ORDINALITY AS p(piece, ord) ORDER BY p.ord
"""
EPISODE_ROWS = """
SELECT e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content
FROM episodes e WHERE e.id = ANY(%s)
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


def text_query(conn, text: str) -> str | None:
    """The tsquery of the text half: any wanted piece, and none of the excluded ones.

    `(w1 | w2 | 'disk' <-> 'full') & !'nginx' & !('dry' <-> 'run')`. None when no wanted
    piece has a lexeme (only stopwords, or only exclusions): the text half then finds
    nothing rather than everything.
    """
    terms = split_terms(text)
    pieces = terms.wanted + terms.excluded
    if not pieces:
        return None
    rows = conn.execute(PIECES, (pieces,), prepare=False).fetchall()
    parsed = [r["q"] for r in rows]
    wanted = [f"( {q} )" for q in parsed[: len(terms.wanted)] if q]
    if not wanted:
        return None
    excluded = [f"!( {q} )" for q in parsed[len(terms.wanted):] if q]
    query = "( " + " | ".join(wanted) + " )"
    return " & ".join([query, *excluded])


EXCLUDED_IDS = "SELECT id FROM episodes WHERE id = ANY(%s) AND tsv @@ %s::tsquery"


def excluded_ids(conn, text: str, ids: list[int]) -> set[int]:
    """Of these episodes, the ones holding an excluded (-word, -"phrase") piece of the query.

    The text half never finds them; this keeps the vector half from bringing them back.
    """
    terms = split_terms(text)
    if not terms.excluded or not ids:
        return set()
    rows = conn.execute(PIECES, (terms.excluded,), prepare=False).fetchall()
    parts = [f"( {r['q']} )" for r in rows if r["q"]]
    if not parts:
        return set()
    return {r["id"] for r in conn.execute(EXCLUDED_IDS, (list(ids), " | ".join(parts)), prepare=False)}


def text_half(conn, query: Query, n: int) -> list[dict]:
    """Episodes matching any wanted word of the query and no excluded one, best ts_rank_cd first."""
    from psycopg import sql

    tsquery = text_query(conn, query.text)
    if tsquery is None:
        return []
    clauses, params = _filters(query)
    filters = sql.SQL("").join(sql.SQL(" AND ") + c for c in clauses)
    statement = sql.SQL(TEXT_HALF).format(filters=filters)
    return conn.execute(statement, {**params, "tsquery": tsquery, "n": n}, prepare=False).fetchall()


def _ranks(rows: list[dict]) -> dict[int, tuple[int, dict]]:
    """Episode id -> (rank of its best chunk, that chunk's row), ranks from 1."""
    ranked: dict[int, tuple[int, dict]] = {}
    for row in rows:
        if row["episode_id"] not in ranked:
            ranked[row["episode_id"]] = (len(ranked) + 1, row)
    return ranked


def fuse(settings: Settings, vector_rows: list[dict] | None, text_rows: list[dict] | None, episode_rows: dict,
         now: datetime.datetime, accessed: dict | None = None) -> list[Hit]:
    conf = settings.section("search")
    rrf_k = conf["rrf_k"]
    half_life = parse_duration(conf["recency_half_life"])
    halves = [h for h in (vector_rows, text_rows) if h is not None]
    best = len(halves) / (rrf_k + 1)
    by_vector = _ranks(vector_rows or [])
    by_text = _ranks(text_rows or [])
    hits = []
    for episode_id in set(by_vector) | set(by_text):
        row = episode_rows.get(episode_id)
        if row is None:
            continue  # deleted between the two queries
        v = by_vector.get(episode_id)
        t = by_text.get(episode_id)
        fused = (1 / (rrf_k + v[0]) if v else 0) + (1 / (rrf_k + t[0]) if t else 0)
        relevance = fused / best
        anchor = (accessed or {}).get(episode_id) or row["created_at"]
        age = max(0.0, (now - anchor).total_seconds())
        recency = 0.5 ** (age / half_life)
        importance_term = row["importance"] / 10
        score = relevance + conf["recency_weight"] * recency + conf["importance_weight"] * importance_term
        chunk = v[1]["content"] if v else None
        hits.append(Hit(
            id=episode_id, score=round(score, 6), agent=row["agent"], kind=row["kind"], source=row["source"],
            importance=row["importance"], created_at=row["created_at"], content=row["content"],
            relevance=round(relevance, 6), recency=round(recency, 6), importance_term=importance_term,
            vector_rank=v[0] if v else None, text_rank=t[0] if t else None,
            distance=round(float(v[1]["distance"]), 6) if v else None,
            text_score=round(float(t[1]["rank"]), 6) if t else None, chunk=chunk))
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


def _run(conn, settings, query: Query, model, vector, outcome: Outcome) -> Outcome:
    conf = settings.section("search")
    n = max(conf["candidates"], query.k * 4)
    vector_rows = text_rows = None
    if outcome.mode in ("hybrid", "vector") and model is not None and vector is not None:
        vector_rows = vector_half(conn, model, vector, query, n, conf["ef_search"])
    if outcome.mode in ("hybrid", "text"):
        text_rows = text_half(conn, query, n)
    ids = {r["episode_id"] for r in (vector_rows or []) + (text_rows or [])}
    rows = {r["id"]: r for r in conn.execute(EPISODE_ROWS, (list(ids),)).fetchall()} if ids else {}
    if vector_rows:
        for episode_id in excluded_ids(conn, query.text, list(rows)):
            rows.pop(episode_id, None)
    now = datetime.datetime.now(datetime.timezone.utc)
    accessed = None
    if conf["recency_from"] == "accessed" and rows:
        from memctl import access

        accessed = access.last_accessed(conn, list(rows))
    outcome.hits = fuse(settings, vector_rows, text_rows, rows, now, accessed)[: query.k]
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
    for i, q in enumerate(queries):
        outcome = Outcome(mode=q.mode)
        if q.mode != "text" and i not in by_index:
            if q.mode == "vector":
                raise _vector_mode_refusal("no query vector")
            outcome.mode = "text"
        outcome.warning = "; ".join(notes) or None
        outcomes.append(_run(conn, settings, q, model, by_index.get(i), outcome))
    if track:
        _track(conn, outcomes)
    return outcomes
