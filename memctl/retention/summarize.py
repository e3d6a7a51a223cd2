"""Summaries with lineage: old episodes rolled up through an Ollama chat model before retention forgets them.

A window is one agent's episodes of the summarized kinds on one UTC day. Each
window is summarized by `[summarize] model` through the official client's
`chat`, fitted to the model's context: a window too long for one request is
summarized in parts, then the parts' summaries are summarized (again in groups
if they are still too long). Nothing is ever cut to fit; an answer the model
may have read truncated fails its window.

A summary is an episode (kind 'summary', source 'summarize:<model>', created_at
at the window's end, importance the highest of its sources), written through
memctl.records.episodes so chunking, embed queueing and the write lock apply, together
with its lineage rows (summary_sources, memctl.records.lineage) in one transaction per
window: a killed run loses at most the window in flight, and a rerun never
summarizes an episode twice.

Memory does not grow with the window: its episodes are recorded in a temporary
table (id, time, content hash) by one statement, then read back in pages of
about PAGE_BYTES and fed to the parts as they fill; the parts' summaries wait
in another temporary table between rounds. The lineage rows and the re-check in
the writing transaction are computed in SQL from the recorded input.

The chat client, the fitting of text into the model's context and the checks of an answer are
memctl.retention.chat.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from memctl.config import Settings, parse_duration
from memctl.db import locks
from memctl.errors import ConfigError, MemctlError, NothingToDo, Unavailable, UsageError
from memctl.records import lineage as lineage_mod
from memctl.retention import chat as chat_mod
from memctl.retention.chat import UTC, Budget, OllamaChat, Summary, WindowFailed
from memctl.retention.policy import policy_from_settings

if TYPE_CHECKING:
    from memctl.db.memory import Memory

SUMMARY_KIND = lineage_mod.SUMMARY_KIND
SOURCE_PREFIX = lineage_mod.SOURCE_PREFIX
JOB = "summarize"
LOCK_CLASS = 0x6D73756D  # "msum": advisory lock namespace, one lock per (agent, day)
OVERDUE_GRACE_S = 2 * 86400  # the timer runs daily: two missed days make summaries overdue
PAGE_BYTES = (
    1 << 20
)  # a page of a window's episodes holds about this much text (or one longer episode)
PAGE_ROWS = 2000  # ... and at most this many episodes
PARTS_PAGE = 32  # part summaries read back per query (each at most one answer, num_predict tokens)


# --- settings ---------------------------------------------------------------


def model(settings: Settings) -> str | None:
    return settings.summarize.model


def kinds(settings: Settings) -> list[str]:
    """[summarize] kinds, else every kind with a [retention] limit except summary."""
    configured = settings.summarize.kinds
    if configured is not None:
        return [k for k in configured if k != SUMMARY_KIND]
    return [k for k in policy_from_settings(settings).max_age if k != SUMMARY_KIND]


def awaited_kinds(settings: Settings, policy) -> frozenset[str]:
    """The kinds whose unsummarized episodes prune keeps: none unless a model is set and require_summary holds."""
    if model(settings) is None or not policy.require_summary:
        return frozenset()
    return frozenset(kinds(settings))


def _older_than(settings: Settings, older_than: str | None) -> float:
    value = older_than if older_than is not None else settings.summarize.after
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise UsageError(f"--older-than: {exc}") from None


# --- windows ------------------------------------------------------------------

# Statements name the lineage's rule where it applies ({unsummarized}, {summarized}): constant fragments
# composed once, here; values are always parameters.
WINDOWS = """
SELECT e.agent, date_trunc('day', e.created_at AT TIME ZONE 'UTC') AS day, count(*) AS episodes,
       sum(length(e.content)) AS chars
FROM episodes e
WHERE e.kind = ANY(%(kinds)s) AND e.created_at < %(before)s AND (%(agent)s::text IS NULL OR e.agent = %(agent)s)
  AND {unsummarized}
GROUP BY 1, 2 ORDER BY 2, 1
LIMIT %(limit)s
""".format(unsummarized=lineage_mod.UNSUMMARIZED)
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


def windows(
    conn: Memory,
    *,
    older_than: str | None = None,
    agent: str | None = None,
    limit: int | None = None,
) -> list[Window]:
    """Windows (agent, UTC day) wholly older than older_than with episodes no summary holds yet, oldest first."""
    settings = conn.settings
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit must be positive, got {limit}")
    kinds_ = kinds(settings)
    if not kinds_:
        raise NothingToDo(
            "nothing to summarize: [summarize] kinds is empty and [retention] limits no kind but "
            'summary (e.g. [retention] raw = "30d")'
        )
    now = conn.one(NOW)["now"].astimezone(UTC)
    edge = now - datetime.timedelta(seconds=_older_than(settings, older_than))
    before = datetime.datetime.combine(edge.date(), datetime.time(), UTC)
    rows = conn.execute(
        WINDOWS, {"kinds": kinds_, "before": before, "agent": agent, "limit": limit}
    ).fetchall()
    found = []
    for row in rows:
        window = Window(row["agent"], row["day"].replace(tzinfo=UTC), row["episodes"], row["chars"])
        earlier = conn.execute(EARLIER_SUMMARY, (window.agent, window.end)).fetchone()
        window.addendum_to = earlier["id"] if earlier else None
        found.append(window)
    return found


def plan(conn: Memory, **selection: Any) -> list[dict]:
    """Dry run: the windows that would be summarized, their episode counts and estimated input tokens."""
    return [
        {
            "agent": w.agent,
            "window_start": w.start,
            "window_end": w.end,
            "episodes": w.episodes,
            "tokens_in": math.ceil(int(w.chars) / 4),
            "addendum_to": w.addendum_to,
        }
        for w in windows(conn, **selection)
    ]


# --- one window ---------------------------------------------------------------


def summarize_window(
    conn: Memory, chat: OllamaChat, budget: Budget, agent: str, day: str, episodes: Iterable[dict]
) -> Summary:
    """Ask the model for one summary of the window: in one request, or parts first and then their summaries
    in rounds. Episodes are consumed as the parts fill; the parts' summaries wait in a temporary table."""
    result = Summary("")
    parts = Parts(conn)
    system = chat_mod.SYSTEM_PROMPT.format(agent=agent, day=day, what=chat_mod.ENTRIES)
    room = budget.user_room(system)
    for batch in chat_mod.groups(chat_mod.episode_lines(episodes, room), room):
        parts.add(1, chat_mod.ask(chat, budget, system, "\n".join(batch), result))
    result.parts = parts.count(1)
    if not result.parts:
        raise WindowFailed("the window has no episodes left to summarize")
    system = chat_mod.SYSTEM_PROMPT.format(agent=agent, day=day, what=chat_mod.PART_SUMMARIES)
    room = budget.user_room(system)
    while (count := parts.count(result.rounds)) > 1:
        merged = sum(
            1 for _ in chat_mod.groups(chat_mod.labelled(parts.texts(result.rounds), count), room)
        )
        if merged >= count:
            raise WindowFailed(
                f"the summaries of {count} parts do not shrink into the context of "
                f"{budget.num_ctx} tokens"
            )
        for group in chat_mod.groups(chat_mod.labelled(parts.texts(result.rounds), count), room):
            parts.add(
                result.rounds + 1, chat_mod.ask(chat, budget, system, "\n".join(group), result)
            )
        result.rounds += 1
    result.text = next(parts.texts(result.rounds))
    return result


# --- a window's input and its parts, in temporary tables -----------------------

# The window's episodes as one statement's snapshot saw them: the lineage is written from this record and the
# sources are re-checked against it, so an episode backdated into the window meanwhile is never claimed (the
# next run summarizes it in an addendum). Repeats (memctl.write.repeats) are recorded, so the lineage holds
# them, but only the earliest of each first's group in the window is fed (lead), with how many times the group
# was seen in the window (seen) and when last. upto: bytes of fed content up to and including the episode (1
# for one not fed), in time order (so it grows strictly): the key pages of about PAGE_BYTES are cut by.
CREATE_INPUT = """
CREATE TEMPORARY TABLE IF NOT EXISTS summarize_input (
    upto bigint PRIMARY KEY, id bigint NOT NULL, created_at timestamptz NOT NULL, content_hash bytea NOT NULL,
    kind text NOT NULL, source text, importance smallint NOT NULL, lead boolean NOT NULL, seen integer NOT NULL,
    last_seen timestamptz NOT NULL)
"""
CLEAR_INPUT = "TRUNCATE summarize_input"
RECORD_INPUT = """
INSERT INTO summarize_input (upto, id, created_at, content_hash, kind, source, importance, lead, seen, last_seen)
SELECT sum(CASE WHEN w.lead THEN w.bytes ELSE 1 END) OVER (ORDER BY w.created_at, w.id), w.id, w.created_at,
       w.content_hash, w.kind, w.source, w.importance, w.lead, w.seen, w.last_seen
FROM (SELECT e.id, e.created_at, e.content_hash, e.kind, e.source, e.importance, octet_length(e.content) AS bytes,
             row_number() OVER g = 1 AS lead, count(*) OVER g AS seen, max(e.created_at) OVER g AS last_seen
      FROM episodes e
      WHERE e.agent = %(agent)s AND e.created_at >= %(start)s AND e.created_at < %(end)s AND e.kind = ANY(%(kinds)s)
        AND {unsummarized}
      WINDOW g AS (PARTITION BY coalesce(e.repeat_of, e.id) ORDER BY e.created_at, e.id
                   ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)) w
""".format(unsummarized=lineage_mod.UNSUMMARIZED)
# The next page: the fed episodes up to `bytes` past `base`, or the next one alone when it is longer. A source
# deleted since it was recorded comes back without content.
INPUT_PAGE = """
SELECT i.upto, i.created_at, i.source, e.content, i.seen, i.last_seen
FROM summarize_input i LEFT JOIN episodes e ON e.agent = %(agent)s AND e.id = i.id
WHERE i.lead AND i.upto > %(base)s::bigint
  AND i.upto <= greatest(%(base)s::bigint + %(bytes)s::bigint,
                         (SELECT min(upto) FROM summarize_input WHERE lead AND upto > %(base)s::bigint))
ORDER BY i.upto LIMIT %(rows)s
"""
CREATE_PARTS = """
CREATE TEMPORARY TABLE IF NOT EXISTS summarize_parts (
    round integer, seq integer, text text NOT NULL, PRIMARY KEY (round, seq))
"""
CLEAR_PARTS = "TRUNCATE summarize_parts"
ADD_PART = "INSERT INTO summarize_parts (round, seq, text) VALUES (%s, %s, %s)"
PARTS_OF_ROUND = (
    "SELECT seq, text FROM summarize_parts WHERE round = %s AND seq > %s ORDER BY seq LIMIT %s"
)
DROP_SCRATCH = "DROP TABLE IF EXISTS pg_temp.summarize_input, pg_temp.summarize_parts"


def record_input(conn: Memory, window: Window, kinds_: list[str]) -> int:
    """Record the window's episodes that no summary holds yet; how many there are."""
    conn.execute(CREATE_INPUT)
    conn.execute(CLEAR_INPUT)
    return conn.execute(
        RECORD_INPUT,
        {"agent": window.agent, "start": window.start, "end": window.end, "kinds": kinds_},
    ).rowcount


def input_episodes(conn: Memory, agent: str) -> Iterator[dict]:
    """The recorded episodes in time order (created_at, source, content), read a page at a time."""
    base = 0
    while True:
        page = conn.execute(
            INPUT_PAGE, {"agent": agent, "base": base, "bytes": PAGE_BYTES, "rows": PAGE_ROWS}
        ).fetchall()
        if not page:
            return
        base = page[-1]["upto"]
        for row in page:
            if row["content"] is None:
                raise WindowFailed("a source episode was deleted while summarizing")
            if (
                row["seen"] > 1
            ):  # a first's repeats in the window: its text once, with how often and when
                first, last = row["created_at"].astimezone(UTC), row["last_seen"].astimezone(UTC)
                row["content"] += (
                    f" (repeated: seen {row['seen']} times, first {first:%H:%M}, last {last:%H:%M} UTC)"
                )
            yield row
        del page


class Parts:
    """One window's part summaries, round by round, in a temporary table rather than in memory."""

    def __init__(self, conn: Memory) -> None:
        self.conn = conn
        self.counts: dict[int, int] = {}
        conn.execute(CREATE_PARTS)
        conn.execute(CLEAR_PARTS)

    def add(self, round_: int, text: str) -> None:
        self.counts[round_] = self.count(round_) + 1
        self.conn.execute(ADD_PART, (round_, self.counts[round_], text))

    def count(self, round_: int) -> int:
        return self.counts.get(round_, 0)

    def texts(self, round_: int) -> Iterator[str]:
        seq = 0
        while rows := self.conn.execute(PARTS_OF_ROUND, (round_, seq, PARTS_PAGE)).fetchall():
            yield from (r["text"] for r in rows)
            seq = rows[-1]["seq"]


# --- writing a summary --------------------------------------------------------

TRY_LOCK = "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS ok"
UNLOCK = "SELECT pg_advisory_unlock(%s, hashtext(%s))"
# The recorded sources, locked against delete until the summary commits: how many are unchanged, how many
# some summary holds already (another run finished them).
RECHECK = """
WITH held AS (
    SELECT e.content_hash = i.content_hash AS unchanged, {summarized} AS summarized
    FROM summarize_input i JOIN episodes e ON e.agent = %(agent)s AND e.id = i.id
    FOR SHARE OF e)
SELECT count(*) FILTER (WHERE unchanged) AS unchanged, count(*) FILTER (WHERE summarized) AS summarized FROM held
""".format(summarized=lineage_mod.SUMMARIZED)
# What the summary's meta says of its sources (names in code point order, as Python sorts them).
INPUT_FACTS = """
SELECT max(importance) AS importance,
       array_agg(DISTINCT source COLLATE "C" ORDER BY source COLLATE "C") FILTER (WHERE source <> '') AS source_names,
       array_agg(DISTINCT kind COLLATE "C" ORDER BY kind COLLATE "C") AS kinds,
       count(*) FILTER (WHERE NOT lead) AS repeats
FROM summarize_input
"""


def _write(conn: Memory, name: str, window: Window, sources: int, summary: Summary) -> int | None:
    """Summary episode and lineage in one transaction; None if another run summarized these episodes meanwhile."""
    settings = conn.settings
    from memctl.records import episodes as episodes_mod
    from memctl.write import gate, store

    with conn.transaction():
        held = conn.one(RECHECK, {"agent": window.agent})
        if held["summarized"]:
            return None
        if held["unchanged"] != sources:
            raise WindowFailed(
                f"{sources - held['unchanged']} source episode(s) were deleted or changed while "
                "summarizing"
            )
        facts = conn.one(INPUT_FACTS)
        meta = {
            "window_start": window.start.isoformat(),
            "window_end": window.end.isoformat(),
            "model": name,
            "sources": sources,
            "repeats": facts["repeats"],
            "source_names": facts["source_names"] or [],
            "kinds": facts["kinds"],
            "parts": summary.parts,
            "rounds": summary.rounds,
            "requests": summary.requests,
            "tokens_in": summary.tokens_in,
            "tokens_out": summary.tokens_out,
        }
        if window.addendum_to is not None:
            meta["addendum_to"] = window.addendum_to
        header = f"Summary of {sources} episode(s) of agent {window.agent} on {window.day} (UTC):"
        try:
            summary_id = episodes_mod.add(
                conn,
                f"{header}\n{summary.text}",
                kind=SUMMARY_KIND,
                source=f"{SOURCE_PREFIX}{name}",
                agent=window.agent,
                importance=facts["importance"],
                created_at=window.end,
                meta=meta,
            )
        except Unavailable:
            raise
        except (
            MemctlError
        ) as exc:  # a blocked source, a write policy: this window's summary is refused
            raise WindowFailed(f"the summary was refused: {exc}") from None
        if summary_id is None:
            raise WindowFailed("the summary was not stored (importance 0 by the write policy)")
        admit = gate.Gate(conn, settings)
        store.insert_window_lineage(conn, admit.window_lineage(window.agent, summary_id))
    return summary_id


@dataclass
class RunResult:
    written: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    skipped: int = 0  # windows another run held or finished meanwhile


def run(
    conn: Memory,
    *,
    older_than: str | None = None,
    agent: str | None = None,
    limit: int | None = None,
    chat: OllamaChat | None = None,
) -> RunResult:
    """Summarize every due window, one transaction each; recorded as job 'summarize'.

    A window whose answer is no summary fails alone (listed in the result and the job's detail); Ollama down,
    slow or failing raises EmbedderUnavailable (exit 3), an unknown model UnknownModel (exit 1).
    """
    settings = conn.settings
    from memctl.records import jobs

    name = model(settings)
    if not name:
        raise ConfigError(
            'no chat model: set [summarize] model in the configuration (e.g. model = "llama3.2:3b")'
        )
    chat = chat or chat_mod.make_chat(settings, name)
    result = RunResult()
    with jobs.record(conn, JOB) as job:
        budget = Budget.for_model(chat.context_tokens(), settings.summarize.context)
        for window in windows(conn, older_than=older_than, agent=agent, limit=limit):
            _one(conn, chat, name, budget, window, result)
        conn.execute(DROP_SCRATCH)
        job.rows = len(result.written)
        job.detail = {
            "model": name,
            "num_ctx": budget.num_ctx,
            "written": result.written,
            "failed": result.failed,
            "skipped": result.skipped,
        }
        if result.failed:
            job.outcome = "partial"
            job.error = f"{len(result.failed)} window(s) failed: " + "; ".join(
                f"{f['agent']} {f['window_start'][:10]}: {f['error']}" for f in result.failed[:5]
            )
    return result


def _one(conn: Memory, chat, name, budget, window: Window, result: RunResult) -> None:
    settings = conn.settings
    key = f"{window.agent}/{window.day}"
    if not conn.one(TRY_LOCK, (LOCK_CLASS, key))["ok"]:
        refused = locks.foreign(
            locks.holder(conn, LOCK_CLASS, name=key), "summarize"
        )  # an agent's session holds it
        if refused is None:
            result.skipped += 1  # another memctl summarizes this window
        else:
            result.failed.append(
                {
                    "agent": window.agent,
                    "window_start": window.start.isoformat(),
                    "window_end": window.end.isoformat(),
                    "error": str(refused),
                }
            )
        return
    try:
        sources = record_input(conn, window, kinds(settings))
        if not sources:
            result.skipped += 1
            return
        summary = summarize_window(
            conn, chat, budget, window.agent, window.day, input_episodes(conn, window.agent)
        )
        summary_id = _write(conn, name, window, sources, summary)
        if summary_id is None:
            result.skipped += 1
            return
        result.written.append(
            {
                "summary_id": summary_id,
                "agent": window.agent,
                "window_start": window.start,
                "window_end": window.end,
                "sources": sources,
                "tokens_in": summary.tokens_in,
                "tokens_out": summary.tokens_out,
                "parts": summary.parts,
            }
        )
    except WindowFailed as exc:
        result.failed.append(
            {
                "agent": window.agent,
                "window_start": window.start.isoformat(),
                "window_end": window.end.isoformat(),
                "error": str(exc),
            }
        )
    finally:
        conn.execute(UNLOCK, (LOCK_CLASS, key))


# --- status ------------------------------------------------------------------

OVERDUE = """
SELECT count(*) AS n, min(e.created_at) AS oldest FROM episodes e
WHERE e.kind = ANY(%s) AND e.created_at < now() - make_interval(secs => %s) AND {unsummarized}
""".format(unsummarized=lineage_mod.UNSUMMARIZED)


def overdue(conn: Memory) -> str | None:
    """A warning when episodes should have been summarized two days ago and are not (None when all is well)."""
    settings = conn.settings if conn.has_settings else None
    if settings is None or model(settings) is None or not kinds(settings):
        return None
    after = settings.summarize.after
    late = (
        parse_duration(after) + 86400 + OVERDUE_GRACE_S
    )  # its whole window is past `after`, plus two runs
    row = conn.one(OVERDUE, (kinds(settings), late))
    if not row["n"]:
        return None
    return (
        f"summaries are overdue: {row['n']} episode(s) of {', '.join(kinds(settings))} older than "
        f"{late / 86400:.0f}d have no summary (oldest {row['oldest']:%Y-%m-%d}; [summarize] after = {after}); "
        "prune keeps them until one exists: run memctl summarize or enable memctl-summarize.timer "
        f"(memctl jobs --job {JOB})"
    )
