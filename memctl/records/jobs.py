"""The job log: every embed, prune and purge run, with its outcome."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from memctl.errors import BadValue, MemctlError, NothingToDo, Unavailable

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# The jobs the log records (the seven, then the steps of a model change that are logged apart, and exports:
# an erasure's receipt lists the exports before it).
NAMES = ("embed", "summarize", "prune", "purge", "reembed", "backup", "restore")
LOGGED = (*NAMES, "reembed-switch", "reembed-drop-old", "reembed-abort", "export")

START = "INSERT INTO jobs (job) VALUES (%s) RETURNING id"
FINISH = """
UPDATE jobs SET finished_at = now(), outcome = %s, rows = %s, error = %s, detail = %s::jsonb WHERE id = %s
"""
LIST = """
SELECT id, job, started_at, finished_at, outcome, rows, error, detail FROM jobs
WHERE (%(job)s::text IS NULL OR job = %(job)s)
ORDER BY started_at DESC, id DESC LIMIT %(limit)s
"""
LAST = """
SELECT job, started_at, finished_at, outcome, rows, error FROM jobs
WHERE job = %s AND (%s::text IS NULL OR outcome = %s) ORDER BY started_at DESC, id DESC LIMIT 1
"""
LAST_COMPLETED = """
SELECT job, started_at, finished_at, outcome, rows, error,
       extract(epoch FROM now() - finished_at)::float8 AS age_s
FROM jobs WHERE job = %s AND outcome = ANY(%s) ORDER BY finished_at DESC, id DESC LIMIT 1
"""
COMPLETED = ("ok", "partial")
INTERRUPTED = "interrupted"  # stopped from outside: neither completed nor failed (sql/0026)


@dataclass
class Job:
    id: int
    name: str
    rows: int = 0
    outcome: str = "ok"
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@contextmanager
def record(conn: Memory, name: str) -> Iterator[Job]:
    """Record a run: a 'running' row at start, the outcome at the end (also on error).

    An exception marks the run failed (unavailable for a missing dependency)
    and propagates; a run stopped from outside (SIGINT, SIGTERM: memctl.interrupts; or the reader of its
    output gone, `export | head -1`) is 'interrupted', no failure. A process killed mid-run leaves the row
    'running'.
    """
    job = Job(conn.one(START, (name,))["id"], name)
    try:
        yield job
    except BaseException as exc:
        job.outcome, job.error = outcome_of(exc)
        if isinstance(exc, KeyboardInterrupt):
            _settle(conn)
        _finish(conn, job)
        raise
    _finish(conn, job)


def _settle(conn: Memory) -> None:
    """Make a connection an interrupt left mid-statement usable for the job's last row. psycopg cancels the
    statement it waits on, but a signal can land between a statement sent and the wait for it (seen on a server
    over TCP: the row stayed 'running', "another command is already in progress"): cancel it, read what is left,
    roll back the transaction it was in. A second signal meanwhile ends the process (memctl.interrupts)."""
    from psycopg import pq

    try:
        pgconn = conn.pgconn
        if pgconn.status != pq.ConnStatus.OK:
            return
        if pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
            conn.cancel_safe(timeout=5.0)
            for _ in range(1000):  # the cancelled statement's results, then None
                if pgconn.get_result() is None:
                    break
        if pgconn.transaction_status in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
        ):
            pgconn.exec_(b"ROLLBACK")
    except Exception:
        pass  # the row stays 'running', as for a process killed mid-run


def ended(conn: Memory, name: str, exc: BaseException) -> None:
    """Log a run that ended on EXC where no row was written around it (a restore replaces the job log itself); a
    database gone meanwhile logs nothing, as a run killed mid-way."""
    if isinstance(exc, KeyboardInterrupt):
        _settle(conn)
    try:
        job = Job(conn.one(START, (name,))["id"], name)
    except Exception:
        return
    job.outcome, job.error = outcome_of(exc)
    _finish(conn, job)


def outcome_of(exc: BaseException) -> tuple[str, str | None]:
    """The outcome and error of a run that ended on EXC."""
    if isinstance(exc, KeyboardInterrupt):  # memctl.interrupts.Interrupted: SIGINT or SIGTERM
        return INTERRUPTED, f"stopped by {exc}" if str(exc) else "stopped by SIGINT"
    if isinstance(exc, BrokenPipeError):
        return INTERRUPTED, "the reader of the output went away before its end (a closed pipe)"
    if isinstance(exc, NothingToDo):
        return "ok", None
    if isinstance(exc, Unavailable):
        return "unavailable", str(exc)
    return "failed", str(exc) if isinstance(exc, MemctlError) else f"{type(exc).__name__}: {exc}"


def _clean(text: str | None) -> str | None:
    """URL and DSN passwords masked, every other secret redacted (memctl.redact), whatever [redaction] mode says."""
    from memctl.config import mask_secrets
    from memctl.redact import redact_text

    return redact_text(mask_secrets(text))


def _masked(value: Any) -> Any:
    """The detail with every string masked and redacted, structure kept."""
    from memctl.redact import redact_value

    return redact_value(value, _clean)


def _finish(conn: Memory, job: Job) -> None:
    """Store the outcome; the error and detail masked first: an exception's text may carry a DSN or a token."""
    job.error = _clean(job.error)
    detail = json.dumps(_masked(job.detail), default=lambda v: _clean(str(v)))
    try:
        conn.execute(FINISH, (job.outcome, job.rows, job.error, detail, job.id))
    except Exception:
        pass  # the database itself went away; the row stays 'running'


def check_name(job: str | None) -> None:
    """An unknown job name is a BadValue naming the known ones (`memctl jobs --job`: not an empty answer)."""
    if job is not None and job not in LOGGED:
        raise BadValue(f"--job: no job {job!r}; the jobs are {', '.join(LOGGED)}", "--job")


def list_jobs(conn: Memory, *, job: str | None = None, limit: int = 20) -> list[dict]:
    return conn.execute(LIST, {"job": job, "limit": limit}).fetchall()


def last(conn: Memory, name: str, *, outcome: str | None = None) -> dict | None:
    return conn.execute(LAST, (name, outcome, outcome)).fetchone()


CREATED = "SELECT min(applied_at) AS at, extract(epoch FROM now() - min(applied_at)) AS age_s FROM memctl_migrations"


def memory_created(conn: Memory) -> dict:
    """When this memory was created (its first migration) and its age in seconds: where a scheduled job that never
    ran starts being late (status --check, memctl_job_last_success_timestamp_seconds)."""
    row = conn.one(CREATED)
    return {"at": row["at"], "age_s": float(row["age_s"] or 0.0)}


def last_completed(conn: Memory, name: str, outcomes: tuple[str, ...] = COMPLETED) -> dict | None:
    """The last run that finished its work (ok, or partial: it ran but left something), with age_s."""
    return conn.execute(LAST_COMPLETED, (name, list(outcomes))).fetchone()
