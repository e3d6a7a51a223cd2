"""Changing the embedding model without stopping search: the column swap on per-model tables.

    start   register the new model in state 'backfill': its own vector table, every chunk queued
    run     embed the queue from the stored texts (memctl.embedding.worker.run: resumable, kill -9 safe),
            then build the HNSW index CONCURRENTLY
    status  done / total, rate, ETA, index state
    compare recall@k and MRR of both models on known items (memctl.reembed.quality), and the overlap
            of their top-k episodes for sample queries
    switch  atomically retire the active model and activate the new one, unless the new one finds
            less than the active one beyond a tolerance (--accept-worse); the job log keeps the figures
    drop-old drop retired models' tables (DROP TABLE returns the space at once)
    abort   drop the new model's table instead

Search keeps using the active model until `switch`; writes during the backfill are
queued for both models (memctl.records.episodes). Texts are never rewritten: a model change
touches only the vector tables. After `switch`, search, recall and the embed worker
follow the database's new active model even where the configuration still names the
old one (with a warning: models.mismatch_warning), so nothing breaks and nothing mixes.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable

from memctl.db import cluster, locks
from memctl.embedding import footprint, models, worker
from memctl.errors import EmbedderUnavailable, MemctlError, NotFound, UsageError
from memctl.records import jobs
from memctl.reembed import quality
from memctl.observe import size

if TYPE_CHECKING:
    from memctl.db.memory import Memory

REEMBED_LOCK = 0x6D656D72  # "memr": a session lock held by `reembed run`, second key the model id
TRY_LOCK = "SELECT pg_try_advisory_lock(%s::int4, %s::int4) AS ok"
UNLOCK = "SELECT pg_advisory_unlock(%s::int4, %s::int4)"
LOCK_HOLDER = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 2
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = %s::int8::oid AND objid = %s::int8::oid
"""
COUNT_VECTORS = "SELECT count(*) AS n FROM {}"
QUEUED = "SELECT count(*) AS n FROM embed_queue WHERE model_id = %s"
FAILED = "SELECT count(*) AS n FROM embed_failures WHERE model_id = %s"
CHUNKS = "SELECT count(*) AS n FROM chunks"
MISSING = """
SELECT count(*) AS n FROM chunks c
WHERE NOT EXISTS (SELECT 1 FROM {} v WHERE v.agent = c.agent AND v.chunk_id = c.id)
"""
INDEX_STATE = """
SELECT i.indisvalid AS valid FROM pg_index i WHERE i.indexrelid = to_regclass(quote_ident(%s))
"""
DROP_INDEX = "DROP INDEX CONCURRENTLY IF EXISTS {}"
JOB_PROGRESS = "UPDATE jobs SET rows = %s, detail = %s::jsonb WHERE id = %s"
LAST_RUN = """
SELECT started_at, finished_at, outcome, rows, detail FROM jobs
WHERE job = 'reembed' AND detail->>'model_id' = %s ORDER BY id DESC LIMIT 1
"""
SAMPLE_EPISODES = "SELECT content FROM episodes ORDER BY random() LIMIT %s"
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _count(conn: Memory, statement: str, *params) -> int:
    return conn.one(statement, params)["n"]


def _vectors(conn: Memory, model: models.Model) -> int:
    from psycopg import sql

    return conn.one(sql.SQL(COUNT_VECTORS).format(sql.Identifier(model.table_name)), prepare=False)[
        "n"
    ]


def backfill_model(conn: Memory) -> models.Model:
    model = models.by_state(conn, "backfill")
    if model is None:
        raise NotFound(
            "no model change in progress: start one with `memctl reembed start --model M`"
        )
    return model


# ---------------------------------------------------------------------- start


def start(
    conn: Memory,
    *,
    model: str | None = None,
    embedder: str | None = None,
    dims: int | None = None,
    halfvec: bool = False,
) -> dict:
    """Register `model` (default: the configured one) for backfill: its vector table, every chunk queued.

    Idempotent for the same model.
    """
    settings = conn.settings
    from memctl.embedding.embedders import make_embedder

    active = models.require_active(conn)
    new = make_embedder(settings, embedder=embedder, model=model, dimensions=dims)
    kind = "halfvec" if halfvec else "vector"
    models.storage_for(new.dims(), kind)  # refuses what HNSW cannot index, saying what would fit
    probe = new.embed(["memctl dimension probe"]).vectors[
        0
    ]  # the model exists and answers in these dims
    if len(probe) != new.dims():
        raise MemctlError(
            f"dimension mismatch: {new.name}:{new.model} answered {len(probe)} dims, "
            f"expected {new.dims()}"
        )
    current = models.by_state(conn, "backfill")
    if current is not None and not (
        models.matches(current, new) and current.dims == new.dims() and current.storage == kind
    ):
        raise MemctlError(
            f"a change to {current.label} is already in progress: finish it "
            "(`memctl reembed run`, `switch`) or `memctl reembed abort` it first"
        )
    if models.matches(active, new) and active.dims == new.dims() and active.storage == kind:
        raise UsageError(f"{active.label} is already the active model")
    registered = models.register(conn, new, state="backfill", storage=kind, build_index=False)
    return {
        "model": registered.label,
        "relation": registered.table_name,
        "active": active.label,
        "queued": _count(conn, QUEUED, registered.id),
        "already_started": current is not None,
    }


# ------------------------------------------------------------------------ run


def lock_holder(conn: Memory, model: models.Model) -> int | None:
    row = conn.execute(LOCK_HOLDER, (REEMBED_LOCK, model.id)).fetchone()
    return row["pid"] if row else None


def index_state(conn: Memory, model: models.Model) -> str:
    row = conn.execute(INDEX_STATE, (model.index_name,)).fetchone()
    return "missing" if row is None else ("valid" if row["valid"] else "invalid")


def build_index(
    conn: Memory, model: models.Model, on_warning: Callable[[str], None] | None = None
) -> dict:
    """Build the model's HNSW index CONCURRENTLY (outside a transaction), replacing an invalid leftover.

    Warns first when the graph would outgrow maintenance_work_mem, and passes on PostgreSQL's
    "hnsw graph no longer fits" notice if the build hits it.
    """
    from psycopg import sql

    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        if on_warning is not None:
            on_warning(message)

    state = index_state(conn, model)
    if state == "valid":
        return {"index": "valid", "index_s": 0.0, "warnings": warnings}
    if state == "invalid":  # a build killed half-way: CONCURRENTLY leaves an invalid index behind
        conn.execute(sql.SQL(DROP_INDEX).format(sql.Identifier(model.index_name)))
    rows = _vectors(conn, model)
    limit = size.maintenance_work_mem(conn)
    message = footprint.build_warning(model, rows, limit)
    if message:
        warn(message)

    def notice(diag) -> None:
        text = diag.message_primary or ""
        if "no longer fits" in text:
            warn(
                f"PostgreSQL: {text}; the build slows sharply from here: raise maintenance_work_mem "
                f"(now {limit // footprint.MIB} MiB) for index builds"
            )

    started = time.perf_counter()
    conn.add_notice_handler(notice)
    try:
        conn.execute(models.index_statement(model, concurrently=True))
    finally:
        conn.remove_notice_handler(notice)
    if index_state(conn, model) != "valid":
        raise MemctlError(
            f"the HNSW index {model.index_name} was built but is not valid: run `memctl reembed run` "
            "again to rebuild it"
        )
    return {
        "index": "built",
        "index_s": round(time.perf_counter() - started, 2),
        "warnings": warnings,
    }


def _progress_detail(model, done, total, result, phase) -> dict:
    return {
        "model_id": str(model.id),
        "model": model.label,
        "phase": phase,
        "done": done,
        "total": total,
        "elapsed_s": round(result.elapsed_s, 3),
    }


def run(
    conn: Memory,
    *,
    batch_size: int,
    limit: int | None = None,
    retry_failed: bool = False,
    progress: Callable[[dict], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> dict:
    """Backfill the new model from the stored texts, then build its index.

    Queue-based (memctl.embedding.worker.run): each batch commits on its own, so a run killed at any
    moment resumes where it stopped and no chunk is embedded twice. One `reembed run` at a
    time per model (a session advisory lock); `memctl embed` workers may help alongside.
    """
    settings = conn.settings
    import json

    from memctl.embedding.embedders import make_embedder

    model = backfill_model(conn)
    embedder = make_embedder(settings, registered=model)
    if not conn.one(TRY_LOCK, (REEMBED_LOCK, model.id))["ok"]:
        raise locks.foreign(
            locks.holder(conn, REEMBED_LOCK, model.id), "reembed run"
        ) or MemctlError(
            f"`memctl reembed run` is already running for {model.label} (backend pid {lock_holder(conn, model)})"
        )
    try:
        with jobs.record(conn, "reembed") as job:
            if retry_failed:
                worker.retry_failed(conn, model)
            models.queue_orphans(conn, model)
            done_before = _vectors(conn, model)
            total = done_before + _count(conn, QUEUED, model.id)

            def on_batch(result: worker.RunResult) -> None:
                done = done_before + result.chunks
                detail = _progress_detail(model, done, max(total, done), result, "embedding")
                conn.execute(JOB_PROGRESS, (result.chunks, json.dumps(detail), job.id))
                if progress is not None:
                    rate = result.chunks / result.elapsed_s if result.elapsed_s else None
                    remaining = max(total - done, 0)
                    progress({**detail, "rate": rate, "eta_s": remaining / rate if rate else None})

            result = worker.run(
                conn, model, embedder, batch_size=batch_size, limit=limit, progress=on_batch
            )
            job.rows = result.chunks
            job.detail = _progress_detail(
                model, done_before + result.chunks, total, result, "embedding"
            )
            if result.stopped_by:
                raise EmbedderUnavailable(
                    f"{result.stopped_by}; the rest stays queued: run `memctl reembed run` "
                    "again to resume"
                )
            report = {
                **result.to_dict(),
                "elapsed_s": round(result.elapsed_s, 3),
                "model": model.label,
                "done": _vectors(conn, model),
                "pending": _count(conn, QUEUED, model.id),
                "failed": _count(conn, FAILED, model.id),
                "index": index_state(conn, model),
                "index_s": None,
                "warnings": [],
            }
            if report["pending"] == 0:
                if progress is not None:
                    progress({**job.detail, "phase": "index", "rate": None, "eta_s": None})
                report.update(build_index(conn, model, on_warning))
            if report["failed"]:
                job.outcome = "partial"
                job.error = (
                    f"{report['failed']} chunk(s) refused by {model.label}: "
                    "`memctl reembed run --retry-failed` puts them back"
                )
            job.detail = {**job.detail, "phase": "done", "index": report["index"]}
            return report
    finally:
        conn.execute(UNLOCK, (REEMBED_LOCK, model.id))


# --------------------------------------------------------------------- status


def _rate(conn: Memory, model: models.Model) -> float | None:
    row = conn.execute(LAST_RUN, (str(model.id),)).fetchone()
    if row is None:
        return None
    elapsed = (row["detail"] or {}).get("elapsed_s")
    return row["rows"] / elapsed if elapsed and row["rows"] else None


def status(conn: Memory) -> dict:
    """Where a model change stands: done / total, rate, ETA, index, and the next step."""
    active = models.active(conn)
    retired = [m for m in models.all_models(conn) if m.state == "retired"]
    report: dict[str, Any] = {
        "active": active.label if active else None,
        "new": None,
        "state": "idle",
        "done": None,
        "total": None,
        "pending": None,
        "failed": None,
        "rate": None,
        "eta_s": None,
        "index": None,
        "running_pid": None,
        "retired": [m.label for m in retired],
        "next": None,
    }
    model = models.by_state(conn, "backfill")
    if model is None:
        if retired:
            report.update(
                state="switched", next="`memctl reembed drop-old` returns the old model's space"
            )
        return report
    pending, failed = _count(conn, QUEUED, model.id), _count(conn, FAILED, model.id)
    rate = _rate(conn, model)
    report.update(
        new=model.label,
        done=_vectors(conn, model),
        total=_count(conn, CHUNKS),
        pending=pending,
        failed=failed,
        rate=round(rate, 1) if rate else None,
        eta_s=round(pending / rate, 1) if rate and pending else (0.0 if not pending else None),
        index=index_state(conn, model),
        running_pid=lock_holder(conn, model),
    )
    if pending:
        state, step = "backfilling", "`memctl reembed run` (resumable)"
    elif failed:
        state, step = "failed", "`memctl reembed run --retry-failed`, or `memctl reembed abort`"
    elif report["index"] != "valid":
        state, step = (
            "indexing" if report["running_pid"] else "needs-index",
            "`memctl reembed run` builds the index",
        )
    else:
        state, step = "ready", "`memctl reembed compare`, then `memctl reembed switch`"
    report.update(state=state, next=step)
    return report


# -------------------------------------------------------------------- compare


def sample_queries(conn: Memory, n: int) -> list[str]:
    """The first sentence of n random episodes (at most 200 characters)."""
    queries = []
    for row in conn.execute(SAMPLE_EPISODES, (n,)).fetchall():
        first = _SENTENCE.split(row["content"].strip(), maxsplit=1)[0].strip()
        if first:
            queries.append(first[:200])
    return queries


def _embed_all(embedder, texts: list[str], batch: int = 32) -> list:
    from memctl.embedding.protocol import as_queries

    vectors = []
    for i in range(0, len(texts), batch):
        vectors.extend(embedder.embed(as_queries(embedder, texts[i : i + batch])).vectors)
    return vectors


def top_episodes(conn: Memory, model: models.Model, vector, k: int) -> list[int]:
    """Vector-only top-k episode ids in one model's table (an episode counts once, by its best chunk)."""
    from memctl.reading.query import Query
    from memctl.reading.scan import vector_half

    rows = vector_half(conn, model, vector, Query(text="compare", k=k), k * 4)
    ids: list[int] = []
    for row in rows:
        if row["episode_id"] not in ids:
            ids.append(row["episode_id"])
    return ids[:k]


def overlap(a: list[int], b: list[int]) -> float:
    """|A ∩ B| / k, k the longer list (1.0 when both are empty)."""
    size = max(len(a), len(b))
    return 1.0 if size == 0 else len(set(a) & set(b)) / size


def known_items(conn: Memory, path: str | None, sample: int) -> tuple[list, list[str] | None, str]:
    """(known items, plain queries from the file or None, where the items came from)."""
    if path is None:
        return quality.from_memory(conn, sample), None, "memory"
    items, plain = quality.read_file(conn, path)
    if items:
        return items, plain, str(path)
    return quality.from_memory(conn, sample), plain, "memory"


def compare(
    conn: Memory,
    *,
    sample: int = 20,
    queries: str | None = None,
    k: int = 10,
    tolerance: float = quality.TOLERANCE,
) -> dict:
    """recall@k and MRR of both models on known items (`queries`: a file, see memctl.reembed.quality; else
    built from the memory), and how much the top-k would change: per-query overlap of their results."""
    settings = conn.settings
    if not 1 <= k <= 1000:
        raise UsageError(f"k must be between 1 and 1000, got {k}")
    active, new = models.require_active(conn), backfill_model(conn)
    items, plain, source = known_items(
        conn, queries, quality.SAMPLE
    )  # the figures `switch` goes by
    measured = quality.side_by_side(
        conn, active, new, items, k=k, source=source, tolerance=tolerance
    )
    if queries is None:
        texts = sample_queries(conn, sample)
    else:
        texts = plain or [i.query for i in items[:sample]]
    if not texts:
        return {
            "active": active.label,
            "new": new.label,
            "k": k,
            "queries": 0,
            "mean_overlap": None,
            "done": _vectors(conn, new),
            "total": _count(conn, CHUNKS),
            "warning": None,
            "rows": [],
            "quality": measured,
        }
    from memctl.embedding.embedders import make_embedder

    old_vectors = _embed_all(make_embedder(settings, registered=active), texts)
    new_vectors = _embed_all(make_embedder(settings, registered=new), texts)
    rows: list[dict[str, Any]] = []
    for text, a_vec, b_vec in zip(texts, old_vectors, new_vectors):
        a, b = top_episodes(conn, active, a_vec, k), top_episodes(conn, new, b_vec, k)
        rows.append(
            {"query": text, "overlap": round(overlap(a, b), 3), "active_top": a, "new_top": b}
        )
    done, total = _vectors(conn, new), _count(conn, CHUNKS)
    warning = (
        None
        if done >= total
        else (
            f"the new model has vectors for {done} of {total} chunks: "
            "overlap is understated until `memctl reembed run` completes"
        )
    )
    mean = sum(r["overlap"] for r in rows) / len(rows)
    return {
        "active": active.label,
        "new": new.label,
        "k": k,
        "queries": len(rows),
        "mean_overlap": round(mean, 3),
        "done": done,
        "total": total,
        "warning": warning,
        "rows": rows,
        "quality": measured,
    }


# --------------------------------------------------------------------- switch


def config_change(model: models.Model) -> dict:
    """What the operator changes after a switch so configured commands use the new model."""
    env = f"MEMCTL_EMBEDDER={model.embedder} MEMCTL_EMBED_MODEL={model.model}"
    toml = f'[embedding]\nembedder = "{model.embedder}"\nmodel = "{model.model}"\n'
    dims = (
        model.request_dims
        if model.request_dims is not None
        else (model.dims if model.embedder == "hash" else None)
    )
    toml += f"dimensions = {dims}\n" if dims is not None else "# and remove any `dimensions` line\n"
    return {"env": env, "toml": toml, "dimensions": dims}


class WorseModel(MemctlError):
    """The new model finds less than the active one: `switch` refused (exit 1)."""


def switch(
    conn: Memory,
    *,
    accept_worse: bool = False,
    queries: str | None = None,
    k: int = 10,
    tolerance: float = quality.TOLERANCE,
) -> dict:
    """Make the backfilled model the active one, atomically, if it finds no less than the active one.

    Refuses unless it is complete and indexed; then measures both models on the same known items
    (memctl.reembed.quality) before taking the registry lock (writes wait for that lock), and refuses
    a model whose recall@k is lower beyond `tolerance` unless `accept_worse`. A memory with nothing
    to measure switches, saying so. The job log (job reembed-switch) keeps the figures.
    """
    _ready(conn, backfill_model(conn))
    active, new = models.require_active(conn), backfill_model(conn)
    items, _, source = known_items(conn, queries, quality.SAMPLE)
    measured = quality.side_by_side(
        conn, active, new, items, k=k, source=source, tolerance=tolerance
    )
    if not measured.get("judged", True) and not accept_worse:
        raise WorseModel(
            f"switch refused: {measured['note']}, or `memctl reembed switch --accept-worse` to switch "
            f"unjudged ({quality.figures({**measured, 'judged': True})})"
        )
    if measured["worse"] and not accept_worse:
        raise WorseModel(
            f"switch refused: the new model finds less than the active one beyond the tolerance "
            f"of {tolerance}: {quality.figures(measured)}; `memctl reembed switch --accept-worse` "
            "switches anyway, `memctl reembed abort` drops it"
        )
    with jobs.record(conn, "reembed-switch") as job:
        with conn.transaction():
            models.lock_registry(conn)
            if backfill_model(conn).id != new.id:
                raise MemctlError(
                    f"the model being backfilled changed while {new.label} was measured: run again"
                )
            _ready(conn, new)
            old = models.activate(conn, new)
        job.rows = measured["queries"]
        job.detail = {
            "old": old.label if old else None,
            "new": new.label,
            "accepted_worse": accept_worse,
            "figures": measured,
        }
    return {
        "old": old.label if old else None,
        "new": new.label,
        "relation": new.table_name,
        "config": config_change(new),
        "quality": measured,
        "accepted_worse": accept_worse and measured["worse"],
    }


def _ready(conn: Memory, new: models.Model) -> None:
    """Refuse a model that is not completely backfilled and indexed, saying what to run."""
    from psycopg import sql

    problems = []
    pending, failed = _count(conn, QUEUED, new.id), _count(conn, FAILED, new.id)
    if pending:
        problems.append(
            f"{pending} chunk(s) still queued for {new.label}: run `memctl reembed run`"
        )
    if failed:
        problems.append(
            f"{failed} chunk(s) refused by {new.label}: `memctl reembed run --retry-failed` "
            "or `memctl reembed abort`"
        )
    if not pending and not failed:
        missing = conn.one(sql.SQL(MISSING).format(sql.Identifier(new.table_name)), prepare=False)[
            "n"
        ]
        if missing:
            problems.append(
                f"{missing} chunk(s) have no vector in {new.table_name}: run `memctl reembed run`"
            )
    state = index_state(conn, new)
    if state != "valid":
        problems.append(f"its HNSW index is {state}: `memctl reembed run` builds it")
    if problems:
        raise MemctlError("switch refused: " + "; ".join(problems))


# ------------------------------------------------------------ drop-old, abort


def _drop(conn: Memory, model: models.Model) -> dict:
    size = cluster.relation_size(conn, model.table_name)  # its shards' on Citus
    with conn.transaction():
        models.remove(conn, model)
    return {
        "model": model.label,
        "state": model.state,
        "relation": model.table_name,
        "bytes_returned": size,
    }


def drop_old(conn: Memory) -> list[dict]:
    """Drop retired models' tables; the size each had is the space returned (on Citus: its shards')."""
    retired = [m for m in models.all_models(conn) if m.state == "retired"]
    if not retired:
        return []
    with jobs.record(conn, "reembed-drop-old") as job:
        dropped = [_drop(conn, m) for m in retired]
        job.rows = len(dropped)
        job.detail = {"dropped": dropped}
    return dropped


def abort(conn: Memory) -> dict:
    """Drop the model being backfilled (table, queue, failures); the active model is untouched."""
    model = backfill_model(conn)
    pid = lock_holder(conn, model)
    if pid is not None:
        raise MemctlError(
            f"`memctl reembed run` (backend pid {pid}) is working on {model.label}: stop it first"
        )
    with jobs.record(conn, "reembed-abort") as job:
        dropped = _drop(conn, model)
        job.rows = 1
        job.detail = dropped
    return dropped
