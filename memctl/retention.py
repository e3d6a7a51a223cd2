"""Retention: prune episodes past their kind's maximum age; purge what a source wrote.

Deletes go in batches of a few thousand episodes, each batch its own short
transaction, so no lock is held for long and the embed worker keeps running.
A batch deletes episodes; the foreign keys' ON DELETE CASCADE removes their
chunks, queue rows, failures and the vectors of every model.

Space: deleted rows become dead tuples; VACUUM makes their space reusable by
new rows, but the table files rarely shrink. Reports give table sizes and dead
tuples before and after instead of "bytes freed".
"""

from __future__ import annotations

import datetime
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memctl import lineage, models
from memctl.errors import ConfigError, NotFound, UsageError

DEFAULT_BATCH = 2000
KEEP_IMPORTANCE = "keep_importance"
JOBS = "jobs"  # [retention] jobs: the job log's maximum age, not an episode kind
REQUIRE_SUMMARY = "require_summary"  # [retention] require_summary: prune waits for summaries (not a kind)


# --- policy ------------------------------------------------------------------


@dataclass
class Policy:
    """Maximum age per kind (durations like '30d'); kinds not named are kept.

    keep_importance: episodes of importance >= N are kept whatever their age (all kinds).
    jobs: the maximum age of the job log (jobs and runbook_runs rows), 90d unless set.
    require_summary: with [summarize] model set, episodes of summarized kinds that no summary
    holds yet are kept (the caller names those kinds: see memctl.summarize.awaited_kinds).
    """

    max_age: dict[str, str]
    keep_importance: int | None = None
    jobs: str = field(default_factory=lambda: _default_job_age())
    require_summary: bool = True

    @classmethod
    def from_section(cls, section: dict[str, Any]) -> Policy:
        section = dict(section)
        keep = section.pop(KEEP_IMPORTANCE, None)
        jobs = section.pop(JOBS, None) or _default_job_age()
        require_summary = section.pop(REQUIRE_SUMMARY, True)
        return cls(dict(sorted(section.items())), keep, jobs, require_summary)

    @property
    def empty(self) -> bool:
        """No episode kind named: prune deletes no episode (the job log is trimmed all the same)."""
        return not self.max_age

    def cutoffs(self, now: datetime.datetime) -> dict[str, datetime.datetime]:
        from memctl.config import parse_duration

        return {kind: now - datetime.timedelta(seconds=parse_duration(age)) for kind, age in self.max_age.items()}

    def job_log_cutoff(self, now: datetime.datetime) -> datetime.datetime:
        from memctl.config import parse_duration

        return now - datetime.timedelta(seconds=parse_duration(self.jobs))


# Said (on stderr) by every prune whose policy names no kind: an empty policy deletes no episode.
NO_EPISODE_POLICY = ('no episode retention policy: [retention] names no kind, so no episode is deleted; add e.g. '
                     'raw = "30d", summary = "365d" to the configuration or give a file with --policy FILE '
                     "(an empty policy never means 'delete all')")


def _default_job_age() -> str:
    from memctl.config import RETENTION_DEFAULTS

    return RETENTION_DEFAULTS[JOBS]


def policy_from_settings(settings) -> Policy:
    return Policy.from_section(settings.section("retention"))


def read_policy(path: str | Path) -> Policy:
    """The [retention] table of another TOML file, validated like the configuration's."""
    from memctl import config

    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: no such policy file")
    table = config.read_section(path, "retention")
    if table is None:
        raise ConfigError(f'{path}: no [retention] table (e.g. [retention] raw = "30d")')
    return Policy.from_section(table)


# --- which episodes ----------------------------------------------------------

# A WHERE clause over `episodes e` with its parameters: one prune kind, or a purge.
PRUNE_WHERE = "e.kind = %(kind)s AND e.created_at < %(cutoff)s AND (%(keep)s::int IS NULL OR e.importance < %(keep)s)"
PURGE_WHERE = "e.source = %(source)s AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s)"
PURGE_KIND_WHERE = PURGE_WHERE + " AND e.kind = %(kind)s"
# An episode some summary was built from: the lineage's one definition (memctl.lineage).
PRUNE_SUMMARIZED_WHERE = PRUNE_WHERE + " AND " + lineage.SUMMARIZED
PRUNE_UNSUMMARIZED_WHERE = PRUNE_WHERE + " AND " + lineage.UNSUMMARIZED


@dataclass
class Selection:
    where: str
    params: dict[str, Any]


def prune_selection(kind: str, cutoff: datetime.datetime, keep: int | None, *,
                    await_summary: bool = False) -> Selection:
    """A kind past its age; with await_summary only the episodes some summary was built from."""
    where = PRUNE_SUMMARIZED_WHERE if await_summary else PRUNE_WHERE
    return Selection(where, {"kind": kind, "cutoff": cutoff, "keep": keep})


def kept_for_summary(conn, kind: str, cutoff: datetime.datetime, keep: int | None) -> int:
    """Episodes of a kind past its age that prune keeps because no summary holds them yet."""
    from psycopg import sql

    query = sql.SQL("SELECT count(*) AS n FROM episodes e WHERE {}").format(sql.SQL(PRUNE_UNSUMMARIZED_WHERE))
    return conn.execute(query, {"kind": kind, "cutoff": cutoff, "keep": keep}).fetchone()["n"]


def purge_selection(source: str, since: datetime.datetime | None) -> Selection:
    return Selection(PURGE_WHERE, {"source": source, "since": since})


def purge_kind_selection(source: str, since: datetime.datetime | None, kind: str) -> Selection:
    return Selection(PURGE_KIND_WHERE, {"source": source, "since": since, "kind": kind})


# --- dry run: what a selection holds ------------------------------------------

SUMMARY = """
WITH doomed AS (
    SELECT e.agent, e.id, e.kind, e.created_at, pg_column_size(e.*) AS size FROM episodes e WHERE {where}
), episode_sizes AS (
    SELECT kind, count(*) AS rows, min(created_at) AS oldest, max(created_at) AS newest, sum(size) AS bytes
    FROM doomed GROUP BY kind
), chunk_sizes AS (
    SELECT d.kind, count(*) AS chunks, sum(pg_column_size(c.*)) AS bytes
    FROM chunks c JOIN doomed d ON c.agent = d.agent AND c.episode_id = d.id GROUP BY d.kind
), vector_sizes AS (
    SELECT kind, count(*) AS vectors, sum(size) AS bytes FROM ({vectors}) AS v GROUP BY kind
)
SELECT e.kind, e.rows, e.oldest, e.newest, coalesce(c.chunks, 0) AS chunks, coalesce(v.vectors, 0) AS vectors,
       (e.bytes + coalesce(c.bytes, 0) + coalesce(v.bytes, 0))::bigint AS bytes
FROM episode_sizes e LEFT JOIN chunk_sizes c USING (kind) LEFT JOIN vector_sizes v USING (kind)
ORDER BY e.kind
"""
SUMMARY_VECTORS = """
SELECT d.kind, pg_column_size(v.*) AS size FROM {table} v
JOIN chunks c ON c.agent = v.agent AND c.id = v.chunk_id
JOIN doomed d ON d.agent = c.agent AND d.id = c.episode_id
"""
NO_VECTORS = "SELECT NULL::text AS kind, 0 AS size WHERE false"
KEPT_BY_IMPORTANCE = """
SELECT count(*) AS n FROM episodes e WHERE e.kind = %s AND e.created_at < %s AND e.importance >= %s
"""
UNNAMED_KINDS = "SELECT kind, count(*) AS rows FROM episodes WHERE kind <> ALL(%s) GROUP BY kind ORDER BY kind"
NOW = "SELECT now() AS now"


def _vector_tables(conn) -> list[str]:
    return [m.table_name for m in models.all_models(conn)]


def summarise(conn, selection: Selection, vector_tables: list[str]) -> list[dict]:
    """Per kind: rows, oldest and newest created_at, chunks, vectors, and the logical bytes they hold.

    Bytes are pg_column_size of the episode, chunk and vector rows (every
    model): row data, not file bytes; indexes are not counted.
    """
    from psycopg import sql

    parts = [sql.SQL(SUMMARY_VECTORS).format(table=sql.Identifier(t)) for t in vector_tables]
    vectors = sql.SQL(" UNION ALL ").join(parts) if parts else sql.SQL(NO_VECTORS)
    query = sql.SQL(SUMMARY).format(where=sql.SQL(selection.where), vectors=vectors)
    return conn.execute(query, selection.params, prepare=False).fetchall()


def plan(conn, policy: Policy, *, await_summary: frozenset[str] = frozenset()) -> list[dict]:
    """Dry run of a prune: per kind of the policy, what it would delete (none for an empty policy).

    Kinds in await_summary lose only the episodes a summary holds; kept_for_summary counts the others.
    """
    now = conn.execute(NOW).fetchone()["now"]
    tables = _vector_tables(conn)
    rows = []
    for kind, cutoff in policy.cutoffs(now).items():
        held = kind in await_summary
        selection = prune_selection(kind, cutoff, policy.keep_importance, await_summary=held)
        found = summarise(conn, selection, tables)
        row = found[0] if found else {"rows": 0, "oldest": None, "newest": None, "chunks": 0, "vectors": 0,
                                      "bytes": 0}
        kept = 0
        if policy.keep_importance is not None:
            kept = conn.execute(KEPT_BY_IMPORTANCE, (kind, cutoff, policy.keep_importance)).fetchone()["n"]
        rows.append({"kind": kind, "policy": policy.max_age[kind], "cutoff": cutoff, "rows": row["rows"],
                     "oldest": row["oldest"], "newest": row["newest"], "chunks": row["chunks"],
                     "vectors": row["vectors"], "bytes": row["bytes"], "kept_by_importance": kept,
                     "kept_for_summary": kept_for_summary(conn, kind, cutoff, policy.keep_importance) if held else 0})
    return rows


def unnamed_kinds(conn, policy: Policy) -> list[dict]:
    """Kinds present in the database that the policy does not name (kept)."""
    return conn.execute(UNNAMED_KINDS, (list(policy.max_age),)).fetchall()


# --- the job log ---------------------------------------------------------------

# Rows started before the cutoff. A row still 'running' that old is from a killed
# process (a live run is at most hours old, the cutoff at least a day): it goes too.
# A younger row, running or not, is never selected.
JOB_LOG_PLAN = """
SELECT 'jobs' AS table, count(*) AS rows, count(*) FILTER (WHERE outcome = 'running') AS running,
       min(started_at) AS oldest, max(started_at) AS newest
FROM jobs WHERE started_at < %(cutoff)s
UNION ALL
SELECT 'runbook_runs', count(*), count(*) FILTER (WHERE outcome = 'running'), min(started_at), max(started_at)
FROM runbook_runs WHERE started_at < %(cutoff)s
"""
DELETE_JOBS_BATCH = """
DELETE FROM jobs WHERE id IN (
    SELECT id FROM jobs WHERE started_at < %(cutoff)s ORDER BY started_at, id LIMIT %(limit)s)
"""
DELETE_RUNBOOK_RUNS_BATCH = """
DELETE FROM runbook_runs WHERE (agent, id) IN (
    SELECT agent, id FROM runbook_runs WHERE started_at < %(cutoff)s ORDER BY started_at, agent, id LIMIT %(limit)s)
"""
JOB_LOG_TABLES = {"jobs": DELETE_JOBS_BATCH, "runbook_runs": DELETE_RUNBOOK_RUNS_BATCH}


def job_log_plan(conn, policy: Policy) -> list[dict]:
    """Dry run of the job log trim: per table the rows older than [retention] jobs (and how many say 'running')."""
    cutoff = policy.job_log_cutoff(conn.execute(NOW).fetchone()["now"])
    rows = conn.execute(JOB_LOG_PLAN, {"cutoff": cutoff}).fetchall()
    return [{**row, "policy": policy.jobs, "cutoff": cutoff} for row in rows]


def trim_job_log(conn, policy: Policy, *, batch_size: int = DEFAULT_BATCH) -> list[dict]:
    """Delete jobs and runbook_runs rows started before the cutoff, one short transaction per batch."""
    if batch_size <= 0:
        raise UsageError(f"the batch size must be positive, got {batch_size}")
    cutoff = policy.job_log_cutoff(conn.execute(NOW).fetchone()["now"])
    done = []
    for table, statement in JOB_LOG_TABLES.items():
        deleted = batches = 0
        while True:
            with conn.transaction():
                conn.execute(ASYNC_COMMIT)
                count = conn.execute(statement, {"cutoff": cutoff, "limit": batch_size}).rowcount
            deleted, batches = deleted + count, batches + (count > 0)
            if count < batch_size:
                break
        done.append({"table": table, "policy": policy.jobs, "cutoff": cutoff, "rows": deleted, "batches": batches})
    return done


# --- deleting in batches -----------------------------------------------------

# One batch, in one statement: the next episodes of a kind by keyset on
# (created_at, id), so no scan walks over rows earlier batches deleted; their
# queue rows locked; the episodes deleted, and the foreign keys' ON DELETE
# CASCADE (run at the end of the statement) removes their chunks, queue rows,
# failures and the vectors of every model. The ids never leave the server.
#
# The lock: the embed worker holds its claimed queue rows (FOR UPDATE) while
# it embeds, then writes vectors whose foreign key locks the chunk. Deleting
# the chunk first would wait for the worker while the worker waits for us: a
# deadlock. Locking the queue rows first, in a fixed order, makes us wait for
# its batch instead (and the worker skips the rows we hold).
#
# Measured (tests/bench/prune.py, 200k episodes): deleting vectors and chunks
# with explicit set-based DELETEs before the episodes ran 2x slower, as the
# cascade triggers still fire and probe every table.
DELETE_BATCH = """
WITH batch AS MATERIALIZED (
    SELECT e.agent, e.id, e.created_at FROM episodes e
    WHERE {where} AND e.created_at >= %(after_t)s AND (e.created_at, e.id) > (%(after_t)s, %(after_id)s)
    ORDER BY e.created_at, e.id LIMIT %(limit)s
), locked AS (
    SELECT 1 FROM embed_queue q
    JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
    JOIN batch b ON b.agent = c.agent AND b.id = c.episode_id
    ORDER BY q.agent, q.chunk_id, q.model_id
    FOR UPDATE OF q
), gone AS (
    DELETE FROM episodes e USING batch b, (SELECT count(*) FROM locked) AS l
    WHERE e.agent = b.agent AND e.id = b.id
    RETURNING 1
)
SELECT count(*) AS selected, (SELECT count(*) FROM gone) AS deleted, min(created_at) AS oldest,
       max(created_at) AS last_t, max(id) FILTER (WHERE created_at = (SELECT max(created_at) FROM batch)) AS last_id
FROM batch
"""
# Rows this backend deleted from each table, cascades included, not yet flushed
# to the shared statistics: read before and after the DELETE, in its transaction
# (nothing is flushed inside a transaction), the difference is what it deleted.
DELETED_IN_TX = """
SELECT coalesce(pg_stat_get_xact_tuples_deleted(to_regclass(quote_ident(t.name))), 0) AS n
FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, i) ORDER BY t.i
"""
# A batch is idempotent: if a crash loses the last commits, the next run deletes
# those rows again. Not waiting for each commit's WAL flush makes many small
# transactions cost about what one large one does.
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"
COUNT_BY_KIND = "SELECT e.kind, count(*) AS n FROM episodes e WHERE {where} GROUP BY e.kind"


@dataclass
class Deleted:
    """What a run of batches removed, per kind."""

    rows: Counter = field(default_factory=Counter)
    chunks: Counter = field(default_factory=Counter)
    vectors: Counter = field(default_factory=Counter)
    oldest: dict[str, datetime.datetime] = field(default_factory=dict)
    newest: dict[str, datetime.datetime] = field(default_factory=dict)
    batches: int = 0
    max_transaction_s: float = 0.0

    def note(self, kind: str, batch: dict, chunks: int, vectors: int) -> None:
        self.batches += 1
        self.rows[kind] += batch["deleted"]
        self.chunks[kind] += chunks
        self.vectors[kind] += vectors
        self.oldest[kind] = min(self.oldest.get(kind, batch["oldest"]), batch["oldest"])
        self.newest[kind] = max(self.newest.get(kind, batch["last_t"]), batch["last_t"])

    def kind_row(self, kind: str) -> dict:
        return {"rows": self.rows[kind], "chunks": self.chunks[kind], "vectors": self.vectors[kind],
                "oldest": self.oldest.get(kind), "newest": self.newest.get(kind)}


# On Citus (episodes distributed by agent) a batch is selected without a lock across the shards,
# then deleted agent by agent, each statement routed to that agent's shard: Citus refuses a
# FOR UPDATE across shards, and the transaction statistics that count the cascade's deletes stay
# on the workers. So the vectors and chunks are deleted explicitly (their rowcounts are the
# report), after the agent's queue rows are locked, in the same order as on one server.
SELECT_BATCH = """
SELECT e.agent, e.id, e.created_at FROM episodes e
WHERE {where} AND e.created_at >= %(after_t)s AND (e.created_at, e.id) > (%(after_t)s, %(after_id)s)
ORDER BY e.created_at, e.id LIMIT %(limit)s
"""
LOCK_AGENT_QUEUE = """
SELECT 1 FROM embed_queue q JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
WHERE q.agent = %(agent)s AND c.agent = %(agent)s AND c.episode_id = ANY(%(ids)s)
ORDER BY q.chunk_id, q.model_id
FOR UPDATE OF q
"""
DELETE_AGENT_VECTORS = """
DELETE FROM {table} v WHERE v.agent = %(agent)s
  AND v.chunk_id IN (SELECT c.id FROM chunks c WHERE c.agent = %(agent)s AND c.episode_id = ANY(%(ids)s))
"""
DELETE_AGENT_CHUNKS = "DELETE FROM chunks WHERE agent = %(agent)s AND episode_id = ANY(%(ids)s)"
DELETE_AGENT_EPISODES = "DELETE FROM episodes WHERE agent = %(agent)s AND id = ANY(%(ids)s)"


def _delete_batch_by_agent(conn, query, params: dict, vector_tables: list[str]) -> tuple[dict, list[int]]:
    """One batch on Citus: (the batch row DELETE_BATCH would return, [chunks, vectors] deleted)."""
    from psycopg import sql

    rows = conn.execute(query, params, prepare=False).fetchall()
    batch = {"selected": len(rows), "deleted": 0}
    if not rows:
        return batch, [0, 0]
    last = rows[-1]
    batch.update(oldest=rows[0]["created_at"], last_t=last["created_at"], last_id=last["id"])
    ids: dict[str, list[int]] = {}
    for r in rows:
        ids.setdefault(r["agent"], []).append(r["id"])
    chunks = vectors = 0
    for agent in sorted(ids):
        one = {"agent": agent, "ids": ids[agent]}
        conn.execute(LOCK_AGENT_QUEUE, one).fetchall()
        for table in vector_tables:
            vectors += conn.execute(sql.SQL(DELETE_AGENT_VECTORS).format(table=sql.Identifier(table)), one).rowcount
        chunks += conn.execute(DELETE_AGENT_CHUNKS, one).rowcount
        batch["deleted"] += conn.execute(DELETE_AGENT_EPISODES, one).rowcount
    return batch, [chunks, vectors]


def _deleted_in_tx(conn, tables: list[str]) -> list[int]:
    return [r["n"] for r in conn.execute(DELETED_IN_TX, (tables,)).fetchall()]


def delete_selected(conn, kind: str, selection: Selection, done: Deleted, *, batch_size: int = DEFAULT_BATCH) -> None:
    """Delete every episode of one kind the selection matches, one short transaction per batch."""
    from psycopg import sql

    from memctl import cluster

    if batch_size <= 0:
        raise UsageError(f"the batch size must be positive, got {batch_size}")
    counted = ["chunks", *_vector_tables(conn)]
    by_agent = cluster.is_distributed(conn)
    query = sql.SQL(SELECT_BATCH if by_agent else DELETE_BATCH).format(where=sql.SQL(selection.where))
    after_t, after_id = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc), 0
    while True:
        params = {**selection.params, "after_t": after_t, "after_id": after_id, "limit": batch_size}
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(ASYNC_COMMIT)
            if by_agent:
                batch, counts = _delete_batch_by_agent(conn, query, params, counted[1:])
            else:
                before = _deleted_in_tx(conn, counted)
                batch = conn.execute(query, params, prepare=False).fetchone()
            if not batch["selected"]:
                break
            if not by_agent:
                counts = [n - b for n, b in zip(_deleted_in_tx(conn, counted), before)]
        done.max_transaction_s = max(done.max_transaction_s, time.perf_counter() - started)
        done.note(kind, batch, counts[0], sum(counts[1:]))
        after_t, after_id = batch["last_t"], batch["last_id"]


def count_by_kind(conn, selection: Selection) -> Counter:
    """How many episodes still match, per kind (the check after deleting)."""
    from psycopg import sql

    query = sql.SQL(COUNT_BY_KIND).format(where=sql.SQL(selection.where))
    return Counter({r["kind"]: r["n"] for r in conn.execute(query, selection.params, prepare=False).fetchall()})


# --- table sizes and dead tuples ---------------------------------------------

FLUSH_STATS = "SELECT pg_stat_force_next_flush()"
TABLE_STATS = """
SELECT t.name AS table, pg_total_relation_size(to_regclass(quote_ident(t.name))) AS bytes,
       coalesce(s.n_live_tup, 0) AS live_tuples, coalesce(s.n_dead_tup, 0) AS dead_tuples
FROM unnest(%s::text[]) WITH ORDINALITY AS t(name, n)
LEFT JOIN pg_stat_user_tables s ON s.relid = to_regclass(quote_ident(t.name))
ORDER BY t.n
"""
BASE_TABLES = ("episodes", "chunks", "embed_queue", "embed_failures")


def table_stats(conn, tables: list[str]) -> list[dict]:
    """Total size (heap, TOAST, indexes) and live/dead tuples of each table.

    This session's own counters are flushed first (pg_stat_force_next_flush,
    PG 15+); other sessions' counters may lag by a second or so.
    """
    from memctl import cluster

    conn.execute(FLUSH_STATS)
    rows = conn.execute(TABLE_STATS, (list(tables),)).fetchall()
    shards = cluster.placement_figures(conn)  # on Citus: the workers' figures, not the coordinator's shells
    for row in rows:
        if row["table"] in shards:
            figures = shards[row["table"]]
            row.update(bytes=figures["total_bytes"], live_tuples=figures["live_tuples"],
                       dead_tuples=figures["dead_tuples"])
    return rows


def vacuum(conn, tables: list[str]) -> None:
    """VACUUM (ANALYZE) each table: dead tuples become reusable space; files rarely shrink."""
    from psycopg import sql

    conn.execute(FLUSH_STATS)  # else our deletes' counts, flushed after VACUUM, come back as dead tuples
    for table in tables:
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))


def _before_after(before: list[dict], after: list[dict]) -> list[dict]:
    return [{"table": b["table"], "bytes_before": b["bytes"], "bytes_after": a["bytes"],
             "dead_tuples_before": b["dead_tuples"], "dead_tuples_after": a["dead_tuples"],
             "live_tuples_after": a["live_tuples"]} for b, a in zip(before, after)]


# --- prune -------------------------------------------------------------------


@dataclass
class Report:
    """What a prune or purge run did: per-kind rows, table sizes before/after, the batches."""

    kinds: list[dict]
    tables: list[dict]
    rows: int
    chunks: int
    vectors: int
    batches: int
    max_transaction_s: float
    elapsed_s: float
    remaining: int
    vacuumed: bool
    outcome: str = "ok"
    error: str | None = None
    facts: list[dict] = field(default_factory=list)
    job_log: list[dict] = field(default_factory=list)
    summaries: list[dict] = field(default_factory=list)  # purge: summaries built from the source's episodes

    def to_dict(self) -> dict:
        return asdict(self)


def _run(conn, selections: dict[str, Selection], *, batch_size: int, run_vacuum: bool) -> tuple[Report, Deleted]:
    """Delete each kind's selection in batches, check that nothing still matches, measure the tables."""
    started = time.perf_counter()
    tables = [*BASE_TABLES, *_vector_tables(conn)]
    before = table_stats(conn, tables)
    done = Deleted()
    for kind, selection in selections.items():
        delete_selected(conn, kind, selection, done, batch_size=batch_size)
    kinds = [{"kind": kind, **done.kind_row(kind), "remaining": count_by_kind(conn, s)[kind]}
             for kind, s in selections.items()]
    if run_vacuum:
        vacuum(conn, tables)
    after = table_stats(conn, tables)
    report = Report(kinds=kinds, tables=_before_after(before, after), rows=sum(done.rows.values()),
                    chunks=sum(done.chunks.values()), vectors=sum(done.vectors.values()), batches=done.batches,
                    max_transaction_s=round(done.max_transaction_s, 3),
                    elapsed_s=round(time.perf_counter() - started, 3),
                    remaining=sum(k["remaining"] for k in kinds), vacuumed=run_vacuum)
    return report, done


def _detail(report: Report, **extra) -> dict:
    detail = report.to_dict()
    del detail["outcome"], detail["error"]
    return {**extra, **detail}


def prune(conn, policy: Policy, *, batch_size: int = DEFAULT_BATCH, run_vacuum: bool = False,
          await_summary: frozenset[str] = frozenset()) -> Report:
    """Delete every episode past its kind's maximum age, in batches; verify; trim the job log; record as 'prune'.

    An empty policy deletes no episode; the job log is trimmed all the same ([retention] jobs, 90d by default).
    Kinds in await_summary lose only episodes some summary holds; each kind's row says how many it kept
    (kept_for_summary).
    """
    from memctl import jobs

    with jobs.record(conn, "prune") as job:
        now = conn.execute(NOW).fetchone()["now"]
        cutoffs = policy.cutoffs(now)
        selections = {kind: prune_selection(kind, cutoff, policy.keep_importance, await_summary=kind in await_summary)
                      for kind, cutoff in cutoffs.items()}
        report, _ = _run(conn, selections, batch_size=batch_size, run_vacuum=run_vacuum)
        for row in report.kinds:
            kind = row["kind"]
            kept = kept_for_summary(conn, kind, cutoffs[kind], policy.keep_importance) if kind in await_summary else 0
            row.update(policy=policy.max_age[kind], cutoff=cutoffs[kind], kept_for_summary=kept)
        report.job_log = trim_job_log(conn, policy, batch_size=batch_size)
        if run_vacuum and any(t["rows"] for t in report.job_log):
            vacuum(conn, list(JOB_LOG_TABLES))
        if report.remaining:
            report.outcome = "partial"
            report.error = (f"{report.remaining} episode(s) still match the policy after the prune "
                            "(written during it with an old created_at?); the next run deletes them")
        job.rows, job.outcome, job.error = report.rows, report.outcome, report.error
        job.detail = _detail(report, policy=policy.max_age, keep_importance=policy.keep_importance,
                             job_log_policy=policy.jobs, awaiting_summary=sorted(await_summary))
    return report


# --- purge -------------------------------------------------------------------

SOURCE_FACTS = """
SELECT namespace, key, value, version, updated_at FROM facts
WHERE source = %s AND (%s::timestamptz IS NULL OR updated_at >= %s)
ORDER BY namespace, key
"""
IS_BLOCKED = "SELECT reason FROM blocked_sources WHERE source = %s"
KINDS_OF = "SELECT DISTINCT e.kind FROM episodes e WHERE {where} ORDER BY e.kind"


@dataclass
class PurgePlan:
    source: str
    since: datetime.datetime | None
    blocked: bool
    kinds: list[dict]
    facts: list[dict]
    summaries: list[dict] = field(default_factory=list)  # built from the source's episodes: purged with them

    @property
    def rows(self) -> int:
        return sum(k["rows"] for k in self.kinds)


def _since(since: str | datetime.datetime | None) -> datetime.datetime | None:
    from memctl.episodes import parse_since

    if since is None or isinstance(since, datetime.datetime):
        return since
    return parse_since(since)


def _check_source(source: str) -> None:
    if not source or "\x00" in source:
        raise UsageError("a source must be a non-empty string without NUL characters")


def _source_facts(conn, source: str, since: datetime.datetime | None) -> list[dict]:
    return [{**f, "deleted": False} for f in conn.execute(SOURCE_FACTS, (source, since, since)).fetchall()]


def purge_plan(conn, source: str, since: str | datetime.datetime | None = None) -> PurgePlan:
    """Dry run of a purge: per kind the episodes from `source` (since `since`), and the facts it last set."""
    _check_source(source)
    when = _since(since)
    kinds = summarise(conn, purge_selection(source, when), _vector_tables(conn))
    blocked = conn.execute(IS_BLOCKED, (source,)).fetchone() is not None
    from memctl import summarize

    return PurgePlan(source, when, blocked, kinds, _source_facts(conn, source, when),
                     summarize.built_from(conn, source, when))


def purge(conn, source: str, since: str | datetime.datetime | None = None, *, delete_facts: bool = False,
          batch_size: int = DEFAULT_BATCH) -> Report:
    """Delete the episodes (chunks, vectors) from `source`, and with delete_facts the facts it last set.

    Facts go through facts.delete_fact, so their history records the deletion
    (source 'purge:<source>'); the values stay in the history until erased.
    Recorded as job 'purge'.
    """
    from psycopg import sql

    from memctl import jobs

    _check_source(source)
    when = _since(since)
    with jobs.record(conn, "purge") as job:
        # Summaries first: found through the lineage while the sources still exist (and again after, by the
        # source names each summary records, for one written meanwhile): a poisoned source must not live on.
        summaries = _purge_summaries(conn, source, when, batch_size)
        query = sql.SQL(KINDS_OF).format(where=sql.SQL(PURGE_WHERE))
        kinds = [r["kind"] for r in conn.execute(query, {"source": source, "since": when}).fetchall()]
        selections = {kind: purge_kind_selection(source, when, kind) for kind in kinds}
        report, _ = _run(conn, selections, batch_size=batch_size, run_vacuum=False)
        report.summaries = summaries + _purge_summaries(conn, source, when, batch_size)
        report.facts = _source_facts(conn, source, when)
        if delete_facts:
            _delete_facts(conn, report.facts, source)
        if report.remaining:
            report.outcome = "partial"
            report.error = f"{report.remaining} episode(s) from {source!r} were written during the purge and remain"
        job.rows = report.rows + len(report.summaries) + sum(f["deleted"] for f in report.facts)
        job.outcome, job.error = report.outcome, report.error
        job.detail = _detail(report, source=source, since=when)
        # keys only: the job log must not keep a copy of the values being removed
        job.detail["facts"] = [{k: f[k] for k in ("namespace", "key", "deleted")} for f in report.facts]
    return report


SUMMARIES_WHERE = "e.kind = 'summary' AND e.id = ANY(%(ids)s)"


def _purge_summaries(conn, source: str, since: datetime.datetime | None, batch_size: int) -> list[dict]:
    """Delete the summaries built from `source`'s episodes (their lineage rows cascade); the ones deleted."""
    from memctl import summarize

    found = summarize.built_from(conn, source, since)
    if found:
        selection = Selection(SUMMARIES_WHERE, {"ids": [s["id"] for s in found]})
        delete_selected(conn, "summary", selection, Deleted(), batch_size=batch_size)
    return found


def _delete_facts(conn, found: list[dict], source: str) -> None:
    from memctl import facts as facts_mod

    for fact in found:
        try:
            facts_mod.delete_fact(conn, fact["key"], namespace=fact["namespace"], source=f"purge:{source}")
            fact["deleted"] = True
        except NotFound:
            pass  # deleted meanwhile
