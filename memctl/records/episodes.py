"""Episodes: an append-only log of what happened, split into chunks for search.

A write stores text and metadata only and queues its chunks for the embed
worker; it never waits for an embedding.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from memctl import overlap, places, redact

from memctl.files import jsonl
from memctl.config import Settings
from memctl.db import locks
from memctl.errors import BadValue, Blocked, InvalidInput, MemctlError, NotFound
from memctl.write import admission, erased, gate, identity, repeats, store
from memctl.records.filters import filters, where

if TYPE_CHECKING:
    from memctl.db.memory import Memory

FIELDS = ("content", "kind", "source", "agent", "importance", "created_at", "meta")


def add(conn: Memory, content: Any, **fields: Any) -> int | None:
    """Store one episode through the gate; returns its id, or None when the write policy drops it (importance 0).

    Fields as add_episode's; a repeat is stored (and its id returned) all the same.
    """
    return add_episode(conn, content, **fields).id


@dataclass(frozen=True)
class Added:
    id: int | None  # None: not stored (importance 0 by the write policy)
    folded_into: int | None = None  # a repeat (memctl.write.repeats): the first's id; not embedded
    stored: admission.Episode | None = (
        None  # the episode as the gate admitted it (what a reply may echo)
    )


def add_episode(
    conn: Memory,
    content: Any,
    *,
    kind: Any = None,
    source: Any = None,
    agent: Any = None,
    importance: Any = None,
    created_at: Any = None,
    meta: Any = None,
    redactor: redact.Redactor | None = None,
) -> Added:
    """Store one episode through the gate, folded into the first it repeats ([episodes] fold, repeat_window).

    Secrets are redacted first ([redaction] mode), so none reaches the table, the chunks or the
    embedder; `redactor` (default: one from the settings) counts what was replaced.
    """
    settings = conn.settings
    admit = gate.Gate(conn, settings, redactor)
    episode = admit.new_episode(
        content,
        kind=kind,
        source=source,
        agent=agent,
        importance=importance,
        created_at=created_at,
        meta=meta,
    )
    if episode is None:
        return Added(None)
    with admit.writing():
        conn.execute(locks.WRITE_LOCK)
        first = repeats.fold_one(conn, episode, repeats.window_seconds(settings))
        return Added(store.insert_episode(conn, episode, repeat_of=first), first, episode)


COLUMNS = "id, agent, kind, source, importance, created_at, meta, content"
SHOW = f"SELECT {COLUMNS}, repeat_of, repeats, last_seen_at FROM episodes WHERE id = %s"  # noqa: S608 - constant
SHOW_CHUNKS = """
SELECT c.id, c.seq, length(c.content) AS chars,
       (SELECT count(*) FROM embed_queue q WHERE q.agent = c.agent AND q.chunk_id = c.id) AS pending,
       (SELECT string_agg(f.error, '; ') FROM embed_failures f WHERE f.agent = c.agent AND f.chunk_id = c.id) AS error
FROM chunks c WHERE c.agent = %s AND c.episode_id = %s ORDER BY c.seq
"""


def show(conn: Memory, episode_id: int) -> dict:
    row = conn.execute(SHOW, (episode_id,)).fetchone()
    if row is None:
        raise NotFound(f"no episode {episode_id}")
    row["chunks"] = conn.execute(SHOW_CHUNKS, (row["agent"], episode_id)).fetchall()
    return row


def list_episodes(
    conn: Memory,
    *,
    agent: str | None = None,
    kind: str | None = None,
    source: str | None = None,
    since: str | None = None,
    limit: int = 50,
) -> list[dict]:
    from psycopg import sql

    clauses, params = filters(agent=agent, kind=kind, source=source, since=since)
    query = sql.SQL(
        "SELECT {cols} FROM episodes e {where} ORDER BY e.created_at DESC, e.id DESC LIMIT {limit}"
    ).format(
        cols=sql.SQL(", ").join(
            sql.SQL("e.{}").format(sql.Identifier(c.strip())) for c in COLUMNS.split(",")
        ),
        where=where(clauses),
        limit=sql.Literal(int(limit)),
    )
    return conn.execute(query, params).fetchall()


# A first goes with its repeats (one folded memory); a repeat alone is uncounted from its first.
DELETE = """
WITH target AS (SELECT agent, id FROM episodes WHERE id = ANY(%s))
DELETE FROM episodes e USING target t
WHERE e.agent = t.agent AND (e.id = t.id OR e.repeat_of = t.id)
RETURNING e.id, e.agent, e.repeat_of, e.created_at
"""


TARGETS = """
WITH target AS (SELECT agent, id FROM episodes WHERE id = ANY(%s))
SELECT e.agent, e.id FROM episodes e JOIN target t ON e.agent = t.agent AND (e.id = t.id OR e.repeat_of = t.id)
"""


@dataclass
class Deletion:
    ids: list[int]
    removed: dict[str, int] = field(
        default_factory=dict
    )  # rows per table (memctl.records.erasures.count_rows)
    ledger: Any = None  # the erasure ledger's entry
    summaries: list[int] = field(
        default_factory=list
    )  # summaries built from them, deleted with them


def delete_episodes(conn: Memory, ids: list[int]) -> Deletion:
    """Delete episodes with their chunks and vectors (all models), a first with its repeats, and every summary built
    from any of them (removed, never rewritten: docs/retention.md), recorded in the erasure ledger
    (memctl.records.erasures) with the rows removed per table; runbook runs that recorded a deleted episode lose the
    link and their output tail, job log rows and run outputs quoting one lose the quote."""
    from memctl.records import erasures

    secret = erasures.load_key()
    quotes: list[str] = []
    with conn.transaction():
        keys = [(r["agent"], r["id"]) for r in conn.execute(TARGETS, (list(ids),)).fetchall()]
        summaries = erasures.summaries_of(conn, keys)
        keys += summaries
        items, texts = erasures.capture_episodes(conn, keys, secret)
        before = erasures.count_rows(conn, keys)
        gone_sources = erasures.sources_gone(conn, summaries)
        rows = conn.execute(DELETE, (list(ids) + [i for _, i in summaries],)).fetchall()
        gone = {r["id"] for r in rows}
        repeats.recount(conn, [r for r in repeats.deleted_repeats(rows) if r[1] not in gone])
        removed = erasures.removed(before, erasures.count_rows(conn, keys))
        removed["summary_sources_pruned"] = gone_sources
        removed["runbook_runs"] = erasures.unlink_runs(conn, keys, secret, quotes)
        removed.update(erasures.scrub_quotes(conn, texts, secret, quotes))
    summary_ids = {i for _, i in summaries}
    done = Deletion(
        [i for i in sorted(gone) if i not in summary_ids],
        removed,
        summaries=sorted(gone & summary_ids),
    )
    if rows:
        entry = erasures.new_entry(
            conn,
            "episode_delete",
            key=secret,
            target=",".join(map(str, done.ids)),
            counts=removed,
            items={"episodes": items, "quotes": quotes, "summaries": done.summaries},
        )
        done.ledger = erasures.record(conn, entry)
    return done


# --- repeats, for the read side --------------------------------------------

REPEAT_INFO = """
SELECT id, repeat_of, repeats, created_at AS first_seen, coalesce(last_seen_at, created_at) AS last_seen
FROM episodes WHERE id = ANY(%(ids)s) AND (%(agent)s::text IS NULL OR agent = %(agent)s)
"""
REPEATS_OF = """
SELECT id, agent, kind, source, importance, created_at, meta, content FROM episodes
WHERE agent = %(agent)s AND (id = %(id)s OR repeat_of = %(id)s)
ORDER BY created_at, id LIMIT %(limit)s
"""


def repeat_info(conn: Memory, ids: Iterable[int], agent: str | None = None) -> dict[int, dict]:
    """{id: {repeats, first_seen, last_seen, repeat_of}} of stored episodes (memctl.write.repeats): a first's
    repeats (0: none) and the span it was seen in; a repeat's repeat_of names its first. `agent` routes it to
    one shard on Citus."""
    rows = conn.execute(REPEAT_INFO, {"ids": list(ids), "agent": agent}).fetchall()
    return {r.pop("id"): r for r in rows}


def repeats_of(conn: Memory, agent: str, first_id: int, limit: int = 1000) -> list[dict]:
    """A first and every repeat of it, oldest first (search --all), at most `limit` rows."""
    return conn.execute(REPEATS_OF, {"agent": agent, "id": first_id, "limit": limit}).fetchall()


# --- bulk import -----------------------------------------------------------


@dataclass
class ImportResult:
    imported: int = 0
    dropped: int = 0  # importance 0 by policy
    chunks: int = 0
    folded: int = 0  # stored as repeats of an earlier episode: not embedded (memctl.write.repeats)
    already: int = (
        0  # stored before, by an import of the same records (memctl.write.identity): skipped
    )
    erased: int = 0  # records whose text the erasure ledger holds: left out (memctl.write.erased)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    redactor: redact.Redactor | None = None  # what was redacted; default: from the settings


def parse_jsonl(
    settings: Settings, lines: Iterable[bytes], *, skip_invalid: bool, result: ImportResult
) -> Iterator[gate.NewEpisode]:
    """Validated episodes from JSONL (memctl.files.jsonl); a bad line raises (naming it) unless skip_invalid."""

    def skip(error: jsonl.LineError) -> None:
        if not skip_invalid:
            raise jsonl.LineError(
                error.number, f"{error.reason}; nothing was imported", error.exit_code
            )
        result.skipped.append((error.number, error.reason))

    limits = gate.values.Limits.of(settings)  # read once, not per line
    for number, item in jsonl.read(lines, fields=FIELDS, required=("content",), on_error=skip):
        try:
            episode = _from_record(settings, item, limits)
        except (InvalidInput, BadValue) as exc:
            skip(jsonl.at(number, exc))
            continue
        if episode.importance == 0:
            result.dropped += 1
            continue
        episode.line = number
        yield episode


def _from_record(settings: Settings, item: dict, limits=None) -> gate.NewEpisode:
    return gate.validate(
        settings,
        item["content"],
        kind=item.get("kind"),
        source=item.get("source"),
        agent=item.get("agent"),
        importance=item.get("importance"),
        created_at=item.get("created_at"),
        meta=item.get("meta"),
        limits=limits,
    )


BATCH = 5000
# The first batch is smaller, so the database has work while this process reads the next.
FIRST_BATCH = 500


def import_episodes(
    conn: Memory,
    episodes: Iterable[gate.NewEpisode],
    *,
    result: ImportResult,
    occurrences: identity.Occurrences | None = None,
    refused: Callable[[gate.NewEpisode, MemctlError], None] | None = None,
    then: Callable[[Any], None] | None = None,
) -> ImportResult:
    """Load episodes with binary COPY, in one transaction: all of them or none.

    Every episode passes the gate on its way in (result.redactor, default from the settings). A record
    stored before (memctl.write.identity; `occurrences` counts the stream's untimed records, carried from
    one call to the next by `memctl ingest`) is skipped and counted in result.already. `refused`: a record
    the gate refuses (blocked source, secret in block mode) is handed to it and skipped instead of failing
    the whole. `then(conn)` runs in the transaction after the last batch (ingest's cursor).
    """
    settings = conn.settings
    occurrences = occurrences if occurrences is not None else identity.Occurrences()
    key = erased.readable_key(
        conn
    )  # each record's ledger digest is made here, beside the copy (store.copy_episodes)
    if result.redactor is None:
        result.redactor = redact.Redactor.from_settings(settings)
    admit = gate.Gate(conn, settings, result.redactor, bulk=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    fold = _Fold(repeats.window_seconds(settings))
    with (
        admit.writing()
    ):  # a source blocked while the file was read: refused at the end, nothing kept
        # GIN indexes gather inserts in a pending list; a larger one for this
        # transaction merges it in fewer, larger passes.
        conn.execute("SET LOCAL gin_pending_list_limit = '64MB'")
        conn.execute(locks.WRITE_LOCK)
        # Under locks.WRITE_LOCK no model registers while this transaction runs.
        queued = store.queued_models(conn)
        batch: list[admission.Episode] = []
        keys: list[bytes] = []
        digests: list[str] = []
        # A batch is copied on a second thread while this one parses and admits the next (the gate reads
        # nothing per record in bulk, so the connection is the copy's alone); its folding is planned first,
        # alone (held).
        size = min(FIRST_BATCH, BATCH)
        with overlap.Overlap(conn) as copier:
            for episode in episodes:
                try:
                    admitted = admit.episode(episode)
                except (
                    InvalidInput,
                    BadValue,
                    Blocked,
                ) as exc:  # a blocked source, a refused secret
                    copier.wait()  # the connection is the copy's until it returns (memctl.overlap)
                    if erased.held(
                        conn, episode.content
                    ):  # erased here: left out, whatever else it is
                        result.erased += 1
                        continue
                    if refused is not None:
                        refused(episode, exc)
                        continue
                    raise (jsonl.at(episode.line, exc) if episode.line else exc) from None
                if admitted is None:
                    result.dropped += 1
                    continue
                admitted.norm_hash  # noqa: B018 (every row stores it: computed here, the copying thread is the slower)
                batch.append(admitted)
                keys.append(
                    occurrences.key(
                        admitted.agent, admitted.source, episode.created_at, admitted.content_hash
                    )
                )
                digests.append(places.digest(key, admitted.content) if key is not None else "")
                if len(batch) >= size:
                    copier.run(
                        _copy_batch,
                        conn,
                        batch,
                        keys,
                        now,
                        queued,
                        result,
                        fold,
                        (key, digests),
                        held=True,
                    )
                    batch, keys, digests, size = [], [], [], BATCH
            if batch:
                copier.run(
                    _copy_batch,
                    conn,
                    batch,
                    keys,
                    now,
                    queued,
                    result,
                    fold,
                    (key, digests),
                    held=True,
                )
        if then is not None:
            then(conn)
    return result


@dataclass
class _Fold:
    window: float | None
    locked: set[str] = field(default_factory=set)  # agents whose fold lock this transaction holds


def _copy_batch(
    conn: Memory,
    batch: list[admission.Episode],
    keys: list[bytes],
    now,
    queued: list[int],
    result: ImportResult,
    fold: _Fold,
    ledger: tuple,
    release=None,
) -> None:
    copied = store.copy_episodes(
        conn,
        batch,
        now=now,
        queued=queued,
        window=fold.window,
        locked=fold.locked,
        release=release,
        keys=keys,
        ledger=ledger if ledger[0] is not None else None,
    )
    result.imported += len(copied.ids)
    result.already += copied.already
    result.erased += len(copied.erased)
    result.chunks += copied.chunks
    result.folded += copied.folded
