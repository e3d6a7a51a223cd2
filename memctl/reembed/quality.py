"""How well a model finds what it should: recall@k and MRR of known-item queries, the gate on a model switch.

A known item is a query and the episodes it should find. They come from the operator (`reembed compare
--queries FILE`: JSONL lines {"query": ..., "episodes": [ids]} or {"query": ..., "texts": [...]}, a text
naming the episodes that hold it) or, without a file, from the memory itself:

    a sample of episodes (the same sample on every run: ordered by a hash of their id), each asked for by
    one of its sentences (the longest that leaves three words or more; a one-sentence episode by its first
    half of words). The sentence is left out of what is embedded: the episode's own chunks hold it word for
    word, so they are set aside, and the rest of its text, embedded by each model as a document (with its
    instruction), stands in for the episode among every other episode's stored vectors.

So an episode is found by what the question means, never by matching the question's own words
against the text they came from; a model that carries no meaning finds about nothing.

Every query is ranked vector-only in each model's own table, through the search statement's nearest
chunks (an episode counts once, by its best chunk): recall@k is the share of the wanted episodes in
the top k, averaged over queries; MRR the mean of 1/rank of the first one found (0 past k).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from memctl.files import jsonl
from memctl.embedding import models
from memctl.embedding.protocol import as_documents, as_queries
from memctl.errors import BadValue, InvalidInput

if TYPE_CHECKING:
    from memctl.db.memory import Memory

TOLERANCE = 0.02  # recall@k the new model may lose to the active one before `switch` refuses it
# recall@k the active model must reach itself on known items built from the memory for them to judge a switch: on
# log-like memory (templated lines) a part of a line tells it from none of the others, every model finds about
# nothing, and a model that carries no meaning would pass. Below it the gate cannot judge and says so.
JUDGE_FLOOR = 0.2
SAMPLE = 100
MAX_QUERY_CHARS = 200
MIN_PART_WORDS = 3
MAX_TEXT_MATCHES = 100
FIELDS = ("query", "episodes", "texts")
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
SAMPLE_EPISODES = "SELECT id, content FROM episodes ORDER BY md5(id::text) LIMIT %s"
HOLDING = "SELECT id FROM episodes WHERE strpos(content, %s) > 0 ORDER BY id LIMIT %s"


@dataclass
class KnownItem:
    query: str
    wanted: set[int]
    held_out: str | None = (
        None  # memory-built: the rest of the episode's text, embedded in its place
    )
    scores: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the set


def split(text: str) -> tuple[str, str] | None:
    """(query, the rest) of an episode's text, or None when it is too short to split (see the module)."""
    sentences = [s.strip() for s in SENTENCE.split(text.strip()) if s.strip()]
    if len(sentences) >= 2:
        best = max(range(len(sentences)), key=lambda i: (len(sentences[i]), -i))
        rest = " ".join(s for i, s in enumerate(sentences) if i != best)
        if len(sentences[best].split()) >= MIN_PART_WORDS and len(rest.split()) >= MIN_PART_WORDS:
            return sentences[best][:MAX_QUERY_CHARS], rest
    words = text.split()
    if len(words) < 2 * MIN_PART_WORDS:
        return None
    middle = len(words) // 2
    return " ".join(words[:middle])[:MAX_QUERY_CHARS], " ".join(words[middle:])


def from_memory(conn: Memory, sample: int = SAMPLE) -> list[KnownItem]:
    items: list[KnownItem] = []
    for row in conn.execute(SAMPLE_EPISODES, (sample * 2,)).fetchall():
        parts = split(row["content"])
        if parts is not None and len(items) < sample:
            items.append(KnownItem(parts[0], {row["id"]}, parts[1]))
    return items


def read_file(conn: Memory, path: str | Path) -> tuple[list[KnownItem], list[str]]:
    """(known items, queries without expectations) from a file; a bad line fails naming it (exit 1 or 2)."""
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}") from None
    items, plain = [], []
    for number, raw in enumerate(lines, start=1):
        try:
            stripped = raw.strip().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise jsonl.LineError(number, f"not valid UTF-8 (byte {exc.start})") from None
        if stripped and not stripped.startswith("{"):  # a plain query: compared by overlap only
            plain.append(stripped)
            continue
        try:
            record = jsonl.parse(stripped, fields=FIELDS, required=("query",))
            if record is None:
                continue
            item = _item(conn, record)
        except (InvalidInput, BadValue) as exc:
            raise jsonl.at(number, exc) from None
        (items.append(item) if item.wanted else plain.append(item.query))
    return items, plain


def _item(conn: Memory, record: dict) -> KnownItem:
    query, ids, texts = record["query"], record.get("episodes", []), record.get("texts", [])
    if not isinstance(query, str) or not query.strip():
        raise BadValue("query: expected a non-empty string")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise BadValue("episodes: expected a list of episode ids")
    if not isinstance(texts, list) or not all(isinstance(t, str) and t.strip() for t in texts):
        raise BadValue("texts: expected a list of non-empty strings")
    wanted = set(ids)
    for text in texts:
        holding = [r["id"] for r in conn.execute(HOLDING, (text, MAX_TEXT_MATCHES)).fetchall()]
        if not holding:
            raise BadValue(f"texts: no episode holds {text[:60]!r}")
        wanted.update(holding)
    return KnownItem(query.strip(), wanted)


# -------------------------------------------------------------- measuring


def _embed(texts: list[str], embed, batch: int = 32) -> list:
    vectors = []
    for i in range(0, len(texts), batch):
        vectors.extend(embed(texts[i : i + batch]))
    return vectors


def _ranked(
    conn: Memory, model: models.Model, vector, k: int, skip: set[int]
) -> list[tuple[int, float]]:
    """(episode id, similarity) of the k nearest episodes, by best chunk, leaving out `skip`."""
    from memctl.reading.query import Query
    from memctl.reading.scan import vector_half

    best: dict[int, float] = {}
    for row in vector_half(conn, model, vector, Query(text="compare", k=k), 4 * k + 16):
        if row["episode_id"] not in skip and row["episode_id"] not in best:
            best[row["episode_id"]] = 1.0 - float(row["distance"])
    return list(best.items())[:k]


def measure(conn: Memory, model: models.Model, items: list[KnownItem], k: int) -> dict:
    """recall@k and MRR of one model over the known items."""
    settings = conn.settings
    from memctl.embedding.embedders import make_embedder

    embedder = make_embedder(settings, registered=model)
    queries = _embed(
        [i.query for i in items], lambda t: embedder.embed(as_queries(embedder, t)).vectors
    )
    held = [i for i in items if i.held_out is not None]
    documents = dict(
        zip(
            map(id, held),
            _embed(
                [i.held_out or "" for i in held],  # held: not None
                lambda t: embedder.embed(as_documents(embedder, t)).vectors,
            ),
        )
    )
    recall = reciprocal = 0.0
    for item, vector in zip(items, queries):
        if (
            item.held_out is not None
        ):  # its own chunks set aside, the rest of its text in their place
            target = sum(a * b for a, b in zip(vector, documents[id(item)]))
            ahead = sum(
                1
                for _, similarity in _ranked(conn, model, vector, k, item.wanted)
                if similarity > target
            )
            rank = ahead + 1 if ahead < k else None
            found = 1.0 if rank else 0.0
        else:
            top = [episode for episode, _ in _ranked(conn, model, vector, k, set())]
            found = len(item.wanted & set(top)) / len(item.wanted)
            rank = next((i + 1 for i, episode in enumerate(top) if episode in item.wanted), None)
        recall += found
        reciprocal += 1.0 / rank if rank else 0.0
    n = max(len(items), 1)
    return {
        "model": model.label,
        f"recall@{k}": round(recall / n, 3),
        "mrr": round(reciprocal / n, 3),
        "queries": len(items),
    }


def side_by_side(
    conn: Memory,
    active: models.Model,
    new: models.Model,
    items: list[KnownItem],
    *,
    k: int,
    source: str,
    tolerance: float = TOLERANCE,
) -> dict:
    """Both models' figures on the same known items, and whether the new one finds less beyond `tolerance`."""
    if not items:
        return {
            "source": source,
            "k": k,
            "queries": 0,
            "active": None,
            "new": None,
            "tolerance": tolerance,
            "worse": False,
            "note": "nothing to measure: no episode long enough to ask for by a part of it",
        }
    old, fresh = measure(conn, active, items, k), measure(conn, new, items, k)
    key = f"recall@{k}"
    worse = fresh[key] < old[key] - tolerance
    judged = source != "memory" or old[key] >= JUDGE_FLOOR
    note = (
        describe(source, len(items))
        if judged
        else (
            f"cannot judge: the active model itself finds {key} {old[key]} of the known items built from the memory "
            f"(under {JUDGE_FLOOR}): its texts (log-like, templated?) are told apart by no part of them, so a model "
            "that carries no meaning would pass; give known items with --queries FILE (docs/size-and-model-changes.md)"
        )
    )
    return {
        "source": source,
        "k": k,
        "queries": len(items),
        "active": old,
        "new": fresh,
        "tolerance": tolerance,
        "worse": worse,
        "judged": judged,
        "note": note,
    }


def describe(source: str, n: int) -> str:
    if source == "memory":
        return (
            f"known items built from the memory itself: {n} episodes, each asked for by one of its "
            "sentences, with that sentence left out of what is embedded (its own chunks set aside, the "
            "rest of its text embedded in their place)"
        )
    return f"known items from {source}: {n} queries"


def figures(result: dict) -> str:
    """Both models' figures on one line, for messages and the job log's reader."""
    if result["active"] is None or not result.get("judged", True):
        return result["note"]
    key = f"recall@{result['k']}"
    return (
        f"{key} {result['active'][key]} and MRR {result['active']['mrr']} for the active "
        f"{result['active']['model']}; {key} {result['new'][key]} and MRR {result['new']['mrr']} for the new "
        f"{result['new']['model']} ({result['queries']} queries, {result['source']})"
    )
