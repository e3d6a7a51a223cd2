"""Scoring: vectors and full text fused, then weighted, into the hits of a query.

For every candidate (the top `candidates` of each half, plus the
context neighbours of episodes of the context kinds), scored by both halves:

    base       = (1 - text_weight) * cosine similarity of its best chunk
                 + text_weight * BM25 / the query's BM25 ceiling (memctl.reading.bm25: the score
                   of an episode holding every query word that any episode holds)
    relevance  = base + context_weight * the best base of its neighbours (the
                 entries just before and after it in its agent's log, same kind,
                 within context_window; a neighbour's base weighs its halves with
                 context_text_weight instead of text_weight)
                 + reply_weight * the neighbour's base of the entry just before it, when that one
                   asks a question (holds a "?" that is not a URL's): a reply answers it, often in none of its words
                 + session_weight * the best base of the other candidates of its session
                 (same agent and kind, created within context_window of it, its
                 neighbours left out), divided by the best so 1.0 is the top
    recency    = 0.5 ** (age / recency_half_life)        (age since created_at,
                 or since last access with search.recency_from = "accessed")
    score      = relevance + recency_weight * recency (left out when the query names a period: it asks
                 about then, not now) + importance_weight * importance / 10
                 + when_weight * closeness of created_at (a repeated episode's: of its seen span) to the
                   period the query names, if it names one
                   (memctl.reading.when: 1 inside it, falling to 0 over a week or two after it)

fusion = "rrf" keeps reciprocal rank fusion (rrf_k) instead.
"""

from __future__ import annotations

import bisect
import datetime
import re
from dataclasses import dataclass
from typing import Any

from memctl.config import Settings, parse_duration
from memctl.reading.query import context_kinds
from memctl.reading.when import Period

# candidate -> (the entry just before it, the one just after it) in its agent's log (statement.neighbours)
Neighbours = dict[int, tuple[int | None, int | None]]
NO_NEIGHBOURS: tuple[None, None] = (None, None)


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
    # a first standing for its repeats (memctl.write.repeats): how many, and the span it was seen in;
    # 0 and None for an episode never repeated
    repeats: int = 0
    first_seen: datetime.datetime | None = None
    last_seen: datetime.datetime | None = None
    # a query that names a date (memctl.reading.when): the time term's share, 1 for an episode written in
    # the period, falling to 0 over the telling time after it; None for a query that names none
    closeness: float | None = None

    def to_dict(self) -> dict[str, Any]:
        # shallow: every field is a scalar (asdict deep-copies each, a tenth of a batch's Python time)
        return dict(self.__dict__)


def _ranks(rows: list[dict]) -> dict[int, tuple[int, dict]]:
    """Episode id -> (rank of its best chunk, that chunk's row), ranks from 1."""
    ranked: dict[int, tuple[int, dict]] = {}
    for row in rows:
        if row["episode_id"] not in ranked:
            ranked[row["episode_id"]] = (len(ranked) + 1, row)
    return ranked


def relevances(
    settings: Settings,
    vector_rows,
    text_rows,
    scored: dict[int, dict],
    context: Neighbours,
    text_ceiling: float | None = None,
) -> dict[int, float]:
    """Episode id -> relevance, 1.0 for the best: weighted scores, or reciprocal rank fusion."""
    if settings.search.fusion == "rrf":
        rrf_k = settings.search.rrf_k
        halves = [_ranks(h) for h in (vector_rows, text_rows) if h is not None]
        fused = {i: sum(1 / (rrf_k + h[i][0]) for h in halves if i in h) for i in scored}
        best = len(halves) / (rrf_k + 1)
        return {i: f / best for i, f in fused.items() if f > 0}
    text_share = settings.search.text_weight if vector_rows is not None else 1.0
    if text_rows is None:
        text_share = 0.0
    # BM25 over what the query could score at most, not over the best found: a candidate holding one
    # common word of a long question is not a full match because nothing holds more
    scale = text_ceiling or max((r["text_score"] or 0 for r in scored.values()), default=0) or 1.0

    # a turn next to a match: what the neighbour shares with the query in words says more than
    # its cosine, which every turn of the same talk has (LoCoMo dev recall@10: docs/search.md)
    near_share = (
        settings.search.context_text_weight
        if vector_rows is not None and text_rows is not None
        else text_share
    )
    base: dict[int, float] = {}
    near: dict[int, float] = {}
    for i, r in scored.items():  # one pass: a batch query scores about a hundred candidates
        distance = r["distance"]
        similarity = 0.0 if distance is None else max(0.0, 1 - float(distance))
        words = min(1.0, float(r["text_score"] or 0) / scale)
        base[i] = (1 - text_share) * similarity + text_share * words
        near[i] = (1 - near_share) * similarity + near_share * words
    beta, reply = settings.search.context_weight, settings.search.reply_weight
    raw = {}
    for i, b in base.items():
        before, after = context.get(i, NO_NEIGHBOURS)
        near_before = near.get(before, 0.0) if before is not None else 0.0
        near_after = near.get(after, 0.0) if after is not None else 0.0
        raw[i] = b + beta * max(near_before, near_after)
        # a reply to a question is scored with it: in a dialogue the answer is the turn after the
        # question, and often shares none of its words (LoCoMo dev recall@10: docs/search.md)
        if reply and before in near and asks(scored[before].get("content") or ""):
            raw[i] += reply * near[before]
    gamma = settings.search.session_weight
    if gamma:
        for i, best in sessions(settings, scored, base, context).items():
            raw[i] += gamma * best
    top = max(raw.values(), default=0) or 1.0
    return {i: r / top for i, r in raw.items()}


# a question mark that ends a question, not one that opens a URL's query ("/search?q=disk", "a?b=1")
_QUESTION = re.compile(r"\?(?![\w=&%/#+-])")


def asks(text: str) -> bool:
    """Whether `text` asks a question: a "?" not followed by a URL query's characters."""
    return "?" in text and _QUESTION.search(text) is not None


WIDE_SESSION = 32  # candidates in a session's window beyond which sessions() walks them best first


def sessions(
    settings: Settings, scored: dict[int, dict], base: dict[int, float], context: Neighbours
) -> dict[int, float]:
    """Candidate of a context kind -> the best base of the other candidates of its session.

    Its session: the candidates of the same agent and kind created within context_window of it (a
    passage scored with its document, the talk it is part of); its neighbours are left out, the
    context term counts them. Only the candidates already fetched: no further statement.
    """
    kinds = set(context_kinds(settings))
    window = parse_duration(str(settings.search.context_window))
    groups: dict[tuple, list[tuple[float, int]]] = {}
    for i, row in scored.items():
        if row.get("kind") in kinds and row.get("created_at") is not None:
            groups.setdefault((row["agent"], row["kind"]), []).append(
                (row["created_at"].timestamp(), i)
            )
    best: dict[int, float] = {}
    for members in groups.values():
        members.sort()
        times = [t for t, _ in members]
        ranked = sorted(members, key=lambda m: -base[m[1]])  # best first, for a long session
        for t, i in members:
            skip = set(context.get(i, NO_NEIGHBOURS)) | {i}
            lo, hi = bisect.bisect_left(times, t - window), bisect.bisect_right(times, t + window)
            if hi - lo <= WIDE_SESSION:
                found = [base[j] for _, j in members[lo:hi] if j not in skip]
            else:  # the first of the best that is in its window (linear, not quadratic, in one long talk)
                found = [
                    next(
                        (base[j] for u, j in ranked if j not in skip and abs(u - t) <= window), 0.0
                    )
                ]
            if found:
                best[i] = max(found)
    return best


def fuse(
    settings: Settings,
    vector_rows: list[dict] | None,
    text_rows: list[dict] | None,
    scored: dict,
    candidates: set[int],
    context: Neighbours,
    now: datetime.datetime,
    accessed: dict | None = None,
    k: int | None = None,
    text_ceiling: float | None = None,
    period: Period | None = None,
) -> list[Hit]:
    """The candidates as hits, best first (the first k when given); `period`: the one the query names."""
    conf = settings.search
    when_weight = conf.when_weight if period is not None else 0
    half_life = parse_duration(conf.recency_half_life)
    recency_weight, importance_weight = conf.recency_weight, conf.importance_weight
    if when_weight:
        # a query that names a period asks about then: what is recent now is not nearer its answer (a day's
        # deploy failure against last week's, told in the same words: tests/bench/dated.py)
        recency_weight = 0.0
    relevance_of = relevances(settings, vector_rows, text_rows, scored, context, text_ceiling)
    ranked = []
    accessed = accessed or {}
    for episode_id in candidates:
        row = scored.get(episode_id)
        if row is None or episode_id not in relevance_of:
            continue  # deleted meanwhile, excluded, or (rrf) found by neither half
        anchor = accessed.get(episode_id) or row["created_at"]
        recency = 0.5 ** (max(0.0, (now - anchor).total_seconds()) / half_life)
        score = (
            relevance_of[episode_id]
            + recency_weight * recency
            + importance_weight * row["importance"] / 10
        )
        closeness = None
        if when_weight and period is not None:  # when_weight: 0 without a period
            closeness = period.closeness(row["created_at"], row.get("last_seen_at"))
            score += when_weight * closeness
        ranked.append((round(score, 6), episode_id, recency, closeness))
    ranked.sort(key=lambda r: (-r[0], -r[1]))
    by_vector = _ranks(vector_rows or [])
    by_text = _ranks(text_rows or [])
    hits = []
    for score, episode_id, recency, closeness in ranked[:k]:
        row = scored[episode_id]
        v, t = by_vector.get(episode_id), by_text.get(episode_id)
        hits.append(
            Hit(
                id=episode_id,
                score=score,
                agent=row["agent"],
                kind=row["kind"],
                source=row["source"],
                importance=row["importance"],
                created_at=row["created_at"],
                content=row["content"],
                relevance=round(relevance_of[episode_id], 6),
                recency=round(recency, 6),
                importance_term=row["importance"] / 10,
                vector_rank=v[0] if v else None,
                text_rank=t[0] if t else None,
                distance=None if row["distance"] is None else round(float(row["distance"]), 6),
                text_score=round(float(row["text_score"]), 6) if row["text_score"] else None,
                chunk=v[1]["content"] if v else None,
                closeness=None if closeness is None else round(closeness, 6),
                **_seen(row),
            )
        )
    return hits


def _seen(row: dict) -> dict[str, Any]:
    """A first's repeats and the span it was seen in (first_seen: its own time), for a Hit."""
    repeats = row.get("repeats") or 0
    if not repeats:
        return {}
    return {
        "repeats": repeats,
        "first_seen": row["created_at"],
        "last_seen": row.get("last_seen_at") or row["created_at"],
    }
