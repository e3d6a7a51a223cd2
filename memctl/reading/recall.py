"""Recall: the few memories worth putting in a prompt now, within a token budget.

`recall(conn, settings, Request(observation))` gathers, in this order:

1. Facts of the namespace whose key or value shares a word with the observation.
   Words are what PostgreSQL's english full-text configuration makes of the
   text after `. _ - / :` become spaces (stemmed, stopwords dropped), one-letter
   words ignored. Score 1.0 when the key appears verbatim in the observation,
   else p / (p + 2) with p = 2 x key words matched + value words matched.
   Facts are the truth now and are labelled "current fact".
2. Episodes from the default hybrid search (memctl.reading.search: relevance, recency,
   importance); score = the search score. An episode counts only if it shares
   a word with the observation (the text half found it) or its vector lies
   within `max_distance` (cosine) of the observation's; so with nothing
   relevant, nothing comes back. Near-duplicates collapse onto the best-scored
   one: equal text after lowercasing and dropping punctuation, or word sets with
   Jaccard similarity >= `dedupe` (0.9).
3. Runbooks whose name, title or description has a word of the observation
   (3 letters or more, common English words dropped; Repository.find);
   score p / (p + 2) with find's points (2 per title word, 1 per description word).
   No runbook repository configured: no runbooks, no complaint.

With `as_of` (Request.as_of), the block is the one the agent would have had then: the facts valid
at that time (memctl.records.facts.VALID_AT, corrections recorded since included), episodes
created before it, ages counted back from it; it counts no access. Runbooks are as they are now.

At most k items of each kind, none scoring below min_score. They are then taken
in that order until the next one would overflow max_tokens; an item is never
cut, and the items after the first that does not fit are left out.

Tokens are counted with the active model's tokenizer when the embedder runs in
process (local all-minilm, WordPiece, already loaded to embed the observation),
else estimated as ceil(characters / 4) (memctl.embedding.embedders.estimate_tokens). Each
line is counted with its newline and the header and footer on their own, so the
sum, which the budget caps, is never below the count of the whole block.

The text block comes from [recall] in the config (str.format syntax):
  template      the block, with {items} where the item lines go, one per line
                (default "Relevant memory (facts are current; episodes are past events):\\n{items}\\n")
  fact_line     fields: key value source sourced namespace version valid_from age score
  episode_line  fields: id agent kind source sourced importance created_at age content score
                repeats seen first_seen last_seen
  runbook_line  fields: name title score
`sourced` is ", source: X", or "" for an item without a source; `age` reads
"just now", "5 minutes ago", "3 days ago", "2 months ago" (a fact's: since it became true).
An episode repeated (docs/repeats.md) comes once, as its first: `repeats` counts its repeats (0: none),
`seen` is " (seen N times, first 3 days ago, last 5 minutes ago)" for it and "" otherwise (the default
line ends with it; a line without {seen} shows no count), first_seen and last_seen the ages of both ends.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from memctl.config import Settings
from memctl.embedding import models
from memctl.errors import ConfigError, EmbedInputRejected, MemctlError, UsageError
from memctl.reading import search
from memctl.reading.fusion import Hit
from memctl.reading.query import Query

DEFAULT_TEMPLATE = "Relevant memory (facts are current; episodes are past events):\n{items}\n"
DEFAULT_LINES = {
    "fact": "- [fact] {key} = {value} (current fact{sourced})",
    "episode": "- [episode, {age}{sourced}] {content}{seen}",
    "runbook": "- [runbook] {name}: {title}",
}
FIELDS = {
    "fact": ("key", "value", "source", "sourced", "namespace", "version", "valid_from", "age", "score"),
    "episode": ("id", "agent", "kind", "source", "sourced", "importance", "created_at", "age", "content", "score",
                "repeats", "seen", "first_seen", "last_seen"),
    "runbook": ("name", "title", "score"),
}
# to check a line format's fields and specs
SAMPLE = {"score": 0.5, "id": 1, "importance": 5, "version": 1, "repeats": 0}
DEFAULTS = {"max_tokens": 1000, "min_score": 0.0, "dedupe": 0.9, "max_distance": None}
# Cosine distance within which an episode counts as related without sharing a
# word. Models spread their distances differently: unrelated texts sit near 0.9
# for all-minilm (measured), near 0.5-0.6 for nomic-embed-text.
MAX_DISTANCE = {"all-minilm": 0.7, "nomic-embed-text": 0.45}
FALLBACK_MAX_DISTANCE = 0.6
CLIPPED_QUERY_CHARS = 1000  # an observation the embedder rejects as too long is embedded from its start
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers herself him himself his how i if in into is it its itself just let me more most my myself no nor not now of
off on once only or other our ours ourselves out over own same she should so some such than that the their
theirs them themselves then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours yourself yourselves get got please need
needs want wants like make made use used using can't don't isn't it's i'm
""".split())


@dataclass
class Request:
    observation: str
    agent: str | None = None
    namespace: str = "default"
    shared: tuple[str, ...] = ()  # namespaces whose facts are read too (an agent's MCP server: read-only ones)
    k: int = 5
    max_tokens: int | None = None  # None: [recall] max_tokens
    min_score: float | None = None  # None: [recall] min_score
    repo: str | None = None  # runbook directory; None: MEMCTL_RUNBOOKS / `runbooks` in the config
    track: bool = True  # count the episodes returned as accessed
    as_of: datetime.datetime | None = None  # the memory the agent would have had at this time (never tracked)


@dataclass
class Item:
    kind: str  # fact | episode | runbook
    score: float
    line: str
    tokens: int = 0
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "score": self.score, "tokens": self.tokens, "text": self.line, **self.data}


@dataclass
class Recall:
    items: list[Item]
    header: str
    footer: str
    tokens: int  # the whole block, header included; 0 when there are no items
    max_tokens: int
    mode: str  # the episode search that ran: hybrid, or text when the embedder was unavailable
    token_counter: str
    left_out: int = 0  # items that passed the filters but did not fit the budget
    warnings: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The block for the prompt; empty when nothing is relevant."""
        if not self.items:
            return ""
        return self.header + "\n".join(item.line for item in self.items) + self.footer

    def to_dict(self) -> dict[str, Any]:
        return {"items": [item.to_dict() for item in self.items], "tokens": self.tokens,
                "max_tokens": self.max_tokens, "left_out": self.left_out, "mode": self.mode,
                "token_counter": self.token_counter}


def setting(settings: Settings, key: str) -> Any:
    """A [recall] value, or this module's default when the config schema does not know the key."""
    value = settings.get("recall", key)
    return DEFAULTS.get(key) if value is None else value


# ---------------------------------------------------------------------------
# The template


@dataclass
class Template:
    header: str
    footer: str
    lines: dict[str, str]

    def line(self, kind: str, values: dict[str, Any]) -> str:
        return " ".join(self.lines[kind].format(**values).split())  # one line per item, however the text ran


_ITEMS = "\x00items\x00"


def template(settings: Settings) -> Template:
    """The configured block and line formats, checked now so a typo fails loudly, not per item."""
    block = setting(settings, "template") or DEFAULT_TEMPLATE
    try:
        rendered = block.format(items=_ITEMS)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"[recall] template: {exc!r} (the only field is {{items}}; write {{{{ for a brace)") from None
    if rendered.count(_ITEMS) != 1:
        raise ConfigError("[recall] template: must contain {items} exactly once")
    header, footer = rendered.split(_ITEMS)
    lines = {}
    for kind, default in DEFAULT_LINES.items():
        text = setting(settings, f"{kind}_line") or default
        try:
            text.format(**{name: SAMPLE.get(name, "x") for name in FIELDS[kind]})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"[recall] {kind}_line: {exc!r}; fields: {', '.join(FIELDS[kind])}") from None
        lines[kind] = text
    return Template(header, footer, lines)


# ---------------------------------------------------------------------------
# Pieces


def age(then: datetime.datetime, now: datetime.datetime) -> str:
    """'just now', '1 minute ago', '3 days ago', '2 months ago', '4 years ago'."""
    seconds = (now - then).total_seconds()
    for unit, size in (("year", 365 * 86400), ("month", 30 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'' if n == 1 else 's'} ago"
    return "just now"


_WORD = re.compile(r"\w+")


def observation_words(text: str) -> list[str]:
    """Lowercased words of 3 letters or more, common English words dropped, first occurrence order."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) >= 3 and word not in STOPWORDS:
            seen.setdefault(word)
    return list(seen)


def _sourced(source: str | None) -> str:
    return f", source: {source}" if source else ""


def _saturate(points: float) -> float:
    return round(points / (points + 2), 6)


# ---------------------------------------------------------------------------
# Facts

SPLIT_CHARS = ("._-/:", "     ")
FACT_MATCHES = """
WITH obs AS (
    SELECT array(SELECT w
                 FROM unnest(tsvector_to_array(to_tsvector('english', translate(%(text)s, %(from)s, %(to)s)))) w
                 WHERE length(w) > 1) AS words
), f AS (
    SELECT namespace, key, value, source, version, updated_at, valid_from,
           tsvector_to_array(to_tsvector('english', translate(key, %(from)s, %(to)s))) AS key_words,
           tsvector_to_array(to_tsvector('english', translate(left(value, 100000), %(from)s, %(to)s))) AS value_words
    FROM {facts} AS known WHERE namespace = ANY(%(namespaces)s)
)
SELECT f.namespace, f.key, f.value, f.source, f.version, f.updated_at, f.valid_from,
       (SELECT count(*) FROM unnest(f.key_words) w WHERE w = ANY(obs.words)) AS key_hits,
       (SELECT count(*) FROM unnest(f.value_words) w WHERE w = ANY(obs.words) AND w <> ALL(f.key_words)) AS value_hits
FROM f, obs
WHERE (f.key_words || f.value_words) && obs.words
"""


def _verbatim(key: str, text: str) -> bool:
    return re.search(r"(?<![\w.])" + re.escape(key.lower()) + r"(?!\w)", text) is not None


def match_facts(conn, observation: str, namespace: str, also: tuple[str, ...] = (),
                as_of: datetime.datetime | None = None) -> list[dict]:
    """Facts of the namespace (and of the namespaces `also` names) sharing a word with the observation,
    best first, each with its `score`; the current ones, or with `as_of` those valid then."""
    from psycopg import sql

    from memctl.records import facts

    params = {"text": observation, "namespaces": [namespace, *also], "from": SPLIT_CHARS[0],
              "to": SPLIT_CHARS[1], "at": as_of, "key": None, "prefix": None}
    known = sql.Identifier("facts") if as_of is None else sql.SQL("({})").format(sql.SQL(facts.VALID_AT))
    lowered = observation.lower()
    found = []
    for row in conn.execute(sql.SQL(FACT_MATCHES).format(facts=known), params, prepare=False):
        verbatim = _verbatim(row["key"], lowered)
        score = 1.0 if verbatim else _saturate(2 * row["key_hits"] + row["value_hits"])
        found.append({**row, "score": score})
    return sorted(found, key=lambda r: (-r["score"], r["key"]))


def _fact_item(row: dict, form: Template, now: datetime.datetime) -> Item:
    value = " ".join(row["value"].split())
    data = {"namespace": row["namespace"], "key": row["key"], "value": row["value"], "source": row["source"],
            "version": row["version"], "updated_at": row["updated_at"], "valid_from": row["valid_from"]}
    line = form.line("fact", {**data, "value": value, "sourced": _sourced(row["source"]), "score": row["score"],
                              "valid_from": row["valid_from"].isoformat(timespec="seconds"),
                              "age": age(row["valid_from"], now)})
    return Item("fact", row["score"], line, data=data)


# ---------------------------------------------------------------------------
# Episodes


def max_distance(settings: Settings, model: models.Model | None) -> float:
    configured = setting(settings, "max_distance")
    if configured is not None:
        return float(configured)
    name = model.model.removesuffix(":latest") if model else ""
    return MAX_DISTANCE.get(name, FALLBACK_MAX_DISTANCE)


def _query_vector(settings: Settings, model: models.Model, embedder, text: str):
    """(vector or None, warning); an observation too long for the model is embedded from its start."""
    try:
        vectors, warning = search.embed_queries(settings, model, [text], embedder)
    except EmbedInputRejected:
        try:
            vectors, warning = search.embed_queries(settings, model, [text[:CLIPPED_QUERY_CHARS]], embedder)
        except EmbedInputRejected as exc:
            return None, f"observation too long to embed, text search only: {exc}"
    return (vectors[0] if vectors else None), warning


@dataclass
class Episodes:
    outcome: search.Outcome
    max_distance: float  # cosine distance that counts as related (0 when no vector half ran)
    count: Callable[[str], int]  # the token counter that goes with the active model
    counter: str


def find_episodes(conn, settings: Settings, request: Request) -> Episodes:
    """The hybrid search for the observation, on the vector it was embedded to once."""
    from memctl.embedding.embedders import estimate_tokens

    model = models.active(conn)
    vector, warning, embedder = None, None, None
    if model is None:
        warning = "no embedding model registered yet (run memctl embed): text search only"
    else:
        mismatch = search.configured_warning(settings, model)
        embedder = search.query_embedder(settings, model)
        vector, warning = _query_vector(settings, model, embedder, request.observation)
        warning = "; ".join(w for w in (mismatch, warning) if w) or None
    mode = "hybrid" if vector is not None else "text"
    until = None if request.as_of is None else request.as_of.isoformat()  # created before it (exclusive)
    query = Query(request.observation, k=min(1000, request.k * 3), agent=request.agent, mode=mode, until=until)
    outcome = search.search(conn, settings, query, vector=vector)
    outcome.warning = warning
    limit = max_distance(settings, model) if vector is not None else 0.0
    if embedder is not None and embedder.name == "local" and vector is not None:
        return Episodes(outcome, limit, embedder.count_tokens, "all-minilm tokenizer")
    return Episodes(outcome, limit, estimate_tokens, "estimate: ceil(characters / 4)")


def _normal(text: str) -> str:
    return " ".join(_WORD.findall(text.lower()))


def collapse(hits: list[Hit], threshold: float) -> list[tuple[Hit, list[int]]]:
    """Keep the best of each group of near-identical episodes: (hit, ids of the ones folded into it)."""
    kept: list[tuple[Hit, list[int], str, set[str]]] = []
    for hit in sorted(hits, key=lambda h: (-h.score, -h.id)):
        normal = _normal(hit.content)
        words = set(normal.split())
        for other, duplicates, other_normal, other_words in kept:
            union = len(words | other_words)
            if normal == other_normal or (union and len(words & other_words) / union >= threshold):
                duplicates.append(hit.id)
                break
        else:
            kept.append((hit, [], normal, words))
    return [(hit, duplicates) for hit, duplicates, _, _ in kept]


def _related(hit: Hit, limit: float) -> bool:
    return hit.text_rank is not None or (hit.distance is not None and hit.distance <= limit)


Sightings = tuple[int, datetime.datetime, datetime.datetime]  # repeats, first seen, last seen


def sightings(conn, hit: Hit, as_of: datetime.datetime | None) -> Sightings:
    """(repeats, first seen, last seen) of a hit; with as_of, of the sightings before it only."""
    if not hit.repeats:
        return 0, hit.created_at, hit.created_at
    if as_of is None or hit.last_seen < as_of:
        return hit.repeats, hit.first_seen, hit.last_seen
    from memctl.records import episodes

    seen = [r["created_at"] for r in episodes.repeats_of(conn, hit.agent, hit.id, limit=hit.repeats + 1)
            if r["created_at"] < as_of]
    return max(0, len(seen) - 1), hit.created_at, max(seen, default=hit.created_at)


def _episode_item(hit: Hit, duplicates: list[int], form: Template, now: datetime.datetime,
                  seen: Sightings) -> Item:
    repeats, first, last = seen
    data = {"id": hit.id, "agent": hit.agent, "episode_kind": hit.kind, "source": hit.source,
            "importance": hit.importance, "created_at": hit.created_at, "age": age(hit.created_at, now),
            "content": hit.content, "duplicates": duplicates}
    if repeats:
        data.update(repeats=repeats, first_seen=first, last_seen=last)
    values = {"id": hit.id, "agent": hit.agent, "kind": hit.kind, "source": hit.source,
              "sourced": _sourced(hit.source), "importance": hit.importance,
              "created_at": hit.created_at.isoformat(timespec="seconds"), "age": data["age"],
              "content": hit.content, "score": hit.score, "repeats": repeats, "first_seen": age(first, now),
              "last_seen": age(last, now),
              "seen": f" (seen {repeats + 1} times, first {age(first, now)}, last {age(last, now)})" if repeats else ""}
    return Item("episode", hit.score, form.line("episode", values), data=data)


# ---------------------------------------------------------------------------
# Runbooks


def find_runbooks(settings: Settings, request: Request) -> tuple[list[dict], str | None]:
    """Runbooks matching the observation's words, each with a 0..1 `score`; ([], warning) on a broken repo."""
    from memctl.records import runbooks

    if not (request.repo or settings.get("", "runbooks")):
        return [], None
    words = observation_words(request.observation)
    if not words:
        return [], None
    try:
        found = runbooks.open_repository(request.repo, settings).find(" ".join(words))
    except MemctlError as exc:
        return [], f"runbooks left out: {exc}"
    return [{**row, "points": row["score"], "score": _saturate(row["score"])} for row in found], None


def _runbook_item(row: dict, form: Template) -> Item:
    data = {"name": row["name"], "title": row["title"]}
    return Item("runbook", row["score"], form.line("runbook", {**data, "score": row["score"]}), data=data)


# ---------------------------------------------------------------------------
# Assembly


def check(request: Request, settings: Settings) -> tuple[int, float]:
    """(max_tokens, min_score) in effect; UsageError for a malformed request."""
    text = request.observation
    if not isinstance(text, str) or not text.strip():
        raise UsageError("the observation is empty")
    if "\x00" in text:
        raise UsageError("the observation contains a NUL character")
    if not 1 <= request.k <= 100:
        raise UsageError(f"k must be between 1 and 100, got {request.k}")
    max_tokens = request.max_tokens if request.max_tokens is not None else setting(settings, "max_tokens")
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {max_tokens}")
    min_score = request.min_score if request.min_score is not None else setting(settings, "min_score")
    return int(max_tokens), float(min_score)


def recall(conn, settings: Settings, request: Request) -> Recall:
    """Facts, then episodes, then runbooks, as many whole items as the budget holds."""
    max_tokens, min_score = check(request, settings)
    form = template(settings)
    now = request.as_of or datetime.datetime.now(datetime.timezone.utc)
    fact_rows = match_facts(conn, request.observation, request.namespace, tuple(request.shared), request.as_of)
    found = find_episodes(conn, settings, request)
    outcome = found.outcome
    hits = [h for h in outcome.hits if _related(h, found.max_distance)]
    episodes = collapse(hits, float(setting(settings, "dedupe")))
    books, book_warning = find_runbooks(settings, request)
    candidates = (
        [_fact_item(r, form, now) for r in fact_rows if r["score"] >= min_score][: request.k]
        + [_episode_item(h, d, form, now, sightings(conn, h, request.as_of))
           for h, d in episodes if h.score >= min_score][: request.k]
        + [_runbook_item(r, form) for r in books if r["score"] >= min_score][: request.k]
    )
    chosen, used = fit(candidates, form, found.count, max_tokens)
    result = Recall(chosen, form.header, form.footer, used, max_tokens, outcome.mode, found.counter,
                    left_out=len(candidates) - len(chosen),
                    warnings=[w for w in (outcome.warning, book_warning) if w])
    if request.track and request.as_of is None:
        from memctl.records import access

        access.record(conn, [(i.data["agent"], i.data["id"]) for i in chosen if i.kind == "episode"])
    return result


def fit(candidates: list[Item], form: Template, count: Callable[[str], int],
        max_tokens: int) -> tuple[list[Item], int]:
    """The leading items whose lines, with the header and footer, fit max_tokens; and the tokens they use."""
    # Each line is counted with the newline after it; the last one's is the footer's first character.
    used = sum(count(part) for part in (form.header, form.footer.removeprefix("\n")) if part)
    chosen = []
    for item in candidates:
        item.tokens = count(item.line + "\n")
        if used + item.tokens > max_tokens:
            break
        chosen.append(item)
        used += item.tokens
    return chosen, used if chosen else 0
