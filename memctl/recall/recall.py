"""Recall: the few memories worth putting in a prompt now, within a token budget.

`recall(conn, settings, Request(observation))` gathers matching facts (match_facts), episodes from
the hybrid search with their windows (memctl.recall.recall_episodes, memctl.recall.window) and
matching runbooks (find_runbooks), at most k of each kind above min_score, then takes whole items
in that order while they fit max_tokens (assemble, fit) and lays them out with [recall]'s template
(memctl.recall.form). recall_batch runs many requests on one connection; batch_request reads one
line of `recall --batch`.

The rules (scores, collapsing, as_of, the budget, the template's fields), and why: docs/recall.md.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from memctl.config import Settings
from memctl.errors import BadValue, MemctlError, UsageError
from memctl.reading import query
from memctl.recall import recall_episodes, window
from memctl.recall.form import Item, Template, age, sourced, template

if TYPE_CHECKING:
    from memctl.db.memory import Memory

STOPWORDS = frozenset(
    """
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers herself him himself his how i if in into is it its itself just let me more most my myself no nor not now of
off on once only or other our ours ourselves out over own same she should so some such than that the their
theirs them themselves then there these they this those through to too under until up very was we were what
when where which while who whom why will with would you your yours yourself yourselves get got please need
needs want wants like make made use used using can't don't isn't it's i'm
""".split()
)


@dataclass
class Request:
    observation: str
    agent: str | None = None
    # None: the namespaces the agent's MCP server reads (records.agents.namespaces_for: a registered
    # agent's own and its shared ones; 'default' for an unregistered agent or none)
    namespace: str | None = "default"
    shared: tuple[
        str, ...
    ] = ()  # namespaces whose facts are read too (an agent's MCP server: read-only ones)
    k: int = 5
    max_tokens: int | None = None  # None: [recall] max_tokens
    min_score: float | None = None  # None: [recall] min_score
    repo: str | None = None  # runbook directory; None: MEMCTL_RUNBOOKS / `runbooks` in the config
    track: bool = True  # count the episodes returned as accessed
    as_of: datetime.datetime | None = (
        None  # the memory the agent would have had at this time (never tracked)
    )


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
        return {
            "items": [item.to_dict() for item in self.items],
            "tokens": self.tokens,
            "max_tokens": self.max_tokens,
            "left_out": self.left_out,
            "mode": self.mode,
            "token_counter": self.token_counter,
        }


_WORD = re.compile(r"\w+")


def observation_words(text: str) -> list[str]:
    """Lowercased words of 3 letters or more, common English words dropped, first occurrence order."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) >= 3 and word not in STOPWORDS:
            seen.setdefault(word)
    return list(seen)


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


def match_facts(
    conn: Memory,
    observation: str,
    namespace: str,
    also: tuple[str, ...] = (),
    as_of: datetime.datetime | None = None,
) -> list[dict]:
    """Facts of the namespace (and of the namespaces `also` names) sharing a word with the observation,
    best first, each with its `score`; the current ones, or with `as_of` those valid then."""
    from psycopg import sql

    from memctl.records import facts

    params = {
        "text": observation,
        "namespaces": [namespace, *also],
        "from": SPLIT_CHARS[0],
        "to": SPLIT_CHARS[1],
        "at": as_of,
        "key": None,
        "prefix": None,
    }
    known = (
        sql.Identifier("facts")
        if as_of is None
        else sql.SQL("({})").format(sql.SQL(facts.VALID_AT))
    )
    lowered = observation.lower()
    found = []
    for row in conn.execute(sql.SQL(FACT_MATCHES).format(facts=known), params, prepare=False):
        verbatim = _verbatim(row["key"], lowered)
        score = 1.0 if verbatim else _saturate(2 * row["key_hits"] + row["value_hits"])
        found.append({**row, "score": score})
    return sorted(found, key=lambda r: (-r["score"], r["key"]))


def _fact_item(row: dict, form: Template, now: datetime.datetime) -> Item:
    value = " ".join(row["value"].split())
    data = {
        "namespace": row["namespace"],
        "key": row["key"],
        "value": row["value"],
        "source": row["source"],
        "version": row["version"],
        "updated_at": row["updated_at"],
        "valid_from": row["valid_from"],
    }
    line = form.line(
        "fact",
        {
            **data,
            "value": value,
            "sourced": sourced(row["source"]),
            "score": row["score"],
            "valid_from": row["valid_from"].isoformat(timespec="seconds"),
            "age": age(row["valid_from"], now),
        },
    )
    return Item("fact", row["score"], line, data=data)


# ---------------------------------------------------------------------------
# Runbooks


def find_runbooks(settings: Settings, request: Request) -> tuple[list[dict], str | None]:
    """Runbooks matching the observation's words, each with a 0..1 `score`; ([], warning) on a broken repo."""
    from memctl.runbooks import runbooks

    if not (request.repo or settings.runbooks):
        return [], None
    words = observation_words(request.observation)
    if not words:
        return [], None
    try:
        found = runbooks.open_repository(request.repo, settings).find(" ".join(words))
    except MemctlError as exc:
        return [], f"runbooks left out: {exc}"
    return [
        {**row, "points": row["score"], "score": _saturate(row["score"])} for row in found
    ], None


def _runbook_item(row: dict, form: Template) -> Item:
    data = {"name": row["name"], "title": row["title"]}
    return Item(
        "runbook", row["score"], form.line("runbook", {**data, "score": row["score"]}), data=data
    )


# ---------------------------------------------------------------------------
# A batch's lines (recall --batch)

BATCH_FIELDS = ("observation", "agent", "namespace", "max_tokens", "k", "as_of")
MAX_K = 100


def batch_request(item: Any, number: int, base: Request) -> Request:
    """One JSONL line of `recall --batch` as a Request, the fields it leaves out taken from `base`.

    Every field given is checked where it enters: observation a non-empty string, agent and namespace
    non-empty strings, max_tokens an integer >= 1, k an integer from 1 to MAX_K, as_of a duration back
    or an ISO 8601 time; none may hold NUL. BadValue names the line and the field (`field`). A line
    naming its namespace reads that one alone (no shared ones).
    """
    from memctl.write import values
    from memctl.records.facts import moment

    def bad(name: str | None, why: str) -> BadValue:
        return BadValue(f"line {number}: " + (f"field {name}: " if name else "") + why, name)

    if not isinstance(item, dict):
        raise bad(None, "expected a JSON object")
    unknown = sorted(set(item) - set(BATCH_FIELDS))
    if unknown:
        raise bad(unknown[0], f"unknown field (fields: {', '.join(BATCH_FIELDS)})")
    if "observation" not in item:
        raise bad("observation", "is required")
    query.check_strings(item, ("observation", "agent", "namespace", "as_of"), bad, values.shown)
    for name, low, high in (("max_tokens", 1, 2**31 - 1), ("k", 1, MAX_K)):
        value = item.get(name)
        if name in item and (
            isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
        ):
            raise bad(name, f"must be an integer from {low} to {high}, got {values.shown(value)}")
    as_of = base.as_of
    if "as_of" in item:
        try:
            as_of = moment(item["as_of"], "as_of")
        except MemctlError as exc:
            raise bad("as_of", str(exc)) from None
    named = {"namespace": item["namespace"], "shared": ()} if "namespace" in item else {}
    return replace(
        base,
        observation=item["observation"],
        agent=item.get("agent", base.agent),
        max_tokens=item.get("max_tokens", base.max_tokens),
        k=item.get("k", base.k),
        as_of=as_of,
        **named,
    )


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
    max_tokens = (
        request.max_tokens if request.max_tokens is not None else settings.recall.max_tokens
    )
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {max_tokens}")
    min_score = request.min_score if request.min_score is not None else settings.recall.min_score
    return int(max_tokens), float(min_score)


def recall(conn: Memory, request: Request) -> Recall:
    """Facts, then episodes (with their windows), then runbooks, as many whole items as the budget holds."""
    return recall_batch(conn, [request])[0]


def recall_batch(conn: Memory, requests: list[Request]) -> list[Recall]:
    """Many recalls on one connection: their searches one search batch, the rest in shared read transactions
    (scan.ScanTransactions), the accesses counted at the end."""
    settings = conn.settings
    from memctl.reading.scan import ScanTransactions

    limits = [check(r, settings) for r in requests]
    requests = scoped(conn, requests)
    form = template(settings)
    rule = window.rule(settings)
    found = recall_episodes.find_episodes(conn, requests)
    results = []
    with ScanTransactions(conn) as scans:
        for request, (max_tokens, min_score), episodes in zip(requests, limits, found):
            scans.begin()
            results.append(assemble(conn, request, max_tokens, min_score, form, rule, episodes))
    tracked = [
        (i.data["agent"], episode_id)
        for request, result in zip(requests, results)
        if request.track and request.as_of is None
        for i in result.items
        if i.kind in ("episode", "window")
        for episode_id in ([i.data["id"]] if i.kind == "episode" else i.data["ids"])
    ]
    if tracked:
        from memctl.records import access

        access.record(conn, tracked)
    return results


def scoped(conn: Memory, requests: list[Request]) -> list[Request]:
    """Each request whose namespace is None given the namespaces its agent's MCP server reads
    (records.agents.namespaces_for), asked once an agent."""
    from memctl.records import agents

    found: dict[str | None, tuple[str, tuple[str, ...]]] = {}
    out = []
    for request in requests:
        if request.namespace is None:
            if request.agent not in found:
                found[request.agent] = agents.namespaces_for(conn, request.agent)
            namespace, shared = found[request.agent]
            request = replace(request, namespace=namespace, shared=shared)
        out.append(request)
    return out


def assemble(
    conn: Memory,
    request: Request,
    max_tokens: int,
    min_score: float,
    form: Template,
    rule: window.Rule,
    found: recall_episodes.Episodes,
) -> Recall:
    settings = conn.settings
    now = request.as_of or datetime.datetime.now(datetime.timezone.utc)
    assert request.namespace is not None  # recall() asked the agents' registry for it
    fact_rows = match_facts(
        conn, request.observation, request.namespace, tuple(request.shared), request.as_of
    )
    outcome = found.outcome
    hits = [h for h in outcome.hits if recall_episodes.related(h, found.max_distance)]
    kept = [
        (h, d)
        for h, d in recall_episodes.collapse(hits, float(settings.recall.dedupe))
        if h.score >= min_score
    ][: request.k]
    books, book_warning = find_runbooks(settings, request)
    facts = [_fact_item(r, form, now) for r in fact_rows if r["score"] >= min_score][: request.k]
    runbooks = [_runbook_item(r, form) for r in books if r["score"] >= min_score][: request.k]
    entries = [recall_episodes.entry(conn, h, d, request.as_of) for h, d in kept]
    windows = window.windows(conn, entries, rule, until=request.as_of)
    chosen, used = fit(facts, form, found.count, max_tokens)
    spend = recall_episodes.Spend(form, found.count, now)
    if len(chosen) == len(facts):
        blocks, spent, whole = spend.run(entries, windows, rule, max_tokens - used)
        for block in blocks:
            chosen.append(recall_episodes.window_item(block, form, now))
            chosen[-1].tokens = spend.cost(block)
        used += spent
        if whole:
            more, used = fit(runbooks, form, found.count, max_tokens, used)
            chosen += more
    shown = sum(len(i.data.get("matches", [0])) for i in chosen)
    return Recall(
        chosen,
        form.header,
        form.footer,
        used if chosen else 0,
        max_tokens,
        outcome.mode,
        found.counter,
        left_out=len(facts) + len(entries) + len(runbooks) - shown,
        warnings=[w for w in (outcome.warning, book_warning) if w],
    )


def fit(
    candidates: list[Item],
    form: Template,
    count: Callable[[str], int],
    max_tokens: int,
    used: int | None = None,
) -> tuple[list[Item], int]:
    """The leading items whose lines, with the header and footer, fit max_tokens; and the tokens used then.

    `used`: what the block already holds (None: nothing yet, the header and footer are counted now).
    """
    # Each line is counted with the newline after it; the last one's is the footer's first character.
    if used is None:
        used = sum(count(part) for part in (form.header, form.footer.removeprefix("\n")) if part)
    chosen = []
    for item in candidates:
        item.tokens = count(item.line + "\n")
        if used + item.tokens > max_tokens:
            break
        chosen.append(item)
        used += item.tokens
    return chosen, used
