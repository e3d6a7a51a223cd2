"""Summaries with lineage: old episodes rolled up through an Ollama chat model before retention forgets them.

A window is one agent's episodes of the summarized kinds on one UTC day. Each
window is summarized by `[summarize] model` through the official client's
`chat`, fitted to the model's context: a window too long for one request is
summarized in parts, then the parts' summaries are summarized (again in groups
if they are still too long). Nothing is ever cut to fit; an answer the model
may have read truncated fails its window.

A summary is an episode (kind 'summary', source 'summarize:<model>', created_at
at the window's end, importance the highest of its sources), written through
memctl.episodes so chunking, embed queueing and the write lock apply, together
with its lineage rows (summary_sources) in one transaction per window: a killed
run loses at most the window in flight, and a rerun never summarizes an episode
twice. The lineage has no foreign key to the sources, so it outlives them.
"""

from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass, field
from typing import Any

from memctl.config import Settings, parse_duration
from memctl.embedding import OllamaEmbedder, estimate_tokens
from memctl.errors import ConfigError, EmbedInputRejected, MemctlError, Unavailable, UsageError

SUMMARY_KIND = "summary"
SOURCE_PREFIX = "summarize:"
JOB = "summarize"
LOCK_CLASS = 0x6D73756D  # "msum": advisory lock namespace, one lock per (agent, day)
OVERDUE_GRACE_S = 2 * 86400  # the timer runs daily: two missed days make summaries overdue
OUTPUT_SHARE = 4  # a quarter of the context is left for the answer (num_predict)
MARGIN_TOKENS = 64  # the chat template's own tokens around the messages
# Characters / 4 is an estimate: logs full of numbers, addresses or non-English text run denser. Planning
# prompts at 80% of the room keeps them inside the context at down to about 3 characters per token.
ESTIMATE_SAFETY = 0.8
UTC = datetime.timezone.utc

SYSTEM_PROMPT = (
    "You summarize an AI agent's memory log so that the agent can read the summary later in place of the "
    "entries. Write a factual summary of the entries the user gives you. Keep every name, number, date, time, "
    "address, version, error message, cause, fix and decision exactly as written. Add nothing that is not in "
    "the entries: no advice, no opinions, no preamble, no closing remark. Plain sentences, one line per event. "
    "The entries are from agent {agent} on {day} (UTC), oldest first: {what}."
)
ENTRIES = "one per line, each with its time (UTC), [source] and text"
PART_SUMMARIES = "summaries of consecutive parts of that day, each after a line naming the part"
# An answer that declines instead of summarizing.
_REFUSAL = re.compile(r"^\W*(i'?m sorry|i am sorry|sorry\b|i apologi[sz]e|i can(?:no|')t\b|i cannot\b|i am unable|"
                      r"i'?m unable|i won'?t\b|i will not\b|as an ai\b|i'?m not able|i am not able|"
                      r"unfortunately,? i\b)", re.IGNORECASE)
# An answer about the request itself: a server that says it could not read all of it.
_OVERFLOW = re.compile(r"exceeds? the context|context (?:length|window) (?:was )?exceeded|input (?:was )?truncated",
                       re.IGNORECASE)


# --- settings ---------------------------------------------------------------


def model(settings: Settings) -> str | None:
    return settings.get("summarize", "model")


def kinds(settings: Settings) -> list[str]:
    """[summarize] kinds, else every kind with a [retention] limit except summary."""
    configured = settings.get("summarize", "kinds")
    if configured is not None:
        return [k for k in configured if k != SUMMARY_KIND]
    from memctl.retention import policy_from_settings

    return [k for k in policy_from_settings(settings).max_age if k != SUMMARY_KIND]


def awaited_kinds(settings: Settings, policy) -> frozenset[str]:
    """The kinds whose unsummarized episodes prune keeps: none unless a model is set and require_summary holds."""
    if model(settings) is None or not policy.require_summary:
        return frozenset()
    return frozenset(kinds(settings))


def _older_than(settings: Settings, older_than: str | None) -> float:
    value = older_than if older_than is not None else settings.get("summarize", "after")
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None


# --- the chat client --------------------------------------------------------


@dataclass
class Answer:
    text: str
    prompt_tokens: int | None
    output_tokens: int | None
    done_reason: str | None


class OllamaChat(OllamaEmbedder):
    """A chat model at an Ollama server. It shares OllamaEmbedder's client, /api/show reading and the mapping of
    failures to memctl errors (down, slow, 5xx: EmbedderUnavailable, exit 3; 404: UnknownModel with the
    `ollama pull` hint), so both speak to Ollama the same way."""

    def chat(self, system: str, user: str, *, num_ctx: int, num_predict: int) -> Answer:
        response = self._call("chat", model=self.model, stream=False,
                              messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
                              options={"num_ctx": num_ctx, "num_predict": num_predict, "temperature": 0})
        message = getattr(response, "message", None)
        return Answer(text=(getattr(message, "content", None) or "").strip(),
                      prompt_tokens=getattr(response, "prompt_eval_count", None),
                      output_tokens=getattr(response, "eval_count", None),
                      done_reason=getattr(response, "done_reason", None))


def make_chat(settings: Settings, name: str) -> OllamaChat:
    """The chat client at [embedding] ollama_host / OLLAMA_HOST, as the embedder uses."""
    return OllamaChat(name, host=settings.get("embedding", "ollama_host"), timeout=settings.get("summarize", "timeout"))


# --- windows ------------------------------------------------------------------

WINDOWS = """
SELECT e.agent, date_trunc('day', e.created_at AT TIME ZONE 'UTC') AS day, count(*) AS episodes,
       sum(length(e.content)) AS chars
FROM episodes e
WHERE e.kind = ANY(%(kinds)s) AND e.created_at < %(before)s AND (%(agent)s::text IS NULL OR e.agent = %(agent)s)
  AND NOT EXISTS (SELECT 1 FROM summary_sources l WHERE l.agent = e.agent AND l.source_id = e.id)
GROUP BY 1, 2 ORDER BY 2, 1
LIMIT %(limit)s
"""
WINDOW_EPISODES = """
SELECT e.id, e.agent, e.kind, e.source, e.importance, e.created_at, e.content, e.content_hash
FROM episodes e
WHERE e.agent = %(agent)s AND e.created_at >= %(start)s AND e.created_at < %(end)s AND e.kind = ANY(%(kinds)s)
  AND NOT EXISTS (SELECT 1 FROM summary_sources l WHERE l.agent = e.agent AND l.source_id = e.id)
ORDER BY e.created_at, e.id
"""
# A window summarized before: episodes backdated into it later get a summary of their own (an addendum).
EARLIER_SUMMARY = """
SELECT id FROM episodes
WHERE agent = %s AND kind = 'summary' AND created_at = %s AND source LIKE 'summarize:%%' AND meta ? 'window_start'
ORDER BY id LIMIT 1
"""
NOW = "SELECT now() AS now"


@dataclass
class Window:
    agent: str
    start: datetime.datetime
    episodes: int
    chars: int
    addendum_to: int | None = None

    @property
    def end(self) -> datetime.datetime:
        return self.start + datetime.timedelta(days=1)

    @property
    def day(self) -> str:
        return self.start.date().isoformat()


def windows(conn, settings: Settings, *, older_than: str | None = None, agent: str | None = None,
            limit: int | None = None) -> list[Window]:
    """Windows (agent, UTC day) wholly older than older_than with episodes no summary holds yet, oldest first."""
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit must be positive, got {limit}")
    kinds_ = kinds(settings)
    if not kinds_:
        raise ConfigError("nothing to summarize: [summarize] kinds is empty and [retention] limits no kind but "
                          'summary (e.g. [retention] raw = "30d")')
    now = conn.execute(NOW).fetchone()["now"].astimezone(UTC)
    edge = now - datetime.timedelta(seconds=_older_than(settings, older_than))
    before = datetime.datetime.combine(edge.date(), datetime.time(), UTC)
    rows = conn.execute(WINDOWS, {"kinds": kinds_, "before": before, "agent": agent, "limit": limit}).fetchall()
    found = []
    for row in rows:
        window = Window(row["agent"], row["day"].replace(tzinfo=UTC), row["episodes"], row["chars"])
        earlier = conn.execute(EARLIER_SUMMARY, (window.agent, window.end)).fetchone()
        window.addendum_to = earlier["id"] if earlier else None
        found.append(window)
    return found


def plan(conn, settings: Settings, **selection: Any) -> list[dict]:
    """Dry run: the windows that would be summarized, their episode counts and estimated input tokens."""
    return [{"agent": w.agent, "window_start": w.start, "window_end": w.end, "episodes": w.episodes,
             "tokens_in": math.ceil(int(w.chars) / 4), "addendum_to": w.addendum_to}
            for w in windows(conn, settings, **selection)]


# --- fitting a window to the context ------------------------------------------


class WindowFailed(MemctlError):
    """This window cannot be summarized now (bad answer, input too long); the others go on."""


@dataclass
class Budget:
    num_ctx: int
    num_predict: int

    @classmethod
    def for_model(cls, context_length: int | None, configured: int) -> Budget:
        num_ctx = min(configured, context_length) if context_length else configured
        if num_ctx < 512:
            raise ConfigError(f"a context of {num_ctx} tokens is too small to summarize in ([summarize] context)")
        return cls(num_ctx, num_ctx // OUTPUT_SHARE)

    @property
    def prompt_room(self) -> int:
        """Tokens the whole prompt may take, as the server counts them."""
        return self.num_ctx - self.num_predict

    def user_room(self, system: str) -> int:
        """Estimated tokens the user message may take."""
        return int(self.prompt_room * ESTIMATE_SAFETY) - estimate_tokens(system) - MARGIN_TOKENS


def _flat(text: str) -> str:
    return " ".join(text.split())


def episode_lines(episodes: list[dict], room: int) -> list[str]:
    """One line per episode (time, [source], text); a text longer than the room goes in several lines."""
    lines = []
    for ep in episodes:
        prefix = f"{ep['created_at'].astimezone(UTC):%Y-%m-%d %H:%M} [{ep['source'] or '-'}]"
        text = _flat(ep["content"])
        if estimate_tokens(f"{prefix} {text}") <= room:
            lines.append(f"{prefix} {text}")
            continue
        pieces = _split(text, max(64, (room - estimate_tokens(prefix) - 8) * 4))
        lines += [f"{prefix} (piece {i} of {len(pieces)}) {p}" for i, p in enumerate(pieces, 1)]
    return lines


def _split(text: str, size: int) -> list[str]:
    """Pieces of at most `size` characters, cut at a space where there is one."""
    pieces = []
    while len(text) > size:
        cut = text.rfind(" ", size // 2, size)
        cut = size if cut <= 0 else cut
        pieces.append(text[:cut].strip())
        text = text[cut:].strip()
    return pieces + ([text] if text else [])


def groups(lines: list[str], room: int) -> list[list[str]]:
    """Consecutive lines packed into groups whose text fits the room."""
    packed: list[list[str]] = [[]]
    used = 0
    for line in lines:
        cost = estimate_tokens(line) + 1
        if packed[-1] and used + cost > room:
            packed.append([])
            used = 0
        packed[-1].append(line)
        used += cost
    return packed


def check_answer(answer: Answer, user: str, budget: Budget) -> str:
    """The answer's text, or WindowFailed saying why it is no summary."""
    if answer.prompt_tokens is not None and answer.prompt_tokens > budget.prompt_room:
        raise WindowFailed(f"the model counted {answer.prompt_tokens} prompt tokens, more than the "
                           f"{budget.prompt_room} planned within its context of {budget.num_ctx}: it may have read "
                           "the input truncated (Ollama cuts a long prompt silently); lower [summarize] context")
    if answer.done_reason == "length":
        raise WindowFailed(f"the answer was cut at {budget.num_predict} tokens (num_predict)")
    if not answer.text:
        raise WindowFailed("the model answered with an empty summary")
    if _OVERFLOW.search(answer.text[:200]):
        raise WindowFailed(f"the model says its input did not fit: {answer.text[:80]!r}")
    if _REFUSAL.match(answer.text):
        raise WindowFailed(f"the model answered with a refusal, not a summary: {answer.text[:80]!r}")
    if estimate_tokens(answer.text) > estimate_tokens(user):
        raise WindowFailed(f"the answer ({estimate_tokens(answer.text)} tokens) is longer than its input "
                           f"({estimate_tokens(user)} tokens): not a summary")
    return answer.text


@dataclass
class Summary:
    text: str
    requests: int = 0
    parts: int = 1
    rounds: int = 1
    tokens_in: int = 0
    tokens_out: int = 0


def summarize_window(chat: OllamaChat, budget: Budget, agent: str, day: str, episodes: list[dict]) -> Summary:
    """Ask the model for one summary of the window: in one request, or parts first and then their summaries."""
    result = Summary("")
    system = SYSTEM_PROMPT.format(agent=agent, day=day, what=ENTRIES)
    room = budget.user_room(system)
    batches = groups(episode_lines(episodes, room), room)
    result.parts = len(batches)
    texts = [_ask(chat, budget, system, "\n".join(b), result) for b in batches]
    system = SYSTEM_PROMPT.format(agent=agent, day=day, what=PART_SUMMARIES)
    room = budget.user_room(system)
    while len(texts) > 1:
        result.rounds += 1
        labelled = [f"Part {i} of {len(texts)}:\n{t}" for i, t in enumerate(texts, 1)]
        merged = groups([line for block in labelled for line in block.splitlines()], room)
        if len(merged) >= len(texts):
            raise WindowFailed(f"the summaries of {len(texts)} parts do not shrink into the context of "
                               f"{budget.num_ctx} tokens")
        texts = [_ask(chat, budget, system, "\n".join(g), result) for g in merged]
    result.text = texts[0]
    return result


def _ask(chat: OllamaChat, budget: Budget, system: str, user: str, result: Summary) -> str:
    try:
        answer = chat.chat(system, user, num_ctx=budget.num_ctx, num_predict=budget.num_predict)
    except EmbedInputRejected as exc:  # a server that refuses long input instead of truncating it
        raise WindowFailed(f"the model refused the input: {exc}") from None
    result.requests += 1
    result.tokens_in += answer.prompt_tokens if answer.prompt_tokens is not None else estimate_tokens(system + user)
    result.tokens_out += answer.output_tokens if answer.output_tokens is not None else estimate_tokens(answer.text)
    return check_answer(answer, user, budget)


# --- writing a summary --------------------------------------------------------

TRY_LOCK = "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS ok"
UNLOCK = "SELECT pg_advisory_unlock(%s, hashtext(%s))"
RECHECK = """
SELECT e.id, e.content_hash,
       EXISTS (SELECT 1 FROM summary_sources l WHERE l.agent = e.agent AND l.source_id = e.id) AS summarized
FROM episodes e WHERE e.agent = %s AND e.id = ANY(%s)
FOR SHARE OF e
"""
INSERT_SOURCE = """
INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash) VALUES (%s, %s, %s, %s, %s)
"""


def _write(conn, settings: Settings, name: str, window: Window, episodes: list[dict], summary: Summary) -> int | None:
    """Summary episode and lineage in one transaction; None if another run summarized these episodes meanwhile."""
    from memctl import episodes as episodes_mod

    ids = [e["id"] for e in episodes]
    with conn.transaction():
        now = {r["id"]: r for r in conn.execute(RECHECK, (window.agent, ids)).fetchall()}
        if any(r["summarized"] for r in now.values()):
            return None
        changed = [i for i, e in zip(ids, episodes)
                   if i not in now or bytes(now[i]["content_hash"]) != bytes(e["content_hash"])]
        if changed:
            raise WindowFailed(f"{len(changed)} source episode(s) were deleted or changed while summarizing")
        meta = {"window_start": window.start.isoformat(), "window_end": window.end.isoformat(), "model": name,
                "sources": len(ids), "source_names": sorted({e["source"] for e in episodes if e["source"]}),
                "kinds": sorted({e["kind"] for e in episodes}), "parts": summary.parts, "rounds": summary.rounds,
                "requests": summary.requests, "tokens_in": summary.tokens_in, "tokens_out": summary.tokens_out}
        if window.addendum_to is not None:
            meta["addendum_to"] = window.addendum_to
        header = f"Summary of {len(ids)} episode(s) of agent {window.agent} on {window.day} (UTC):"
        try:
            summary_id = episodes_mod.add(conn, settings, f"{header}\n{summary.text}", kind=SUMMARY_KIND,
                                          source=f"{SOURCE_PREFIX}{name}", agent=window.agent,
                                          importance=max(e["importance"] for e in episodes),
                                          created_at=window.end, meta=meta)
        except Unavailable:
            raise
        except MemctlError as exc:  # a blocked source, a write policy: this window's summary is refused
            raise WindowFailed(f"the summary was refused: {exc}") from None
        if summary_id is None:
            raise WindowFailed("the summary was not stored (importance 0 by the write policy)")
        with conn.cursor() as cur:
            cur.executemany(INSERT_SOURCE, [(window.agent, summary_id, e["id"], e["created_at"], e["content_hash"])
                                            for e in episodes])
    return summary_id


@dataclass
class RunResult:
    written: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    skipped: int = 0  # windows another run held or finished meanwhile


def run(conn, settings: Settings, *, older_than: str | None = None, agent: str | None = None,
        limit: int | None = None, chat: OllamaChat | None = None) -> RunResult:
    """Summarize every due window, one transaction each; recorded as job 'summarize'.

    A window whose answer is no summary fails alone (listed in the result and the job's detail); Ollama down,
    slow or failing raises EmbedderUnavailable (exit 3), an unknown model UnknownModel (exit 1).
    """
    from memctl import jobs

    name = model(settings)
    if not name:
        raise ConfigError('no chat model: set [summarize] model in the configuration (e.g. model = "llama3.2:3b")')
    chat = chat or make_chat(settings, name)
    result = RunResult()
    with jobs.record(conn, JOB) as job:
        budget = Budget.for_model(chat.context_tokens(), settings.get("summarize", "context"))
        for window in windows(conn, settings, older_than=older_than, agent=agent, limit=limit):
            _one(conn, settings, chat, name, budget, window, result)
        job.rows = len(result.written)
        job.detail = {"model": name, "num_ctx": budget.num_ctx, "written": result.written, "failed": result.failed,
                      "skipped": result.skipped}
        if result.failed:
            job.outcome = "partial"
            job.error = (f"{len(result.failed)} window(s) failed: "
                         + "; ".join(f"{f['agent']} {f['window_start'][:10]}: {f['error']}" for f in result.failed[:5]))
    return result


def _one(conn, settings, chat, name, budget, window: Window, result: RunResult) -> None:
    key = f"{window.agent}/{window.day}"
    if not conn.execute(TRY_LOCK, (LOCK_CLASS, key)).fetchone()["ok"]:
        result.skipped += 1
        return
    try:
        episodes = conn.execute(WINDOW_EPISODES, {"agent": window.agent, "start": window.start, "end": window.end,
                                                  "kinds": kinds(settings)}).fetchall()
        if not episodes:
            result.skipped += 1
            return
        summary = summarize_window(chat, budget, window.agent, window.day, episodes)
        summary_id = _write(conn, settings, name, window, episodes, summary)
        if summary_id is None:
            result.skipped += 1
            return
        result.written.append({"summary_id": summary_id, "agent": window.agent, "window_start": window.start,
                               "window_end": window.end, "sources": len(episodes), "tokens_in": summary.tokens_in,
                               "tokens_out": summary.tokens_out, "parts": summary.parts})
    except WindowFailed as exc:
        result.failed.append({"agent": window.agent, "window_start": window.start.isoformat(),
                              "window_end": window.end.isoformat(), "error": str(exc)})
    finally:
        conn.execute(UNLOCK, (LOCK_CLASS, key))


# --- lineage -----------------------------------------------------------------

SOURCES_OF = """
SELECT l.source_id AS id, l.source_created_at AS created_at, encode(l.source_hash, 'hex') AS content_hash,
       e.id IS NOT NULL AS exists
FROM summary_sources l LEFT JOIN episodes e ON e.agent = l.agent AND e.id = l.source_id
WHERE l.agent = %s AND l.summary_id = %s ORDER BY l.source_created_at, l.source_id
"""
SUMMARIZED_IN = """
SELECT l.summary_id AS id, s.created_at, s.source FROM summary_sources l
JOIN episodes s ON s.agent = l.agent AND s.id = l.summary_id
WHERE l.agent = %s AND l.source_id = %s ORDER BY l.summary_id
"""


def lineage(conn, agent: str, episode_id: int) -> dict:
    """An episode's place in the lineage: the sources a summary was built from, the summaries built from it."""
    return {"sources": conn.execute(SOURCES_OF, (agent, episode_id)).fetchall(),
            "summarized_in": conn.execute(SUMMARIZED_IN, (agent, episode_id)).fetchall()}


# Summaries built from a source's episodes: through the lineage while those episodes exist, and by the source
# names each summary records, once prune has deleted them. With since, by the sources' created_at (or, for a
# summary whose sources are gone, its window's end).
BUILT_FROM = """
SELECT s.id, s.agent, s.created_at, s.meta->>'window_start' AS window_start FROM episodes s
WHERE s.kind = 'summary' AND s.source LIKE 'summarize:%%' AND (
    EXISTS (SELECT 1 FROM summary_sources l JOIN episodes e ON e.agent = l.agent AND e.id = l.source_id
            WHERE l.agent = s.agent AND l.summary_id = s.id AND e.source = %(source)s
              AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s))
    OR (s.meta->'source_names' ? %(source)s AND (%(since)s::timestamptz IS NULL OR s.created_at > %(since)s)))
ORDER BY s.agent, s.id
"""


def built_from(conn, source: str, since: datetime.datetime | None = None) -> list[dict]:
    return conn.execute(BUILT_FROM, {"source": source, "since": since}).fetchall()


# --- status ------------------------------------------------------------------

OVERDUE = """
SELECT count(*) AS n, min(e.created_at) AS oldest FROM episodes e
WHERE e.kind = ANY(%s) AND e.created_at < now() - make_interval(secs => %s)
  AND NOT EXISTS (SELECT 1 FROM summary_sources l WHERE l.agent = e.agent AND l.source_id = e.id)
"""


def overdue(conn, settings: Settings | None) -> str | None:
    """A warning when episodes should have been summarized two days ago and are not (None when all is well)."""
    if settings is None or model(settings) is None or not kinds(settings):
        return None
    after = settings.get("summarize", "after")
    late = parse_duration(after) + 86400 + OVERDUE_GRACE_S  # its whole window is past `after`, plus two runs
    row = conn.execute(OVERDUE, (kinds(settings), late)).fetchone()
    if not row["n"]:
        return None
    return (f"summaries are overdue: {row['n']} episode(s) of {', '.join(kinds(settings))} older than "
            f"{late / 86400:.0f}d have no summary (oldest {row['oldest']:%Y-%m-%d}; [summarize] after = {after}); "
            "prune keeps them until one exists: run memctl summarize or enable memctl-summarize.timer "
            f"(memctl jobs --job {JOB})")
