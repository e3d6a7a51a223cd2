"""The writers: the only statements that insert into or copy into a memory table
(places.MEMORY_TABLES).

They take only records a `memctl.write.gate.Gate` admitted (validated, source allowed, redacted): a raw
record is a TypeError. tests/test_gate.py reads the library's source and fails if such a statement
appears anywhere but here, so a new write path cannot go around the gate unnoticed.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from memctl import places
from memctl.write import admission, gate
from memctl.write.admission import (
    BlockedSource,
    Episode,
    FactValue,
    HistoryEntry,
    Lineage,
    RunRecord,
    WindowLineage,
)
from memctl.write.values import WRITER

if TYPE_CHECKING:
    from memctl.db.memory import Memory

_admitted = (
    admission.admitted
)  # a record a Gate made, not one of the same type built or copied elsewhere


def _sourced(conn: Memory, record: Any, kind: type) -> None:
    """A record that carries a source: admitted, and written inside the writing() transaction of a gate that
    allowed its source (looked at again under the blocked sources' lock before the commit: memctl.db.locks)."""
    _admitted(record, kind)
    if not gate.writing_on(conn, record.source):
        raise TypeError(
            f"an admitted {kind.__name__} from source {record.source!r} is written inside the writing() "
            "transaction of a gate that allowed that source, which confirms it is not blocked before "
            "it commits"
        )


INSERT_EPISODE = (
    WRITER
    + """
INSERT INTO episodes (agent, kind, content, content_hash, source, importance, created_at, meta, norm_hash, repeat_of)
VALUES (%(agent)s, %(kind)s, %(content)s, %(content_hash)s, %(source)s, %(importance)s,
        coalesce(%(created_at)s, now()), %(meta)s, %(norm_hash)s, %(repeat_of)s)
RETURNING id
"""
)
INSERT_CHUNK = (
    WRITER
    + """
INSERT INTO chunks (agent, episode_id, seq, content, content_hash) VALUES (%s, %s, %s, %s, %s) RETURNING id
"""
)
ENQUEUE_EPISODE = """
INSERT INTO embed_queue (model_id, agent, chunk_id)
SELECT m.id, c.agent, c.id
FROM chunks c CROSS JOIN embedding_models m
WHERE c.agent = %s AND c.episode_id = %s AND m.state IN ('active', 'backfill')
"""


def insert_episode(conn: Memory, episode: Episode, repeat_of: int | None = None) -> int:
    """One episode with its chunks, queued for every model being filled (call inside a transaction); a repeat
    (`repeat_of` its first's id, memctl.write.repeats) gets no chunks: it is never embedded."""
    from psycopg.types.json import Jsonb

    _sourced(conn, episode, Episode)
    row = conn.one(
        INSERT_EPISODE,
        {
            "agent": episode.agent,
            "kind": episode.kind,
            "content": episode.content,
            "content_hash": episode.content_hash,
            "source": episode.source,
            "importance": episode.importance,
            "created_at": episode.created_at,
            "meta": Jsonb(episode.meta),
            "norm_hash": episode.norm_hash,
            "repeat_of": repeat_of,
        },
    )
    if repeat_of is None:
        insert_chunks(conn, episode, row["id"])
    return row["id"]


def insert_chunks(conn: Memory, episode: Episode, episode_id: int) -> int:
    """The admitted episode's chunks for a stored episode (a new one, or one rewritten by redact scan --fix),
    queued; returns the queue rows added."""
    _admitted(episode, Episode)
    with conn.cursor() as cur:
        for seq, text in enumerate(episode.chunks):
            cur.execute(INSERT_CHUNK, (episode.agent, episode_id, seq, text, _digest(text)))
    return conn.execute(ENQUEUE_EPISODE, (episode.agent, episode_id)).rowcount


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


SEQUENCES = """SELECT pg_get_serial_sequence('episodes', 'id') AS episodes,
                      pg_get_serial_sequence('chunks', 'id') AS chunks"""
# One array, not a row per id: 5,000 rows cost the import's copying thread 20 ms a batch to read.
TAKE_IDS = "SELECT array(SELECT nextval(%s::regclass) FROM generate_series(1, %s)) AS ids"
COPY_EPISODES = (
    WRITER
    + """COPY episodes (id, agent, kind, content, content_hash, source, importance, created_at, meta,
                      norm_hash, repeat_of, repeats, last_seen_at, record_key)
FROM STDIN (FORMAT BINARY)"""
)
EPISODE_TYPES = [
    "int8",
    "text",
    "text",
    "text",
    "bytea",
    "text",
    "int2",
    "timestamptz",
    "jsonb",
    "bytea",
    "int8",
    "int4",
    "timestamptz",
    "bytea",
]
COPY_CHUNKS = (
    WRITER
    + "COPY chunks (id, agent, episode_id, seq, content, content_hash) FROM STDIN (FORMAT BINARY)"
)
CHUNK_TYPES = ["int8", "text", "int8", "int4", "text", "bytea"]
QUEUED_MODELS = "SELECT id FROM embedding_models WHERE state IN ('active', 'backfill') ORDER BY id"
COPY_QUEUE = "COPY embed_queue (model_id, agent, chunk_id) FROM STDIN (FORMAT BINARY)"
COPY_VECTORS = "COPY {table} (agent, chunk_id, content_hash, embedding) FROM STDIN"


def take_ids(conn: Memory, sequence: str, count: int) -> list[int]:
    if count == 0:
        return []
    return conn.one(TAKE_IDS, (sequence, count), binary=True)["ids"]


def queued_models(conn: Memory) -> list[int]:
    return [r["id"] for r in conn.execute(QUEUED_MODELS).fetchall()]


@dataclass
class Copied:
    ids: list[int]
    chunks: int = 0
    vectors: int = 0
    queued: int = 0
    folded: int = 0  # stored as repeats of a first (no chunks)
    already: int = 0  # records stored before (memctl.write.identity): skipped, not in ids
    erased: list[int] = field(
        default_factory=list
    )  # positions in the batch of records the ledger holds: left out


def copy_episodes(
    conn: Memory,
    batch: list[Episode],
    *,
    now: datetime.datetime,
    queued: list[int],
    vectors: list[list[Any] | None] | None = None,
    model=None,
    window: float | None = None,
    hints: list[str | None] | None = None,
    locked: set[str] | None = None,
    release: Callable[[], None] | None = None,
    keys: Sequence[bytes | None] | None = None,
    ledger: tuple[bytes, list[str]] | None = None,
) -> Copied:
    """Episodes with binary COPY (call inside a transaction holding memctl.db.locks.WRITE_LOCK).

    `vectors[i]`, when given, holds one vector per chunk of batch[i] made by `model` (whose
    table receives them); those chunks are not queued for that model. Repeats are folded
    (memctl.write.repeats.plan_batch: `window`, `hints`, `locked`) and get no chunks. `release` is called
    once the batch is planned, before the COPYs (memctl.db.overlap: a caller waiting for it may go on).
    `keys` (an import's records, memctl.write.identity): a record whose key is stored already is skipped
    (counted in `already`, given no id) and the others store theirs. A record whose text the erasure ledger holds
    (memctl.write.erased) is left out before all that, whatever the caller asks: its position is in `erased`;
    `ledger`, the key and the batch's digests under it, made by a caller that had the time (else made here).
    """
    from psycopg import sql
    from psycopg.types.json import Jsonb

    from memctl.write import erased as erased_mod, identity, repeats

    for episode in batch:
        _admitted(episode, Episode)
    for episode in {
        e.source: e for e in batch
    }.values():  # one episode per source: a batch holds few
        _sourced(conn, episode, Episode)
    already = 0
    # What the batch asks before it is planned, in one round trip: the planning runs alone (`release` not yet
    # called), so each round trip here is time the import's other thread waits.
    agents = [e.agent for e in batch]
    with repeats.pipeline(conn):
        sequences_asked = conn.execute(SEQUENCES)
        lookup = erased_mod.Lookup(
            conn,
            (e.content for e in batch),
            key=ledger[0] if ledger else None,
            digests=ledger[1] if ledger else None,
        )
        asked = identity.ask(conn, agents, keys) if keys is not None else None
    sequences = sequences_asked.fetchone()
    assert sequences is not None
    kept = lookup.kept()
    left_out = [i for i, k in enumerate(kept) if not k]
    if left_out:  # erased: never stored again, asked about by nothing below
        batch, agents = (
            [e for e, k in zip(batch, kept) if k],
            [a for a, k in zip(agents, kept) if k],
        )
        keys = None if keys is None else [x for x, k in zip(keys, kept) if k]
        vectors = None if vectors is None else [v for v, k in zip(vectors, kept) if k]
        hints = None if hints is None else [h for h, k in zip(hints, kept) if k]
        asked = identity.ask(conn, agents, keys) if keys is not None else None
    if asked is not None and keys is not None:  # asked: keys given
        keep = identity.unseen(asked, agents, keys)
        if not all(keep):
            batch = [e for e, k in zip(batch, keep) if k]
            keys = [k for k, fresh in zip(keys, keep) if fresh]
            vectors = None if vectors is None else [v for v, fresh in zip(vectors, keep) if fresh]
            hints = None if hints is None else [h for h, fresh in zip(hints, keep) if fresh]
            already = len(keep) - len(batch)
    copied = Copied(
        take_ids(conn, sequences["episodes"], len(batch)), already=already, erased=left_out
    )
    if not batch:
        if release is not None:
            release()
        return copied
    times = [ep.created_at or now for ep in batch]
    fold = repeats.plan_batch(conn, batch, copied.ids, times, window, hints, locked)
    copied.folded = fold.folded
    chunk_ids = take_ids(
        conn,
        sequences["chunks"],
        sum(len(e.chunks) for e, r in zip(batch, fold.repeat_of) if r is None),
    )
    if release is not None:
        release()
    with_vector: list[tuple[str, int, bytes, Any]] = []
    queue_rows: list[tuple[str, int]] = []
    with conn.cursor() as cur:
        with cur.copy(COPY_EPISODES) as copy:
            copy.set_types(EPISODE_TYPES)
            for i, (episode_id, ep) in enumerate(zip(copied.ids, batch)):
                copy.write_row(
                    (
                        episode_id,
                        ep.agent,
                        ep.kind,
                        ep.content,
                        ep.content_hash,
                        ep.source,
                        ep.importance,
                        times[i],
                        Jsonb(ep.meta),
                        ep.norm_hash,
                        fold.repeat_of[i],
                        fold.repeats[i],
                        fold.last_seen[i],
                        keys[i] if keys is not None else None,
                    )
                )
        repeats.settle(conn, fold)
        next_chunk = iter(chunk_ids)
        with cur.copy(COPY_CHUNKS) as copy:
            copy.set_types(CHUNK_TYPES)
            for index, (episode_id, ep) in enumerate(zip(copied.ids, batch)):
                if fold.repeat_of[index] is not None:
                    continue
                given = vectors[index] if vectors is not None else None
                for seq, text in enumerate(ep.chunks):
                    # a one-chunk episode's chunk is its text, whose digest the gate made
                    chunk_id, digest = (
                        next(next_chunk),
                        ep.content_hash if text == ep.content else _digest(text),
                    )
                    copy.write_row((chunk_id, ep.agent, episode_id, seq, text, digest))
                    if given is not None:
                        with_vector.append((ep.agent, chunk_id, digest, given[seq]))
                    queue_rows.append((ep.agent, chunk_id))
        if with_vector:
            with cur.copy(
                sql.SQL(COPY_VECTORS).format(table=sql.Identifier(model.table_name))
            ) as copy:
                for agent, chunk_id, digest, vector in with_vector:
                    copy.write_row((agent, chunk_id, digest, vector))
        if queued and queue_rows:
            skip = {row[1] for row in with_vector}
            with cur.copy(COPY_QUEUE) as copy:
                copy.set_types(["int4", "text", "int8"])
                for model_id in queued:
                    own = skip if model is not None and model_id == model.id else ()
                    for agent, chunk_id in queue_rows:
                        if chunk_id not in own:
                            copy.write_row((model_id, agent, chunk_id))
                            copied.queued += 1
    copied.chunks, copied.vectors = len(chunk_ids), len(with_vector)
    return copied


# valid_from (when the value became true) defaults to the time the row is recorded. A version is recorded
# at the clock's time when it is written, under the key's lock, not at its transaction's start: versions of
# one key then follow each other in time, so a plain set is always the latest valid (memctl.records.facts).
UPSERT_FACT = (
    WRITER
    + """
INSERT INTO facts (namespace, key, value, source, version, updated_at, valid_from)
VALUES (%s, %s, %s, %s, %s, coalesce(%s, now()), coalesce(%s, %s, now()))
ON CONFLICT (namespace, key) DO UPDATE
   SET value = excluded.value, source = excluded.source, version = excluded.version, updated_at = excluded.updated_at,
       valid_from = excluded.valid_from
"""
)
INSERT_HISTORY = (
    WRITER
    + """
INSERT INTO fact_history (namespace, key, version, op, old_value, new_value, source, changed_at, valid_from)
SELECT %s, %s, %s, %s, %s, %s, %s, t.at, coalesce(%s, t.at)
FROM (SELECT coalesce(%s::timestamptz, clock_timestamp()) AS at) AS t
RETURNING changed_at, valid_from
"""
)


def put_fact(
    conn: Memory, fact: FactValue, version: int, updated_at: datetime.datetime | None = None
) -> None:
    _sourced(conn, fact, FactValue)
    conn.execute(
        UPSERT_FACT,
        (
            fact.namespace,
            fact.key,
            fact.value,
            fact.source,
            version,
            updated_at,
            fact.valid_from,
            updated_at,
        ),
    )


def insert_history(conn: Memory, entry: HistoryEntry) -> dict:
    """The entry's row; returns its changed_at and valid_from as stored."""
    _sourced(conn, entry, HistoryEntry)
    return conn.one(
        INSERT_HISTORY,
        (
            entry.namespace,
            entry.key,
            entry.version,
            entry.op,
            entry.old_value,
            entry.new_value,
            entry.source,
            entry.valid_from,
            entry.changed_at,
        ),
    )


INSERT_RUN = (
    WRITER
    + """
INSERT INTO runbook_runs (agent, name, commit, dirty, steps, from_step)
VALUES (%(agent)s, %(name)s, %(commit)s, %(dirty)s, %(steps)s, %(from_step)s)
RETURNING id, started_at
"""
)
# The run's own row can vanish during the run: restoring the memory database
# from a dump replaces runbook_runs. Then the finished record is written again
# (with a new id: the restored identity sequence knows nothing of the old one).
REINSERT_RUN = (
    WRITER
    + """
INSERT INTO runbook_runs (agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step,
                          failed_step, exit_code, duration_s, output_tail)
VALUES (%(agent)s, %(name)s, %(commit)s, %(dirty)s, %(started_at)s, now(), %(outcome)s, %(steps)s,
        %(from_step)s, %(failed_step)s, %(exit_code)s, %(duration_s)s, %(output_tail)s)
RETURNING *
"""
)
IMPORT_RUN = (
    WRITER
    + """
INSERT INTO runbook_runs (agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step,
                          failed_step, exit_code, duration_s, output_tail, episode_id)
SELECT %(agent)s, %(name)s, %(commit)s, %(dirty)s, %(started_at)s, %(finished_at)s, %(outcome)s, %(steps)s,
       %(from_step)s, %(failed_step)s, %(exit_code)s, %(duration_s)s, %(output_tail)s, %(episode_id)s
WHERE NOT EXISTS (SELECT 1 FROM runbook_runs WHERE agent = %(agent)s AND name = %(name)s
                  AND started_at = %(started_at)s)
"""
)
RUN_STATEMENTS = {"start": INSERT_RUN, "reinsert": REINSERT_RUN, "import": IMPORT_RUN}


def insert_run(conn: Memory, record: RunRecord, how: str = "start"):
    """A runbook run's row: at its start, again at its end if its row vanished, or from an import."""
    _admitted(record, RunRecord)
    return conn.execute(RUN_STATEMENTS[how], record.row)


INSERT_LINEAGE = (
    WRITER
    + """
INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
)


def insert_lineage(conn: Memory, rows: Iterable[Lineage]) -> int:
    rows = list(rows)
    for row in rows:
        _admitted(row, Lineage)
    with conn.cursor() as cur:
        cur.executemany(
            INSERT_LINEAGE,
            [
                (r.agent, r.summary_id, r.source_id, r.source_created_at, r.source_hash)
                for r in rows
            ],
            returning=False,
        )
        return cur.rowcount if rows else 0


# summarize_input: the window's episodes as summarize recorded them (memctl.retention.summarize), in this session.
# Each source's digest keyed (memctl.places.lineage_digest): the lineage outlives its sources.
INSERT_WINDOW_LINEAGE = (
    WRITER
    + """
INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash)
SELECT %(agent)s, %(summary_id)s, i.id, i.created_at, {keyed} FROM summarize_input i
""".format(keyed=places.lineage_sql("i.content_hash"))
)


def insert_window_lineage(conn: Memory, lineage: WindowLineage) -> int:
    """The lineage of a summary to every episode of its window, in one statement (a day may hold 100,000)."""
    from memctl.write import erased

    _admitted(lineage, WindowLineage)
    ipad, opad = places.pads(erased.load_key())
    return conn.execute(
        INSERT_WINDOW_LINEAGE,
        {"agent": lineage.agent, "summary_id": lineage.summary_id, "ipad": ipad, "opad": opad},
    ).rowcount


BLOCK = (
    WRITER
    + """
INSERT INTO blocked_sources (source, reason, blocked_at) VALUES (%s, %s, coalesce(%s::timestamptz, now()))
ON CONFLICT (source) DO UPDATE SET reason = excluded.reason
RETURNING source, reason, blocked_at, (xmax = 0) AS inserted
"""
)
BLOCK_IF_NEW = (
    WRITER
    + """
INSERT INTO blocked_sources (source, reason, blocked_at) VALUES (%s, %s, coalesce(%s::timestamptz, now()))
ON CONFLICT (source) DO NOTHING
"""
)


def insert_blocked(conn: Memory, blocked: BlockedSource, *, keep_existing: bool = False):
    """Block a source (update the reason if it is blocked already, unless `keep_existing`: an import)."""
    _admitted(blocked, BlockedSource)
    if keep_existing:
        return conn.execute(
            BLOCK_IF_NEW, (blocked.source, blocked.reason, blocked.blocked_at)
        ).rowcount
    return conn.execute(BLOCK, (blocked.source, blocked.reason, blocked.blocked_at)).fetchone()
