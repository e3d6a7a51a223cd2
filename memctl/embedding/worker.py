"""The embed worker: fills pending vectors in batches, never blocking writes.

Each batch is one transaction: claim queue rows with FOR UPDATE SKIP LOCKED
(agent by agent, which a Citus cluster requires),
embed their texts, write the vectors, delete the queue rows, commit. Several
workers never take the same chunk, and a worker killed at any moment rolls
back, leaving its chunks pending for the next run. Identical chunk text is
embedded once: a vector already stored for the same hash is copied.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from memctl.embedding import models
from memctl.embedding.protocol import as_documents
from memctl.errors import EmbedderUnavailable, EmbedInputRejected, MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

MAX_SPLIT_DEPTH = 6

# Claimed one agent at a time: the next agent with queued work (keyset on the primary key, an
# index lookup; no lock), then that agent's rows, locked. On Citus a FOR UPDATE must name one
# shard (an equality filter on agent), so a claim across agents is refused there; per agent it
# is routed. A worker whose agent is all locked by another worker moves on to the next agent,
# and a batch not filled by one agent is topped up from the next ones: the order is the
# primary key's, as one claim across agents would give.
FIRST_AGENT = "SELECT agent FROM embed_queue WHERE model_id = %s ORDER BY agent LIMIT 1"
NEXT_AGENT = (
    "SELECT agent FROM embed_queue WHERE model_id = %s AND agent > %s ORDER BY agent LIMIT 1"
)
CLAIM = """
SELECT q.agent, q.chunk_id, c.content, c.content_hash
FROM embed_queue q JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
WHERE q.model_id = %s AND q.agent = %s
ORDER BY q.chunk_id  -- primary key order: no sort, however long the backlog
LIMIT %s
FOR UPDATE OF q SKIP LOCKED
"""
EXISTING = """
SELECT DISTINCT ON (content_hash) content_hash, embedding FROM {table} WHERE content_hash = ANY(%s)
"""
COPY_VECTORS = "COPY {table} (agent, chunk_id, content_hash, embedding) FROM STDIN (FORMAT BINARY)"
DONE = "DELETE FROM embed_queue WHERE model_id = %s AND agent = %s AND chunk_id = ANY(%s)"  # one agent: routed
FAIL = """
INSERT INTO embed_failures (model_id, agent, chunk_id, error) VALUES (%s, %s, %s, %s)
ON CONFLICT (model_id, agent, chunk_id) DO UPDATE SET error = excluded.error, failed_at = now()
"""
RETRY_FAILED = """
WITH moved AS (DELETE FROM embed_failures WHERE model_id = %s RETURNING model_id, agent, chunk_id)
INSERT INTO embed_queue (model_id, agent, chunk_id) SELECT model_id, agent, chunk_id FROM moved
ON CONFLICT DO NOTHING
"""
QUEUED = "SELECT EXISTS (SELECT 1 FROM embed_queue WHERE model_id = ANY(%s)) AS queued"
FAILED = "SELECT EXISTS (SELECT 1 FROM embed_failures WHERE model_id = ANY(%s)) AS failed"
# An idle pass (nothing to claim) is not a run: a timer every 5 minutes, or a --loop every 30 s,
# would fill the job log with empty rows. A streak of idle passes is one job row, written by the
# first and brought forward by the others (finished_at, idle_passes), so `memctl status` still sees
# that the worker runs: an idle worker is not a late one.
TOUCH_IDLE = """
UPDATE jobs SET finished_at = now(),
       detail = jsonb_set(detail, '{idle_passes}', to_jsonb((detail ->> 'idle_passes')::bigint + 1))
WHERE id = (SELECT id FROM jobs WHERE job = 'embed' ORDER BY started_at DESC, id DESC LIMIT 1)
  AND outcome = 'ok' AND detail ? 'idle_passes'
RETURNING id
"""
RECORD_IDLE = """
INSERT INTO jobs (job, finished_at, outcome, rows, detail)
VALUES ('embed', now(), 'ok', 0, '{"idle_passes": 1}'::jsonb)
"""


@dataclass
class BatchResult:
    claimed: int = 0
    embedded: int = 0  # texts sent to the embedder
    copied: int = 0  # chunks whose text was already embedded (earlier batch or same batch)
    failed: list[tuple[int, str]] = field(default_factory=list)
    tokens: int = 0


@dataclass
class RunResult:
    model: str
    batches: int = 0
    chunks: int = 0
    embedded: int = 0
    copied: int = 0
    failed: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    stopped_by: str | None = None  # why a run ended early (embedder unavailable)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        data = asdict(self)
        data["elapsed_s"] = round(self.elapsed_s, 3)
        data["chunks_per_s"] = round(self.chunks / self.elapsed_s, 1) if self.elapsed_s else None
        return data


def _mean(vectors: list[list[float]]) -> list[float]:
    from memctl.embedding.protocol import l2_normalise

    return l2_normalise([sum(col) / len(vectors) for col in zip(*vectors)])


def embed_one(embedder, text: str, depth: int = 0) -> list[float]:
    """Embed a text the model may refuse as too long: split it in halves, average the halves."""
    try:
        return embedder.embed(as_documents(embedder, [text])).vectors[0]
    except EmbedInputRejected:
        if depth >= MAX_SPLIT_DEPTH or len(text) < 2:
            raise
    middle = len(text) // 2
    space = text.rfind(" ", middle // 2, middle + middle // 2)
    middle = space if space > 0 else middle
    return _mean(
        [
            embed_one(embedder, text[:middle], depth + 1),
            embed_one(embedder, text[middle:], depth + 1),
        ]
    )


def embed_texts(
    embedder, texts: list[str]
) -> tuple[list[list[float] | None], list[str | None], int]:
    """Vectors for texts (None where the model refused one even after splitting), errors, tokens."""
    try:
        result = embedder.embed(as_documents(embedder, texts))
        return list(result.vectors), [None] * len(texts), result.prompt_eval_count or 0
    except EmbedInputRejected:
        pass
    vectors: list[list[float] | None] = []
    errors: list[str | None] = []
    for text in texts:
        try:
            vectors.append(embed_one(embedder, text))
            errors.append(None)
        except EmbedInputRejected as exc:
            vectors.append(None)
            errors.append(str(exc))
    return vectors, errors, 0


def run_batch(conn: Memory, model: models.Model, embedder, batch_size: int) -> BatchResult:
    from psycopg import sql

    table = sql.Identifier(model.table_name)
    result = BatchResult()
    with conn.transaction():
        rows = claim(conn, model, batch_size)
        result.claimed = len(rows)
        if not rows:
            return result
        hashes = list({bytes(r["content_hash"]) for r in rows})
        known = {
            bytes(r["content_hash"]): r["embedding"]
            for r in conn.execute(sql.SQL(EXISTING).format(table=table), (hashes,)).fetchall()
        }
        todo: dict[bytes, str] = {}
        for r in rows:
            digest = bytes(r["content_hash"])
            if digest not in known:
                todo.setdefault(digest, r["content"])
        vectors, errors, result.tokens = embed_texts(embedder, list(todo.values()))
        fresh = dict(zip(todo, vectors))
        failed_error = dict(zip(todo, errors))
        result.embedded = len(todo)
        written = []
        used: set[bytes] = set()
        with conn.cursor() as cur:
            with cur.copy(sql.SQL(COPY_VECTORS).format(table=table)) as copy:
                copy.set_types(["text", "int8", "bytea", model.storage])
                for r in rows:
                    digest = bytes(r["content_hash"])
                    vector = known.get(digest)
                    if vector is None:
                        vector = fresh.get(digest)
                        if digest in used:
                            result.copied += 1  # identical text earlier in this batch
                        used.add(digest)
                    else:
                        result.copied += 1  # identical text embedded in an earlier batch
                    if vector is None:
                        result.failed.append(
                            (r["chunk_id"], failed_error.get(digest) or "no vector")
                        )
                        continue
                    copy.write_row((r["agent"], r["chunk_id"], digest, _as_vector(vector, model)))
                    written.append(r)
            for chunk_id, error in result.failed:
                agent = next(r["agent"] for r in rows if r["chunk_id"] == chunk_id)
                cur.execute(FAIL, (model.id, agent, chunk_id, error[:2000]))
        for agent, chunk_ids in _by_agent(rows).items():
            conn.execute(DONE, (model.id, agent, chunk_ids))
    return result


def claim(conn: Memory, model: models.Model, batch_size: int) -> list[dict]:
    """Lock up to batch_size queued chunks of the model (inside the caller's transaction), agent by agent."""
    rows: list[dict] = []
    agent = None
    while len(rows) < batch_size:
        following = conn.execute(
            *((FIRST_AGENT, (model.id,)) if agent is None else (NEXT_AGENT, (model.id, agent)))
        ).fetchone()
        if following is None:
            break
        agent = following["agent"]
        rows += conn.execute(
            CLAIM, (model.id, agent, batch_size - len(rows)), prepare=False
        ).fetchall()
    return rows


def _by_agent(rows: list[dict]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for r in rows:
        grouped.setdefault(r["agent"], []).append(r["chunk_id"])
    return grouped


def _as_vector(vector, model: models.Model):
    """A pgvector value of the model's storage type, from plain floats (no numpy: the base install lacks it)."""
    from pgvector import HalfVector, Vector

    if hasattr(vector, "to_list"):  # copied from the table: already a pgvector Vector/HalfVector
        vector = vector.to_list()
    values = [float(x) for x in vector]
    if len(values) != model.dims:
        raise MemctlError(
            f"dimension mismatch: the embedder returned {len(values)} dims, "
            f"{model.label} stores {model.dims}"
        )
    return HalfVector(values) if model.storage == "halfvec" else Vector(values)


def run(
    conn: Memory,
    model: models.Model,
    embedder,
    *,
    batch_size: int,
    limit: int | None = None,
    progress: Callable[[RunResult], None] | None = None,
    should_stop: Callable[[], str | None] | None = None,
) -> RunResult:
    """Embed pending chunks of one model until none remain (or `limit` chunks are done).

    `should_stop` is asked between batches (never inside one): a SIGTERM handler sets
    it, so `systemctl stop` lets the batch in flight commit and then ends the run.
    """
    result = RunResult(model=model.label)
    started = time.perf_counter()
    while limit is None or result.chunks < limit:
        reason = should_stop() if should_stop is not None else None
        if reason:
            result.stopped_by = reason
            break
        size = batch_size if limit is None else min(batch_size, limit - result.chunks)
        try:
            batch = run_batch(conn, model, embedder, size)
        except EmbedderUnavailable as exc:
            result.stopped_by = str(exc)
            break
        if batch.claimed == 0:
            break
        result.batches += 1
        result.chunks += batch.claimed - len(batch.failed)
        result.embedded += batch.embedded
        result.copied += batch.copied
        result.failed += len(batch.failed)
        result.tokens += batch.tokens
        result.elapsed_s = time.perf_counter() - started
        if progress is not None:
            progress(result)
    result.elapsed_s = time.perf_counter() - started
    return result


def retry_failed(conn: Memory, model: models.Model) -> int:
    return conn.execute(RETRY_FAILED, (model.id,)).rowcount


def is_idle(conn: Memory, targets: list[models.Model], retry: bool = False) -> bool:
    """Nothing for a pass to do: no chunk queued for these models, no orphan to queue, no failure to retry."""
    ids = [m.id for m in targets]
    if conn.one(QUEUED, (ids,))["queued"]:
        return False
    if retry and conn.one(FAILED, (ids,))["failed"]:
        return False
    return not any(models.count_orphans(conn, m) for m in targets)


def record_idle(conn: Memory) -> None:
    """One job row per streak of idle passes (see TOUCH_IDLE)."""
    with conn.transaction():
        if conn.execute(TOUCH_IDLE).fetchone() is None:
            conn.execute(RECORD_IDLE)


def work(
    conn: Memory,
    configured_embedder,
    *,
    batch_size: int,
    limit: int | None = None,
    retry: bool = False,
    progress=None,
    should_stop=None,
) -> tuple[list[RunResult], list[str]]:
    """One worker pass: the active model (registered on first use), then a backfilling one.

    An idle pass (nothing queued, no orphan, nothing to retry) claims nothing, runs no job and
    returns no results: it only brings the idle streak's job row forward (record_idle).

    The database knows its model: the configured embedder only chooses the first model
    of an empty database. After a model change a worker still configured with the old
    model embeds for the active one, with a warning (returned with the results).
    Orphaned chunks (see models.ORPHANS) are queued before each model's run.
    """
    settings = conn.settings
    from memctl.embedding.embedders import make_embedder
    from memctl.records import jobs

    warnings: list[str] = []
    active = models.active(conn)
    if active is not None and is_idle(
        conn, [m for m in (active, models.by_state(conn, "backfill")) if m], retry
    ):
        record_idle(conn)
        mismatch = models.mismatch_warning(active, configured_embedder)
        return [], [mismatch] if mismatch else []
    with jobs.record(conn, "embed") as job:
        active = models.ensure_active(conn, configured_embedder, storage=settings.embedding.storage)
        mismatch = models.mismatch_warning(active, configured_embedder)
        if mismatch:
            warnings.append(mismatch)
        targets = [active]
        backfill = models.by_state(conn, "backfill")
        if backfill is not None:
            targets.append(backfill)
        results = []
        requeued = 0
        for model in targets:
            reuse = models.matches(model, configured_embedder) and (
                configured_embedder.name != "hash" or configured_embedder.dims() == model.dims
            )
            embedder = configured_embedder if reuse else make_embedder(settings, registered=model)
            if retry:
                retry_failed(conn, model)
            requeued += models.queue_orphans(conn, model)
            result = run(
                conn,
                model,
                embedder,
                batch_size=batch_size,
                limit=limit,
                progress=progress,
                should_stop=should_stop,
            )
            results.append(result)
            if result.stopped_by:
                break
        if requeued:
            warnings.append(
                f"queued {requeued} chunk(s) that had no vector, no queue row and no failure "
                "(written while a model was being registered)"
            )
        job.rows = sum(r.chunks for r in results)
        job.detail = {"runs": [r.to_dict() for r in results], "requeued_orphans": requeued}
        stopped = next((r.stopped_by for r in results if r.stopped_by), None)
        if should_stop is not None and should_stop():
            job.outcome, job.error = (
                jobs.INTERRUPTED,
                f"stopped by {should_stop()} after the batch in flight",
            )
        elif stopped:
            job.outcome, job.error = "unavailable", stopped
        elif any(r.failed for r in results):
            job.outcome = "partial"
            job.error = (
                f"{sum(r.failed for r in results)} chunk(s) refused by the model: see memctl status"
            )
    return results, warnings
