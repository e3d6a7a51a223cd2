"""Hybrid search over episodes: vectors and full text, fused, then weighted (the scoring's
formula is memctl.reading.fusion's docstring).

fusion = "rrf" keeps reciprocal rank fusion (rrf_k) instead. The vector half
runs on the active model's HNSW index with iterative scan, so filters never
starve it; the text half matches any wanted word (OR), ranks by BM25, and finds
episodes not embedded yet. With the vector half running, the text half leaves
out words in nearly every episode and matches only the query's rarest words, up
to bm25.match_bound episodes (match_rows, or match_share of all episodes when more), and pairs of
the commoner words expected together in no more
(memctl.reading.bm25); when the vector half then finds nothing, the query runs again on all its
words. A query without a word to look for
(query.unsearchable: `!!!`, a lone quote, only -exclusions) runs nothing and
says why in its outcome's note: the nearest episode to noise is no answer.

Repeats folded (docs/repeats.md): a repeat row is never a result (it has no chunk, and the text half
reads firsts only); its first stands for it, with `repeats`, `first_seen` and `last_seen` on its Hit.
with_repeats lists every repeat after its first (search --all).

A query costs two statements: one parses it and counts its rare words, one runs
both halves, the context neighbours and the scoring of every candidate by both
halves (HYBRID), inside a transaction that sets the HNSW scan; a batch's queries
share such transactions, each at most a second long (scan.ScanTransactions), and send
their statements through one pipeline, the database running the next queries'
while memctl scores the last ones (_run_steps).

The pieces: memctl.reading.query (what a query asks), memctl.reading.statement (its one
statement), memctl.reading.fusion (the scoring). This module runs them and holds the embedder
failure policy: a query whose vector cannot be had runs on words, never --mode vector.
"""

from __future__ import annotations

import contextlib
import datetime
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generator

from memctl.config import Settings
from memctl.embedding import models
from memctl.embedding.protocol import as_queries
from memctl.errors import EmbedderUnavailable, UnknownModel
from memctl.reading import bm25, when
from memctl.reading.fusion import Hit, fuse
from memctl.reading.query import Query, context_kinds, unsearchable
from memctl.reading.pieces import Parsed, pieces_call
from memctl.reading.scan import ScanTransactions
from memctl.reading.statement import (
    StatementCall,
    StatementParts,
    period_exact,
    read_rows,
    statement_call,
)

if TYPE_CHECKING:
    from memctl.db.memory import Memory

if TYPE_CHECKING:
    from memctl.db.memory import Memory


@dataclass
class Outcome:
    hits: list[Hit] = field(default_factory=list)
    mode: str = "hybrid"  # the mode that actually ran
    warning: str | None = (
        None  # about the whole call (the embedder); the same for every query of a batch
    )
    note: str | None = None  # about this query alone: why it found nothing (query.unsearchable)


def query_embedder(settings: Settings, model: models.Model):
    """An embedder for the active model's query vectors, with the short search timeout."""
    from memctl.embedding.embedders import make_embedder

    return make_embedder(settings, registered=model, timeout=settings.embedding.search_timeout)


def configured_warning(settings: Settings, model: models.Model) -> str | None:
    """A warning when the configuration names another model than the database's (which search uses)."""
    from memctl.embedding.embedders import make_embedder

    return models.mismatch_warning(model, make_embedder(settings))


EMBED_FAILURES = (EmbedderUnavailable, UnknownModel)
MAX_CONSECUTIVE_FAILURES = 2  # then the embedder is taken as down for the rest of the batch


@dataclass
class QueryVectors:
    vectors: list[list[float] | None]  # one per text; None where that text fell back to words
    warning: str | None = None
    degraded: int = 0


def _sub_batch_size(settings: Settings, embedder) -> int:
    limit = getattr(embedder, "max_batch", None) or settings.embedding.batch_size
    return max(1, int(limit))


def embed_query_texts(
    settings: Settings, model: models.Model | None, texts: list[str], embedder=None
) -> QueryVectors:
    """Query vectors in sub-batches sized to the embedder, each under its own (search) timeout.

    Only a sub-batch that really fails falls back to text search; after
    MAX_CONSECUTIVE_FAILURES failures in a row the embedder counts as down and the
    rest degrade at once, so a dead Ollama costs two timeouts, not one per sub-batch.
    """
    if model is None:
        return QueryVectors(
            [None] * len(texts),
            "no embedding model registered yet (run memctl embed): text search only",
            len(texts),
        )
    embedder = embedder or query_embedder(settings, model)
    size = _sub_batch_size(settings, embedder)
    vectors: list[list[float] | None] = []
    failures, last_error = 0, None
    for start in range(0, len(texts), size):
        part = texts[start : start + size]
        if failures >= MAX_CONSECUTIVE_FAILURES:
            vectors.extend([None] * len(part))
            continue
        try:
            vectors.extend(embedder.embed(as_queries(embedder, part)).vectors)
            failures = 0
        except EMBED_FAILURES as exc:
            failures, last_error = failures + 1, exc
            vectors.extend([None] * len(part))
    degraded = sum(v is None for v in vectors)
    warning = None
    if degraded:
        scope = (
            "text search only"
            if degraded == len(texts)
            else f"{degraded} of {len(texts)} queries fell back to text search"
        )
        warning = f"embedder unavailable, {scope}: {last_error}"
    return QueryVectors(vectors, warning, degraded)


def embed_queries(settings: Settings, model: models.Model | None, texts: list[str], embedder=None):
    """Query vectors, or (None, warning) when the embedder is down, slow or missing the model."""
    found = embed_query_texts(settings, model, texts, embedder)
    if found.degraded:
        return None, found.warning
    return found.vectors, None


def _vector_mode_refusal(warning: str | None) -> EmbedderUnavailable:
    return EmbedderUnavailable(
        f"--mode vector needs the embedder, and it is unavailable: {warning}; "
        "use --mode hybrid or text to search by words"
    )


def search(
    conn: Memory, query: Query, *, vector=None, embedder=None, track: bool = False
) -> Outcome:
    """Run one query; `vector` skips embedding (recall, benchmarks).

    The database's active model embeds the query, whatever the configuration names
    (a differing configuration adds a warning). With `track`, the hits returned count
    as accessed (memctl.records.access), in one statement.
    """
    return search_batch(
        conn, [query], embedder, track=track, vectors=None if vector is None else [vector]
    )[0]


def _track(conn: Memory, outcomes: list[Outcome]) -> None:
    from memctl.records import access

    access.record(conn, [(h.agent, h.id) for o in outcomes for h in o.hits])


def _narrowed(plan: bm25.Plan) -> bool:
    """Whether the plan leaves a wanted word out of what finds episodes."""
    return bool(plan.left_out) or any(t not in plan.matched for t in plan.terms)


def _steps(
    conn: Memory, query: Query, model, vector, outcome: Outcome, cache: dict
) -> Generator[StatementCall, Any, None]:
    """One query's work: yields the statements it needs run (statement.StatementCall) and takes their rows;
    its outcome's hits set when it ends. _run_steps runs many of these at once."""
    settings = conn.settings
    conf = settings.search
    n = max(conf.candidates, query.k * 4)
    vector_runs = outcome.mode in ("hybrid", "vector") and model is not None and vector is not None
    wants_text = outcome.mode in ("hybrid", "text")
    key = ("stats", query.agent)
    period = when.period(query.text) if conf.when_weight else None
    if (
        wants_text or period is not None
    ) and key not in cache:  # a period's exact bound needs the count
        cache[key] = bm25.cached_term_stats(conn)
    # on Citus, a query for one agent counts its rare words in that agent's shard (scaled to the
    # table), so the whole query is routed; on one server over all episodes, which ranks a little
    # better (docs/benchmarks.md)
    scope = query.agent if wants_text and cache[key].citus else None
    kinds = context_kinds(settings)
    context = (
        settings.search.fusion != "rrf" and bool(kinds) and settings.search.context_weight != 0
    )
    call = pieces_call(
        conn,
        query.text,
        cache[key] if wants_text else None,
        probe=(kinds, query) if context else None,
        scope=scope,
    )
    parsed = call if isinstance(call, Parsed) else call.answer(conn, (yield call.request))
    parts = StatementParts(
        model=model if vector_runs else None,
        vector=vector if vector_runs else None,
        excluded=parsed.excluded,
        context=context and parsed.context,
        period=period,
        period_exact=None if period is None else period_exact(cache[key].n),
        in_role=conn.in_agent_role,
    )
    if wants_text and any(parsed.wanted):
        parts.stats = cache[key]
        # with the vector half running, words in nearly every episode are left out, and only the
        # rarest words find episodes (memctl.reading.bm25); on words alone, every word counts
        hybrid = vector_runs
        parts.plan = bm25.plan(
            conn,
            parts.stats,
            parsed.wanted,
            common_share=settings.search.common_terms if hybrid else None,
            match_rows=bm25.match_bound(
                parts.stats, settings.search.match_rows, settings.search.match_share
            )
            if hybrid
            else None,
        )
    request = statement_call(conn, query, parts, n)
    vector_rows, text_rows, scored, context = read_rows((yield request) if request else None, parts)
    if vector_runs and parts.plan is not None and not vector_rows and _narrowed(parts.plan):
        # the vector half found nothing (nothing embedded yet, or not under these filters): the
        # words are all there is, so every one of them finds, as on words alone
        assert parts.stats is not None  # what the plan was made with
        parts = replace(
            parts,
            model=None,
            vector=None,
            plan=bm25.plan(conn, parts.stats, parsed.wanted, common_share=None),
        )
        request = statement_call(conn, query, parts, n)
        _, text_rows, scored, context = read_rows((yield request) if request else None, parts)
    if outcome.mode == "text" or (outcome.mode == "hybrid" and not vector_runs):
        vector_rows = None
    if outcome.mode == "vector":
        text_rows = None
    elif text_rows is None:
        text_rows = []
    candidates = set(scored)
    now = datetime.datetime.now(datetime.timezone.utc)
    accessed = None
    if conf.recency_from == "accessed" and scored:
        from memctl.records import access

        accessed = access.last_accessed(conn, list(scored))
    ceiling = parts.plan.ceiling if parts.plan is not None else None
    outcome.hits = fuse(
        settings,
        vector_rows,
        text_rows,
        scored,
        candidates,
        context,
        now,
        accessed,
        query.k,
        text_ceiling=ceiling,
        period=parts.period,
    )


# Queries a batch starts at a time in its pipeline (_run_steps): their statements run while memctl
# scores the ones before.
WINDOW = 16


def _run_steps(
    conn: Memory, scans: ScanTransactions, runs: list[Generator], pipelined: bool
) -> None:
    """Run the queries' steps, their statements pipelined: the database runs a window of queries'
    statements while memctl scores the window before (fusion is pure Python; the server is another
    process, on another core).

    Each round sends what the queries ask next and reads every answer at once (a pipeline answers
    in the order asked). After reading, the queries whose answer leads to another statement (their
    parse and count: stage 0) ask first, then the next window starts, then the rest finish, scoring
    while the server works. Without a pipeline (one query; a libpq without pipeline mode) the same
    steps run one statement at a time.
    """
    waiting = deque(runs)
    asked: list[tuple[Generator, StatementCall, Any]] = []

    def advance(run: Generator, rows) -> None:
        try:
            request = run.send(rows)
        except StopIteration:
            return
        asked.append(
            (
                run,
                request,
                conn.execute(
                    request.text, request.params, prepare=request.prepare, binary=request.binary
                ),
            )
        )

    def start() -> None:
        for _ in range(min(WINDOW if pipelined else 1, len(waiting))):
            advance(waiting.popleft(), None)

    scans.begin()
    start()
    while asked or waiting:
        answered, asked[:] = asked[:], []
        rows: dict[int, list] = {}

        def read(i: int) -> list:
            if i not in rows:
                rows[i] = answered[i][2].fetchall()
            return rows[i]

        if answered:
            read(0)  # waits for every answer: a pipeline answers in the order asked
        scans.begin()  # nothing in flight: a transaction older than ScanTransactions.seconds ends here
        for i, (run, request, _) in enumerate(answered):
            if request.stage == 0:
                advance(run, read(i))
        start()
        for i, (run, request, _) in enumerate(answered):
            if request.stage != 0:
                advance(run, read(i))


def with_repeats(conn: Memory, hits: list[Hit]) -> list[dict]:
    """The hits as rows, each folded one followed by every repeat of it (oldest first; search --all).

    A repeat's row has the hit's keys, its own id, time, importance and text, `repeat_of` naming its
    first and no score; a hit's row has `repeat_of` None.
    """
    from memctl.records import episodes

    rows = []
    for hit in hits:
        row = {**hit.to_dict(), "repeat_of": None}
        rows.append(row)
        if not hit.repeats:
            continue
        blank = dict.fromkeys(row)
        for other in episodes.repeats_of(conn, hit.agent, hit.id, limit=hit.repeats + 1):
            if other["id"] != hit.id:
                rows.append({**blank, **{k: other[k] for k in REPEAT_FIELDS}, "repeat_of": hit.id})
    return rows


REPEAT_FIELDS = ("id", "agent", "kind", "source", "importance", "created_at", "content")


def search_batch(
    conn: Memory,
    queries: list[Query],
    embedder=None,
    *,
    track: bool = False,
    vectors: list | None = None,
) -> list[Outcome]:
    """Many queries on one connection, their vectors embedded in sub-batches; `track` as in search().

    A query whose sub-batch failed to embed runs on words alone (its outcome says so);
    a query that asked for --mode vector is never answered by words: EmbedderUnavailable.
    """
    settings = conn.settings
    for q in queries:
        q.check()
    model = models.active(conn)
    nothing = {i: why for i, why in enumerate(unsearchable(q.text) for q in queries) if why}
    wanting = [i for i, q in enumerate(queries) if q.mode != "text" and i not in nothing]
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
    outcomes = [_outcome(q, i, nothing, notes, by_index) for i, q in enumerate(queries)]
    cache: dict = {}  # term statistics, read once per batch
    runs = [
        _steps(conn, q, model, by_index.get(i), o, cache)
        for i, (q, o) in enumerate(zip(queries, outcomes))
        if i not in nothing
    ]
    pipelined = len(runs) > 1 and _pipelines()
    with (
        ScanTransactions(conn, pipelined=pipelined) as scans,
        conn.pipeline() if pipelined else contextlib.nullcontext(),
    ):
        _run_steps(conn, scans, runs, pipelined)
    if track:
        _track(conn, outcomes)
    return outcomes


def _outcome(q: Query, i: int, nothing: dict, notes: list[str], by_index: dict) -> Outcome:
    """Query i's outcome before it runs: its mode, its batch's warning, why it runs nothing."""
    outcome = Outcome(mode=q.mode, warning="; ".join(notes) or None)
    if i in nothing:  # no word: an answer would be the nearest episode to noise
        outcome.note = nothing[i]
    elif q.mode != "text" and i not in by_index:
        if q.mode == "vector":
            raise _vector_mode_refusal("no query vector")
        outcome.mode = "text"
    return outcome


def _pipelines() -> bool:
    """Whether psycopg's libpq has pipeline mode (14 and later)."""
    from psycopg import Pipeline

    return Pipeline.is_supported()
