"""Repeats folded (docs/repeats.md): an episode that says again what an earlier one of the same agent, kind, source
and importance said, within [episodes] repeat_window of that one's last sighting, is stored as its repeat.

A repeat is a row of its own (its text, time and meta kept, `repeat_of` = the first's id) with no chunks, so
it is never embedded; the first counts it (`repeats`: the repeat rows linked to it now, the first not
counted) and carries the latest time it was seen (`last_seen_at`, NULL while it has no repeat). "The same"
is the same fold key (norm_hash): the normalized text (NFKC, case folded, whitespace collapsed; punctuation and
digits kept, so "deploy?" and "deploy!", "disk 91%" and "disk 92%" are two), the same meta, and, for an episode
redaction changed, the same text as it came (a keyed digest: secret_digest), so two secrets redacted alike differ.

The window slides: a repeat extends its first's span, so an alert every five minutes for a week is one
first with its repeats; a gap longer than the window starts a new first. Writers of one agent take turns
on a lock (LOCK_AGENT, memctl.db.locks) while they look up and link, so two processes writing the same text at
once make one first and one repeat. The candidate first is locked against a concurrent prune (FOR NO KEY
UPDATE), which deletes a first only once no repeat of it is left (memctl.retention.deletion).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import unicodedata
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterable

from memctl.db import locks
from memctl.write.values import WRITER

if TYPE_CHECKING:
    from memctl.db.memory import Memory

LOCK_CLASS = 0x6D726570  # "mrep": a space of memctl.db.locks.KEY_LOCK, one lock per agent
HASH_BYTES = 16  # of sha256: an index key half the size, collisions still out of reach


def normalize(text: str) -> str:
    """The text two episodes must share to be one event: NFKC, case folded, whitespace collapsed and trimmed.
    Punctuation is kept: "Should we roll back the deploy?" is not "... deploy!"."""
    if (
        not text.isascii()
    ):  # ASCII is its own NFKC form; skipping the pass is most of an import's cost here
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.casefold().split())


def norm_hash(
    text: str, meta: Mapping[str, Any] | None = None, secret: bytes | None = None
) -> bytes:
    """The fold key: the normalized text, the meta exactly (keys sorted), and `secret_digest` when redaction
    changed the episode. Text holds no NUL (the gate refuses it), so the parts cannot run into each other."""
    digest = hashlib.sha256(normalize(text).encode("utf-8"))
    if meta:
        digest.update(b"\0meta\0" + _canonical(meta))
    if secret is not None:
        digest.update(b"\0secret\0" + secret)
    return digest.digest()[:HASH_BYTES]


def secret_digest(key: bytes, fields: dict) -> bytes:
    """An HMAC (sha256, under the database's fold_key) of an episode's fields as they came, before redaction: two
    different tokens redacted alike get different fold keys, and without the key no guess can be checked."""
    return hmac.new(key, _canonical(fields), hashlib.sha256).digest()


def _canonical(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    ).encode("utf-8")


FOLD_KEY = (
    "SELECT memctl_fold_key() AS key"  # sql/0023: for memctl's sessions, an agent's role included
)


def fold_key(conn: Memory) -> bytes:
    return bytes(conn.one(FOLD_KEY)["key"])


def window_seconds(settings) -> float | None:
    """[episodes] repeat_window in seconds, or None when [episodes] fold is off (or no settings are given)."""
    from memctl.config import parse_duration

    if settings is None or not settings.episodes.fold:
        return None
    return parse_duration(settings.episodes.repeat_window)


LOCK_AGENT = (
    locks.KEY_LOCK
)  # (LOCK_CLASS, agent): memctl_lock_key, a lock no agent's session may take
# Imports take their agents' locks as their batches meet them, in no order known ahead: two at once could each
# hold an agent the other waits for, so they first take turns on this one.
LOCK_IMPORTS = locks.KEY_LOCK  # (IMPORT_CLASS, '')
IMPORT_CLASS = LOCK_CLASS + 1


def lock_agent(conn: Memory, agent: str) -> None:
    """Writers of one agent fold in turn until their transaction ends."""
    conn.execute(LOCK_AGENT, (LOCK_CLASS, agent))


# --- one episode (episode add, the MCP server, summaries, runbook records) ---------------------------

# The latest first of the same agent, text, kind, source and importance before `at`, seen within the window of
# `at`; locked so that prune cannot delete it before the repeat is linked.
FIND_FIRST = """
SELECT id FROM episodes
WHERE agent = %(agent)s AND norm_hash = %(norm)s AND repeat_of IS NULL AND kind = %(kind)s
  AND source IS NOT DISTINCT FROM %(source)s AND importance = %(importance)s
  AND created_at <= coalesce(%(at)s, now())
  AND coalesce(last_seen_at, created_at) >= coalesce(%(at)s, now()) - make_interval(secs => %(window)s)
ORDER BY created_at DESC, id DESC LIMIT 1
FOR NO KEY UPDATE
"""
BUMP = (
    WRITER
    + """
UPDATE episodes SET repeats = repeats + 1,
       last_seen_at = greatest(coalesce(last_seen_at, created_at), coalesce(%(at)s, now()))
WHERE agent = %(agent)s AND id = %(id)s
"""
)


def fold_one(conn: Memory, episode, window: float | None) -> int | None:
    """The first this admitted episode repeats, counted already; None: it is a first (call in the write's
    transaction, before inserting it)."""
    if window is None:
        return None
    lock_agent(conn, episode.agent)
    params = {
        "agent": episode.agent,
        "norm": episode.norm_hash,
        "kind": episode.kind,
        "source": episode.source,
        "importance": episode.importance,
        "at": episode.created_at,
        "window": window,
    }
    row = conn.execute(FIND_FIRST, params).fetchone()
    if row is None:
        return None
    conn.execute(BUMP, {**params, "id": row["id"]})
    return row["id"]


# --- a batch (episode import, memctl import) ----------------------------------------------------------

# Every first of the agent with one of these texts whose span reaches into the batch's times (lo None: any).
CANDIDATES = """
SELECT id, kind, source, importance, norm_hash, created_at, coalesce(last_seen_at, created_at) AS last_seen
FROM episodes
WHERE agent = %(agent)s AND norm_hash = ANY(%(norms)s) AND repeat_of IS NULL AND created_at <= %(hi)s
  AND (%(lo)s::timestamptz IS NULL OR coalesce(last_seen_at, created_at) >= %(lo)s)
FOR NO KEY UPDATE
"""
BUMP_MANY = (
    WRITER
    + """
UPDATE episodes f SET repeats = f.repeats + d.n,
       last_seen_at = greatest(coalesce(f.last_seen_at, f.created_at), d.latest)
FROM unnest(%(ids)s::bigint[], %(n)s::int[], %(latest)s::timestamptz[]) AS d(id, n, latest)
WHERE f.agent = %(agent)s AND f.id = d.id
"""
)
FIRST, REPEAT = (
    "first",
    "repeat",
)  # an import's word on a record: it was a first, or a repeat, where it was written


@dataclass
class _First:
    id: int
    created_at: datetime.datetime
    last_seen: datetime.datetime
    row: int | None  # its index in the batch; None: stored before


@dataclass
class BatchFold:
    """How a batch folds: per row its first's id (None: a first) and, for a first made in the batch, the
    repeats it gets in the batch and when it was last seen; the counts owed to firsts stored before."""

    repeat_of: list[int | None]
    repeats: list[int]
    last_seen: list[datetime.datetime | None]
    owed: dict[tuple[str, int], list] = field(
        default_factory=dict
    )  # (agent, id) -> [count, latest]

    @property
    def folded(self) -> int:
        return sum(r is not None for r in self.repeat_of)


def plan_batch(
    conn: Memory,
    batch: list,
    ids: list[int],
    times: list[datetime.datetime],
    window: float | None,
    hints: list[str | None] | None = None,
    locked: set[str] | None = None,
) -> BatchFold:
    """Fold a batch of admitted episodes (ids taken, times resolved) against the stored firsts and each other,
    in time order; one look-up per agent. `hints` (memctl import): FIRST keeps a record a first, REPEAT folds
    it into the latest first of its text before it whatever the window, None follows the window."""
    hints = hints or [None] * len(batch)
    fold = BatchFold([None] * len(batch), [0] * len(batch), [None] * len(batch))
    if window is None and REPEAT not in hints:
        return fold
    reach = datetime.timedelta(seconds=window or 0)
    firsts = _stored_firsts(
        conn, batch, times, reach, hints, locked if locked is not None else set()
    )
    for i in sorted(range(len(batch)), key=lambda i: (times[i], i)):
        ep, at, hint = batch[i], times[i], hints[i]
        key = (ep.agent, ep.norm_hash, ep.kind, ep.source, ep.importance)
        known = firsts.get(key)
        found = None
        if known is not None and (hint == REPEAT or (hint is None and window is not None)):
            since = _back(at, reach)
            found = max(
                (
                    f
                    for f in known
                    if f.created_at <= at
                    and (hint == REPEAT or since is None or f.last_seen >= since)
                ),
                key=lambda f: (f.created_at, f.id),
                default=None,
            )
        if found is None:
            if known is None:
                firsts[key] = [_First(ids[i], at, at, i)]
            else:
                known.append(_First(ids[i], at, at, i))
            continue
        fold.repeat_of[i] = found.id
        found.last_seen = max(found.last_seen, at)
        if found.row is not None:
            fold.repeats[found.row] += 1
            fold.last_seen[found.row] = found.last_seen
        else:
            owed = fold.owed.setdefault((ep.agent, found.id), [0, at])
            owed[0], owed[1] = owed[0] + 1, max(owed[1], at)
    return fold


def _back(at: datetime.datetime, reach: datetime.timedelta) -> datetime.datetime | None:
    """The window's start before `at`; None (no bound) when it would fall before the year 1, where an
    episode dated 0001-01-01 puts it."""
    try:
        return at - reach
    except OverflowError:
        return None


def _stored_firsts(
    conn: Memory, batch, times, reach, hints, locked: set[str]
) -> dict[tuple, list[_First]]:
    if not locked:
        conn.execute(LOCK_IMPORTS, (IMPORT_CLASS, ""))
    by_agent: dict[str, list[int]] = {}
    for i, ep in enumerate(batch):
        if hints[i] != FIRST:
            by_agent.setdefault(ep.agent, []).append(i)
    found: dict[tuple, list[_First]] = {}
    asked = []
    # One round trip for every agent's look-up (the import's copying thread plans alone meanwhile, the server
    # idle): in a pipeline where libpq has them, else one statement after another.
    with pipeline(conn):
        for agent in sorted(by_agent):
            rows = by_agent[agent]
            if agent not in locked:
                lock_agent(conn, agent)
                locked.add(agent)
            lo = (
                None
                if any(hints[i] == REPEAT for i in rows)
                else _back(min(times[i] for i in rows), reach)
            )
            params = {
                "agent": agent,
                "norms": list({batch[i].norm_hash for i in rows}),
                "hi": max(times[i] for i in rows),
                "lo": lo,
            }
            asked.append((agent, conn.execute(CANDIDATES, params)))
    for agent, cursor in asked:
        for r in cursor.fetchall():
            key = (agent, bytes(r["norm_hash"]), r["kind"], r["source"], r["importance"])
            found.setdefault(key, []).append(_First(r["id"], r["created_at"], r["last_seen"], None))
    return found


def pipeline(conn: Memory):
    """A block whose statements go in one round trip where libpq can pipeline them (read their results after it)."""
    from psycopg import Pipeline

    return conn.pipeline() if Pipeline.is_supported() else contextlib.nullcontext()


def settle(conn: Memory, fold: BatchFold) -> None:
    """Count the batch's repeats on the firsts stored before it, one statement per agent."""
    by_agent: dict[str, list] = {}
    for (agent, first), (n, latest) in fold.owed.items():
        by_agent.setdefault(agent, []).append((first, n, latest))
    for agent, rows in sorted(by_agent.items()):
        conn.execute(
            BUMP_MANY,
            {
                "agent": agent,
                "ids": [r[0] for r in rows],
                "n": [r[1] for r in rows],
                "latest": [r[2] for r in rows],
            },
        )


# --- deleting (prune, purge, episode delete) ----------------------------------------------------------

# After repeats were deleted (in this transaction): their firsts' counts go down by what went, and last_seen_at
# is found again unless the latest sighting stayed. Incremental, so a repeat linked by a writer meanwhile (which
# this statement waits for, then sees the row it updated) keeps its count.
RECOUNT = (
    WRITER
    + """
UPDATE episodes f SET repeats = greatest(f.repeats - d.n, 0),
       last_seen_at = CASE WHEN f.last_seen_at > d.newest THEN f.last_seen_at ELSE
           (SELECT max(r.created_at) FROM episodes r WHERE r.agent = f.agent AND r.repeat_of = f.id) END
FROM unnest(%(ids)s::bigint[], %(n)s::int[], %(newest)s::timestamptz[]) AS d(id, n, newest)
WHERE f.agent = %(agent)s AND f.id = d.id
"""
)
ANY_REPEAT = "SELECT EXISTS (SELECT 1 FROM episodes WHERE repeat_of IS NOT NULL) AS yes"


def any_repeat(conn: Memory) -> bool:
    """Whether any repeat is stored at all (deleting skips its repeats pass when none is)."""
    return conn.one(ANY_REPEAT)["yes"]


def recount(conn: Memory, deleted: Iterable[Any]) -> int:
    """Recount the firsts of deleted repeats; `deleted` holds (agent, first id, how many, newest created_at)
    per first. The firsts updated."""
    by_agent: dict[str, list] = {}
    for agent, first, n, newest in deleted:
        by_agent.setdefault(agent, []).append((first, n, newest))
    updated = 0
    for agent, rows in sorted(by_agent.items()):
        updated += conn.execute(
            RECOUNT,
            {
                "agent": agent,
                "ids": [r[0] for r in rows],
                "n": [r[1] for r in rows],
                "newest": [r[2] for r in rows],
            },
        ).rowcount
    return updated


def deleted_repeats(rows: Iterable[dict]) -> list[tuple]:
    """(agent, first, count, newest) per first, from deleted rows (agent, repeat_of, created_at)."""
    found: dict[tuple[str, int], list] = {}
    for r in rows:
        if r["repeat_of"] is not None:
            one = found.setdefault((r["agent"], r["repeat_of"]), [0, r["created_at"]])
            one[0], one[1] = one[0] + 1, max(one[1], r["created_at"])
    return [(agent, first, n, newest) for (agent, first), (n, newest) in found.items()]
