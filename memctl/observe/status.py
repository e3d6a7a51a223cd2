"""What state memory is in: counts, the embedding backlog, the last runs, and what needs attention."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

from memctl.config import Settings, parse_duration
from memctl.embedding import models
from memctl.errors import MemctlError
from memctl.records import jobs

if TYPE_CHECKING:
    from memctl.db.memory import Memory

COUNTS = """
SELECT (SELECT count(*) FROM episodes) AS episodes,
       (SELECT count(*) FROM chunks) AS chunks
"""
BACKLOG = """
SELECT count(*) AS pending, extract(epoch FROM now() - min(enqueued_at)) AS oldest_pending_age_s
FROM embed_queue WHERE model_id = %s
"""
FAILED = "SELECT count(*) AS failed FROM embed_failures WHERE model_id = %s"
UNREGISTERED = "SELECT count(*) AS pending FROM chunks"
LATE_FACTOR = 2  # a scheduled job is late when its last success is older than twice its interval
FAILED_OUTCOMES = ("failed", "unavailable")


def collect(conn: Memory) -> dict:
    """Counts, backlog and last runs, plus `warnings`: a list of what an operator should look at."""
    report = dict(conn.one(COUNTS))
    model = models.active(conn)
    backfill = models.by_state(conn, "backfill")
    if model is None:
        report.update(
            pending=conn.one(UNREGISTERED)["pending"],
            failed=0,
            active_model=None,
            oldest_pending_age_s=None,
        )
    else:
        backlog = conn.one(BACKLOG, (model.id,))
        age = backlog["oldest_pending_age_s"]
        report.update(
            pending=backlog["pending"],
            failed=conn.one(FAILED, (model.id,))["failed"],
            active_model=model.label,
            oldest_pending_age_s=round(float(age), 1) if age is not None else None,
        )
    # Chunks no worker will ever embed unless re-queued (models.ORPHANS); `memctl embed` does that.
    report["orphaned"] = sum(
        models.count_orphans(conn, m) for m in (model, backfill) if m is not None
    )
    report["backfill_model"] = backfill.label if backfill else None
    report["last_embed"] = jobs.last(conn, "embed")
    report["last_prune"] = jobs.last(conn, "prune")
    report["last_backup"] = jobs.last(conn, "backup")
    backed_up = jobs.last_completed(conn, "backup")
    report["last_backup_age_s"] = round(float(backed_up["age_s"]), 1) if backed_up else None
    report["checked_at"] = datetime.datetime.now(datetime.timezone.utc)
    report["warnings"] = warnings(conn, report)
    return report


def _schedule(settings, job: str) -> str:
    return getattr((settings or Settings()).schedule, job)


def _retention(settings) -> dict:
    """The episode kinds with a maximum age (not keep_importance, not the job log's own limit)."""
    from memctl.retention.policy import policy_from_settings

    return policy_from_settings(settings).max_age if settings is not None else {}


def human(seconds: float) -> str:
    """A duration as an operator reads it: 45s, 12m, 3.5h, 2.0d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


RUN = {"prune": "memctl prune --yes", "backup": "memctl backup", "embed": "memctl embed"}


def _late(conn: Memory, job: str, schedule: str, *, never: str | None) -> str | None:
    """A warning if the job's last completed run is older than LATE_FACTOR times its schedule; for a job that
    never ran: `never` when it is worth saying at once, else once the memory itself is older than that (a
    timer never enabled is as late as one that stopped)."""
    limit = LATE_FACTOR * parse_duration(schedule)
    last = jobs.last_completed(conn, job)
    if last is None:
        attempt = jobs.last(conn, job)
        if attempt is not None and attempt["outcome"] != "running":
            return (
                f"{job} has never completed a run: the last one ended {attempt['outcome']}"
                + (f" ({attempt['error']})" if attempt["error"] else "")
                + f" (memctl jobs --job {job})"
            )
        if never is not None or attempt is not None:
            return never
        age = jobs.memory_created(conn)["age_s"]
        if age > limit:
            return (
                f"{job} has never run, and this memory was created {human(age)} ago, more than twice its "
                f"schedule ({schedule}, [schedule] {job}): enable memctl-{job}.timer, or run {RUN[job]}"
            )
        return None
    if last["age_s"] > limit:
        return (
            f"the last successful {job} finished {human(last['age_s'])} ago, more than twice its schedule "
            f"({schedule}, [schedule] {job}): is memctl-{job}.timer running? (memctl jobs --job {job})"
        )
    return None


def _failed_last(conn: Memory, job: str, pending: int) -> str | None:
    """A warning when the job's last run ended failed or unavailable after an earlier one completed.

    (With no completed run at all, _late says so.) Ollama down for one timer run is worth a look too:
    the warning stands until a run completes.
    """
    last = jobs.last(conn, job)
    if (
        last is None
        or last["outcome"] not in FAILED_OUTCOMES
        or jobs.last_completed(conn, job) is None
    ):
        return None
    waiting = f"; {pending} chunk(s) wait for vectors" if pending else ""
    return (
        f"the last {job} run ended {last['outcome']}"
        + (f": {last['error']}" if last["error"] else "")
        + f"{waiting} (memctl jobs --job {job})"
    )


def _instructions(conn: Memory) -> str | None:
    """A warning when the active model's vectors were made with other instructions than it expects
    (DESIGN 12): a database embedded before memctl knew nomic-embed-text's, or a changed
    [embedding] query_prefix / document_prefix. Search goes on with the vectors' own instructions."""
    settings = conn.settings if conn.has_settings else None
    from memctl.embedding.embedders import make_embedder

    model = models.active(conn)
    if model is None:
        return None
    try:
        configured = make_embedder(settings, embedder=model.embedder, model=model.model)
    except MemctlError:  # e.g. the local embedder named with another model: nothing to compare
        return None
    return models.instruction_warning(model, models.instructions(configured))


def _agents(conn: Memory) -> list[str]:
    """Registered agents whose role does not work on this server (a restore onto another one: memctl.db.wall)."""
    from memctl.db import wall

    return wall.warnings(conn)


def warnings(conn: Memory, report: dict) -> list[str]:
    settings = conn.settings if conn.has_settings else None
    found = []
    embed_every = _schedule(settings, "embed")
    never_embedded = None
    if report["pending"]:
        never_embedded = (
            f"embed has never run and {report['pending']} chunk(s) wait for vectors: run memctl embed "
            "or enable memctl-embed.timer"
        )
    found.append(_late(conn, "embed", embed_every, never=never_embedded))
    found.append(_failed_last(conn, "embed", report["pending"]))
    age = report["oldest_pending_age_s"]
    if age is not None and age > LATE_FACTOR * parse_duration(embed_every):
        found.append(
            f"the oldest chunk waiting for a vector was queued {human(age)} ago, more than twice the "
            f"embed schedule ({embed_every}): the worker is not keeping up or not running"
        )
    if report.get("orphaned"):
        found.append(
            f"{report['orphaned']} chunk(s) have no vector, no queue row and no failure (written while a "
            "model was being registered): the next memctl embed queues them"
        )
    found.append(_instructions(conn))
    if report["failed"]:
        found.append(
            f"{report['failed']} chunk(s) were refused by the embedding model and have no vector "
            "(memctl embed --retry-failed puts them back in the queue)"
        )
    policy = _retention(settings)
    never = None
    if policy:
        never = (
            "prune has never run although a retention policy is set ([retention] "
            + ", ".join(f"{k} = {v}" for k, v in sorted(policy.items()))
            + "): memctl prune --yes "
            "or enable memctl-prune.timer"
        )
    # Prune (it trims the job log too) and backup are scheduled from the start (docs/systemd.md): one that
    # never ran is late once the memory is older than twice its schedule, like one that stopped.
    found.append(_late(conn, "prune", _schedule(settings, "prune"), never=never))
    found.append(_late(conn, "backup", _schedule(settings, "backup"), never=None))
    found.append(_failed_last(conn, "backup", 0))
    from memctl.db import preflight
    from memctl.retention import summarize

    found.append(summarize.overdue(conn))
    found.extend(preflight.version_warnings(conn))
    found.extend(_agents(conn))
    return [w for w in found if w]
