"""Prune: delete episodes past their kind's maximum age (memctl.retention.policy), and trim the job log.

The episodes go in short batches (memctl.retention.deletion). A kind that summarize covers loses only the
episodes some summary holds while [retention] require_summary is on (the caller names those kinds:
memctl.retention.summarize.awaited_kinds).
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from memctl.errors import UsageError
from memctl.records import lineage
from memctl.retention import deletion
from memctl.retention.policy import Policy

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# The episodes of one kind past its age (a WHERE clause over `episodes e`). A first's age counts from the last
# time it was seen (memctl.write.repeats): it goes with its last repeat, and never before (memctl.retention.deletion).
PRUNE_WHERE = (
    "e.kind = %(kind)s AND e.created_at < %(cutoff)s AND coalesce(e.last_seen_at, e.created_at) < %(cutoff)s"
    " AND (%(keep)s::int IS NULL OR e.importance < %(keep)s)"
)
# An episode some summary was built from: the lineage's one definition (memctl.records.lineage).
PRUNE_SUMMARIZED_WHERE = PRUNE_WHERE + " AND " + lineage.SUMMARIZED
PRUNE_UNSUMMARIZED_WHERE = PRUNE_WHERE + " AND " + lineage.UNSUMMARIZED


def prune_selection(
    kind: str, cutoff: datetime.datetime, keep: int | None, *, await_summary: bool = False
) -> deletion.Selection:
    """A kind past its age; with await_summary only the episodes some summary was built from."""
    where = PRUNE_SUMMARIZED_WHERE if await_summary else PRUNE_WHERE
    return deletion.Selection(where, {"kind": kind, "cutoff": cutoff, "keep": keep})


def kept_for_summary(conn: Memory, kind: str, cutoff: datetime.datetime, keep: int | None) -> int:
    """Episodes of a kind past its age that prune keeps because no summary holds them yet."""
    from psycopg import sql

    query = sql.SQL("SELECT count(*) AS n FROM episodes e WHERE {}").format(
        sql.SQL(PRUNE_UNSUMMARIZED_WHERE)
    )
    return conn.one(query, {"kind": kind, "cutoff": cutoff, "keep": keep})["n"]


# --- dry run -------------------------------------------------------------------

KEPT_BY_IMPORTANCE = """
SELECT count(*) AS n FROM episodes e WHERE e.kind = %s AND e.created_at < %s AND e.importance >= %s
"""
UNNAMED_KINDS = (
    "SELECT kind, count(*) AS rows FROM episodes WHERE kind <> ALL(%s) GROUP BY kind ORDER BY kind"
)


def plan(
    conn: Memory, policy: Policy, *, await_summary: frozenset[str] = frozenset()
) -> list[dict]:
    """Dry run of a prune: per kind of the policy, what it would delete (none for an empty policy).

    Kinds in await_summary lose only the episodes a summary holds; kept_for_summary counts the others.
    """
    now = conn.one(deletion.NOW)["now"]
    tables = deletion.vector_table_names(conn)
    rows = []
    for kind, cutoff in policy.cutoffs(now).items():
        held = kind in await_summary
        selection = prune_selection(kind, cutoff, policy.keep_importance, await_summary=held)
        found = deletion.summarise(conn, selection, tables)
        row = (
            found[0]
            if found
            else {"rows": 0, "oldest": None, "newest": None, "chunks": 0, "vectors": 0, "bytes": 0}
        )
        kept = 0
        if policy.keep_importance is not None:
            kept = conn.one(KEPT_BY_IMPORTANCE, (kind, cutoff, policy.keep_importance))["n"]
        rows.append(
            {
                "kind": kind,
                "policy": policy.max_age[kind],
                "cutoff": cutoff,
                "rows": row["rows"],
                "oldest": row["oldest"],
                "newest": row["newest"],
                "chunks": row["chunks"],
                "vectors": row["vectors"],
                "bytes": row["bytes"],
                "kept_by_importance": kept,
                "kept_for_summary": kept_for_summary(conn, kind, cutoff, policy.keep_importance)
                if held
                else 0,
            }
        )
    return rows


def unnamed_kinds(conn: Memory, policy: Policy) -> list[dict]:
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


def job_log_plan(conn: Memory, policy: Policy) -> list[dict]:
    """Dry run of the job log trim: per table the rows older than [retention] jobs (and how many say 'running')."""
    cutoff = policy.job_log_cutoff(conn.one(deletion.NOW)["now"])
    rows = conn.execute(JOB_LOG_PLAN, {"cutoff": cutoff}).fetchall()
    return [{**row, "policy": policy.jobs, "cutoff": cutoff} for row in rows]


def trim_job_log(
    conn: Memory, policy: Policy, *, batch_size: int = deletion.DEFAULT_BATCH
) -> list[dict]:
    """Delete jobs and runbook_runs rows started before the cutoff, one short transaction per batch."""
    if batch_size <= 0:
        raise UsageError(f"the batch size must be positive, got {batch_size}")
    cutoff = policy.job_log_cutoff(conn.one(deletion.NOW)["now"])
    done = []
    for table, statement in JOB_LOG_TABLES.items():
        deleted = batches = 0
        while True:
            with conn.transaction():
                conn.execute(deletion.ASYNC_COMMIT)
                count = conn.execute(statement, {"cutoff": cutoff, "limit": batch_size}).rowcount
            deleted, batches = deleted + count, batches + (count > 0)
            if count < batch_size:
                break
        done.append(
            {
                "table": table,
                "policy": policy.jobs,
                "cutoff": cutoff,
                "rows": deleted,
                "batches": batches,
            }
        )
    return done


# --- prune -------------------------------------------------------------------


def prune(
    conn: Memory,
    policy: Policy,
    *,
    batch_size: int = deletion.DEFAULT_BATCH,
    run_vacuum: bool = False,
    await_summary: frozenset[str] = frozenset(),
) -> deletion.Report:
    """Delete every episode past its kind's maximum age, in batches; verify; trim the job log; record as 'prune'.

    An empty policy deletes no episode; the job log is trimmed all the same ([retention] jobs, 90d by default).
    Kinds in await_summary lose only episodes some summary holds; each kind's row says how many it kept
    (kept_for_summary).
    """
    from memctl.records import erasures, jobs

    with jobs.record(conn, "prune") as job:
        now = conn.one(deletion.NOW)["now"]
        cutoffs = policy.cutoffs(now)
        selections = {
            kind: prune_selection(
                kind, cutoff, policy.keep_importance, await_summary=kind in await_summary
            )
            for kind, cutoff in cutoffs.items()
        }
        blocked = _blocked_keys(conn, selections)
        summaries = erasures.summaries_of(conn, blocked) if blocked else []
        secret = erasures.load_key() if blocked else b""
        items, texts = (
            erasures.capture_episodes(conn, blocked + summaries, secret) if blocked else ([], [])
        )
        report, _ = deletion.run(conn, selections, batch_size=batch_size, run_vacuum=run_vacuum)
        if items:  # a blocked source's episodes are an erasure: a restore must not bring them back
            _erase_blocked(conn, blocked, summaries, items, texts, secret, batch_size)
        for row in report.kinds:
            kind = row["kind"]
            kept = (
                kept_for_summary(conn, kind, cutoffs[kind], policy.keep_importance)
                if kind in await_summary
                else 0
            )
            row.update(policy=policy.max_age[kind], cutoff=cutoffs[kind], kept_for_summary=kept)
        report.job_log = trim_job_log(conn, policy, batch_size=batch_size)
        if run_vacuum and any(t["rows"] for t in report.job_log):
            deletion.vacuum(conn, list(JOB_LOG_TABLES))
        if report.remaining:
            report.outcome = "partial"
            report.error = (
                f"{report.remaining} episode(s) still match the policy after the prune "
                "(written during it with an old created_at?); the next run deletes them"
            )
        job.rows, job.outcome, job.error = report.rows, report.outcome, report.error
        job.detail = deletion.detail(
            report,
            policy=policy.max_age,
            keep_importance=policy.keep_importance,
            job_log_policy=policy.jobs,
            awaiting_summary=sorted(await_summary),
        )
    return report


def _erase_blocked(
    conn: Memory,
    blocked: list,
    summaries: list,
    items: list[dict],
    texts: list[str],
    secret: bytes,
    batch_size: int,
) -> None:
    """After a prune deleted a blocked source's episodes: the summaries built from them go too, runs and job log
    rows lose what they quoted, and the ledger records it all (memctl.records.erasures)."""
    from memctl.records import erasures
    from memctl.retention import purge

    quotes: list[str] = []
    purge.delete_summaries(conn, [i for _, i in summaries], batch_size)
    with conn.transaction():
        counts = {
            "episodes": len(blocked),
            "summaries": len(summaries),
            "runbook_runs": erasures.unlink_runs(conn, blocked + summaries, secret, quotes),
            **erasures.scrub_quotes(conn, texts, secret, quotes),
        }
    sources = ",".join(sorted({r["source"] for r in conn.execute(BLOCKED_SOURCES).fetchall()}))
    erasures.record(
        conn,
        erasures.new_entry(
            conn,
            "prune_blocked",
            key=secret,
            source=sources,
            counts=counts,
            items={"episodes": items, "quotes": quotes},
        ),
    )


BLOCKED_SOURCES = "SELECT source FROM blocked_sources"
BLOCKED_KEYS = """
SELECT e.agent, e.id FROM episodes e WHERE ({where}) AND e.source IN (SELECT source FROM blocked_sources)
"""


def _blocked_keys(conn: Memory, selections: dict[str, deletion.Selection]) -> list[tuple[str, int]]:
    """The episodes a prune is about to delete that came from a blocked source (recorded in the erasure ledger)."""
    from psycopg import sql

    keys = []
    for selection in selections.values():
        query = sql.SQL(BLOCKED_KEYS).format(where=sql.SQL(selection.where))
        keys += [
            (r["agent"], r["id"])
            for r in conn.execute(query, selection.params, prepare=False).fetchall()
        ]
    return keys
