"""Recall's episodes: the search for many observations at once, near-duplicates collapsed, and the budget
spent on hits and their windows (memctl.recall.window).

find_episodes embeds every observation of a batch in sub-batches and runs their searches as one
search_batch (shared connection, pipelined statements, shared transactions: memctl.reading.search);
`recall` of one observation is a batch of one.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from memctl.config import Settings
from memctl.embedding import models
from memctl.errors import EmbedInputRejected
from memctl.reading import search
from memctl.recall import window
from memctl.recall.form import (
    Item,
    Template,
    age,
    entry_line,
    folded,
    sourced,
    window_header,
    window_lines,
)
from memctl.reading.fusion import Hit
from memctl.reading.query import Query

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# Cosine distance within which an episode counts as related without sharing a
# word. Models spread their distances differently: unrelated texts sit near 0.9
# for all-minilm (measured), near 0.5-0.6 for nomic-embed-text.
MAX_DISTANCE = {"all-minilm": 0.7, "nomic-embed-text": 0.45}
FALLBACK_MAX_DISTANCE = 0.6
CLIPPED_QUERY_CHARS = (
    1000  # an observation the embedder rejects as too long is embedded from its start
)


def max_distance(settings: Settings, model: models.Model | None) -> float:
    configured = settings.recall.max_distance
    if configured is not None:
        return float(configured)
    name = model.model.removesuffix(":latest") if model else ""
    return MAX_DISTANCE.get(name, FALLBACK_MAX_DISTANCE)


def _query_vector(
    settings: Settings, model: models.Model, embedder, text: str, rejected: bool = False
):
    """(vector or None, warning); an observation too long for the model is embedded from its start
    (`rejected`: the whole one was refused already)."""
    try:
        if rejected:
            raise EmbedInputRejected("refused whole")
        vectors, warning = search.embed_queries(settings, model, [text], embedder)
    except EmbedInputRejected:
        try:
            vectors, warning = search.embed_queries(
                settings, model, [text[:CLIPPED_QUERY_CHARS]], embedder
            )
        except EmbedInputRejected as exc:
            return None, f"observation too long to embed, text search only: {exc}"
    return (vectors[0] if vectors else None), warning


def _query_vectors(settings: Settings, model: models.Model, embedder, texts: list[str]):
    """(a vector or None per text, warning): in sub-batches; one at a time when a text is rejected as too long."""
    try:
        found = search.embed_query_texts(settings, model, texts, embedder)
        return found.vectors, found.warning
    except EmbedInputRejected:
        pairs = [
            _query_vector(settings, model, embedder, t, rejected=len(texts) == 1) for t in texts
        ]
        return [v for v, _ in pairs], "; ".join(dict.fromkeys(w for _, w in pairs if w)) or None


@dataclass
class Episodes:
    outcome: search.Outcome
    max_distance: float  # cosine distance that counts as related (0 when no vector half ran)
    count: Callable[[str], int]  # the token counter that goes with the active model
    counter: str


def find_episodes(conn: Memory, requests: list) -> list[Episodes]:
    """The hybrid search of each request's observation, all in one search batch, each embedded once."""
    settings = conn.settings
    from memctl.embedding.protocol import estimate_tokens

    model = models.active(conn)
    vectors, warning, embedder = [None] * len(requests), None, None
    if model is None:
        warning = "no embedding model registered yet (run memctl embed): text search only"
    elif requests:
        mismatch = search.configured_warning(settings, model)
        embedder = search.query_embedder(settings, model)
        vectors, warning = _query_vectors(
            settings, model, embedder, [r.observation for r in requests]
        )
        warning = "; ".join(w for w in (mismatch, warning) if w) or None
    queries = [
        Query(
            r.observation,
            k=min(1000, r.k * 3),
            agent=r.agent,
            mode="hybrid" if v is not None else "text",
            until=None if r.as_of is None else r.as_of.isoformat(),
        )  # created before it (exclusive)
        for r, v in zip(requests, vectors)
    ]
    outcomes = search.search_batch(conn, queries, vectors=vectors) if queries else []
    found = []
    for outcome, vector in zip(outcomes, vectors):
        outcome.warning = warning
        limit = max_distance(settings, model) if vector is not None else 0.0
        if embedder is not None and embedder.name == "local" and vector is not None:
            found.append(Episodes(outcome, limit, embedder.count_tokens, "all-minilm tokenizer"))
        else:
            found.append(
                Episodes(outcome, limit, estimate_tokens, "estimate: ceil(characters / 4)")
            )
    return found


_WORD = re.compile(r"\w+")


def _normal(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def collapse(hits: list[Hit], threshold: float) -> list[tuple[Hit, list[int]]]:
    """Keep the best of each group of near-identical episodes: (hit, ids of the ones folded into it).

    Near-identical: equal text after lowercasing and dropping punctuation, or word sets with Jaccard
    similarity >= threshold. Walking the hits best first, each joins the first kept one close to it.
    Only kept sets that share a word of its prefix are compared with a hit's set (prefix filtering: two
    sets that close share one of the first |A| - ceil(t|A|) + 1 words of each, in one fixed order), and
    of those only the ones of a size that can be that close. The order puts each set's rarest words in
    these hits first: a prefix of common words ("the", "a", "i") would make every kept set a candidate
    (300 hits, 45,000 comparisons); rare words make the candidates the few sets that really overlap.
    """
    ranked = sorted(hits, key=lambda h: (-h.score, -h.id))
    normals = [_normal(h.content) for h in ranked]
    sets = [set(n.split()) for n in normals]
    frequency: dict[str, int] = {}
    for words in sets:
        for word in words:
            frequency[word] = frequency.get(word, 0) + 1
    order = {w: i for i, w in enumerate(sorted(frequency, key=lambda w: (frequency[w], w)))}
    kept: list[tuple[Hit, list[int], set[str]]] = []
    by_text: dict[str, int] = {}
    by_word: dict[
        str, list[tuple[int, int]]
    ] = {}  # a prefix word -> (kept set, its position there)
    sizes: list[int] = []
    for hit, normal, words in zip(ranked, normals, sets):
        prefix = _prefix(words, threshold, order)
        match = by_text.get(
            normal
        )  # the first kept one that is close wins, as it would walking them all
        for index in _candidates(
            words, prefix, threshold, by_word, sizes, len(kept) if match is None else match
        ):
            if match is not None and index >= match:
                break
            if _close(words, kept[index][2], threshold):
                match = index
                break
        if match is not None:
            kept[match][1].append(hit.id)
            continue
        by_text[normal] = len(kept)
        for position, word in enumerate(prefix):
            by_word.setdefault(word, []).append((len(kept), position))
        kept.append((hit, [], words))
        sizes.append(len(words))
    return [(hit, duplicates) for hit, duplicates, _ in kept]


def _prefix(words: set[str], threshold: float, order: dict[str, int]) -> list[str]:
    """A set's first words in `order` (its rarest: fewest hits holding them, then alphabetical), as many as
    two sets that close must share one of."""
    size = len(words)
    length = size - math.ceil(threshold * size - 1e-9) + 1
    if length <= 0:
        return []
    return sorted(words, key=order.__getitem__)[:length]


def _candidates(
    words: set[str],
    prefix: list[str],
    threshold: float,
    by_word: dict[str, list[tuple[int, int]]],
    sizes: list[int],
    count: int,
) -> list[int]:
    """Kept sets that may lie within threshold of `words`, best first.

    A kept set sharing prefix words with `words` is dropped once the words it still could share (positional
    filtering: those after the shared one in both, in the same order) leave it short of the overlap that
    Jaccard >= t needs, t / (1 + t) * (|A| + |B|).
    """
    if threshold <= 0:
        return list(range(count))  # every set is that close
    if not words:
        return []  # only the same (empty) text is
    size, need = len(words), threshold / (1 + threshold)
    overlap: dict[
        int, int
    ] = {}  # kept set -> prefix words shared so far; -1 once it cannot be close
    for position, word in enumerate(prefix):
        for index, at in by_word.get(word, ()):
            seen = overlap.get(index, 0)
            if seen < 0:
                continue
            other = sizes[index]
            bound = seen + min(
                size - position, other - at
            )  # 1 for this word, then what follows it in both
            overlap[index] = seen + 1 if bound >= need * (size + other) - 1e-9 else -1
    return sorted(i for i, seen in overlap.items() if seen > 0)


def _close(words: set[str], other: set[str], threshold: float) -> bool:
    """Jaccard similarity >= threshold; sizes too far apart are not (|B| >= t|A| when B is the smaller)."""
    small, large = sorted((len(words), len(other)))
    if small < threshold * large - 1e-9:
        return False
    shared = len(words & other)
    union = len(words) + len(other) - shared
    return bool(union) and shared / union >= threshold


def related(hit: Hit, limit: float) -> bool:
    return hit.text_rank is not None or (hit.distance is not None and hit.distance <= limit)


Sightings = tuple[int, datetime.datetime, datetime.datetime]  # repeats, first seen, last seen


def sightings(conn: Memory, hit: Hit, as_of: datetime.datetime | None) -> Sightings:
    """(repeats, first seen, last seen) of a hit; with as_of, of the sightings before it only."""
    if not hit.repeats:
        return 0, hit.created_at, hit.created_at
    assert (
        hit.first_seen is not None and hit.last_seen is not None
    )  # a first standing for repeats: its span
    if as_of is None or hit.last_seen < as_of:
        return hit.repeats, hit.first_seen, hit.last_seen
    from memctl.records import episodes

    seen = [
        r["created_at"]
        for r in episodes.repeats_of(conn, hit.agent, hit.id, limit=hit.repeats + 1)
        if r["created_at"] < as_of
    ]
    return max(0, len(seen) - 1), hit.created_at, max(seen, default=hit.created_at)


def entry(
    conn: Memory, hit: Hit, duplicates: list[int], as_of: datetime.datetime | None
) -> window.Entry:
    """A hit as the first entry of its window, with what its line shows (repeats, folded near-duplicates)."""
    return window.Entry(
        hit.id,
        hit.agent,
        hit.kind,
        hit.source,
        hit.importance,
        hit.created_at,
        hit.content,
        match=True,
        score=hit.score,
        extra={"duplicates": duplicates, "seen": sightings(conn, hit, as_of)},
    )


def _hit_data(e: window.Entry, now: datetime.datetime) -> dict:
    repeats, first, last = e.extra["seen"]
    data = {
        "id": e.id,
        "agent": e.agent,
        "episode_kind": e.kind,
        "source": e.source,
        "importance": e.importance,
        "created_at": e.created_at,
        "age": age(e.created_at, now),
        "content": e.content,
        "duplicates": e.extra["duplicates"],
    }
    if repeats:
        data.update(repeats=repeats, first_seen=first, last_seen=last)
    return data


def episode_item(e: window.Entry, form: Template, now: datetime.datetime) -> Item:
    """A hit alone: its episode line."""
    repeats, first, last = e.extra["seen"]
    data = _hit_data(e, now)
    values = {
        "id": e.id,
        "agent": e.agent,
        "kind": e.kind,
        "source": e.source,
        "sourced": sourced(e.source),
        "importance": e.importance,
        "created_at": e.created_at.isoformat(timespec="seconds"),
        "age": data["age"],
        "content": e.content,
        "score": e.score,
        "repeats": repeats,
        "first_seen": age(first, now),
        "last_seen": age(last, now),
        "folded": folded(e.extra["duplicates"]),
        "seen": f" (seen {repeats + 1} times, first {age(first, now)}, last {age(last, now)})"
        if repeats
        else "",
    }
    assert e.score is not None  # a hit's
    return Item("episode", e.score, form.line("episode", values), data=data)


def window_item(block: window.Block, form: Template, now: datetime.datetime) -> Item:
    """Hits with their neighbours: one item, its episodes in time order, the matches marked."""
    if len(block.entries) == 1:
        return episode_item(block.entries[0], form, now)
    first = block.entries[0]
    episodes = []
    for e in block.entries:
        if e.match:
            episodes.append({**_hit_data(e, now), "match": True, "score": e.score})
        else:
            episodes.append(
                {
                    "id": e.id,
                    "agent": e.agent,
                    "episode_kind": e.kind,
                    "source": e.source,
                    "importance": e.importance,
                    "created_at": e.created_at,
                    "age": age(e.created_at, now),
                    "content": e.content,
                    "match": False,
                }
            )
    data = {
        "agent": first.agent,
        "source": first.source,
        "ids": [e.id for e in block.entries],
        "matches": [e.id for e in block.matches],
        "episodes": episodes,
    }
    score = max(e.score for e in block.matches if e.score is not None)  # the hits': each has one
    return Item("window", score, "\n".join(window_lines(form, block.entries, now)), data=data)


class Spend:
    """Hits and their neighbours into blocks, in window.plan's order, while the budget holds.

    A hit that does not fit ends the hits (and what comes after the episodes); a neighbour that
    does not fit is skipped, and so is every neighbour beyond it (a window has no holes).
    """

    def __init__(self, form: Template, count: Callable[[str], int], now: datetime.datetime):
        self.form, self.count, self.now = form, count, now
        self._lines: dict[str, int] = {}  # a window header's tokens
        self._costs: dict[tuple, int] = {}  # (entry key, alone) -> its line's tokens

    def cost(self, block: window.Block) -> int:
        """Its tokens: a hit alone its episode line's; a window its header's and each line's (each counted once)."""
        if len(block.entries) == 1:
            return self._line(
                block.entries[0], lambda e: episode_item(e, self.form, self.now).line, alone=True
            )
        first = block.first
        header = window_header(self.form, first, len(block.entries), self.now)
        cost = self._lines.get(header)
        if cost is None:
            cost = self._lines[header] = self.count(header + "\n")
        return cost + sum(self._line(e, entry_line) for e in block.entries)

    def heading(self, e: window.Entry) -> tuple | None:
        """What a block's first line says of a hit (agent, source, age); None for a repeat, whose line says more."""
        return None if e.extra["seen"][0] else (e.agent, e.source, age(e.created_at, self.now))

    def _line(self, e: window.Entry, render: Callable, alone: bool = False) -> int:
        key = (e.key, alone)
        if key not in self._costs:
            self._costs[key] = self.count(render(e) + "\n")
        return self._costs[key]

    def run(
        self, hits: list[window.Entry], found: window.Windows, rule: window.Rule, room: int
    ) -> tuple[list[window.Block], int, bool]:
        """(blocks, tokens used, whether every hit fitted)."""
        linked = window.links(hits, found)
        if rule.group:
            linked = window.grouped(hits, linked, self.heading)
        blocks = window.Blocks(linked, self.cost)
        used, stopped = 0, False
        folded_ids = {(h.agent, d) for h in hits for d in h.extra.get("duplicates") or []}
        for unit in window.plan(hits, found, rule):
            e = unit.entry
            if blocks.has(e) or (stopped and e.match) or (not e.match and e.key in folded_ids):
                continue
            new, joined, extra = blocks.trial(e, unit.rank)
            if not e.match and not joined:
                continue  # its way to its hit is not in: no window with a hole
            if used + extra > room:
                if e.match:
                    stopped = True
                continue
            blocks.add(new, joined)
            used += extra
        return blocks.ordered(), used, not stopped
