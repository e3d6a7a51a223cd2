"""What state memory is in: counts, the embedding backlog, the last runs."""

from __future__ import annotations

import datetime

from memctl import jobs, models

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


def collect(conn) -> dict:
    report = dict(conn.execute(COUNTS).fetchone())
    model = models.active(conn)
    backfill = models.by_state(conn, "backfill")
    if model is None:
        report.update(pending=conn.execute(UNREGISTERED).fetchone()["pending"], failed=0, active_model=None,
                      oldest_pending_age_s=None)
    else:
        backlog = conn.execute(BACKLOG, (model.id,)).fetchone()
        age = backlog["oldest_pending_age_s"]
        report.update(pending=backlog["pending"], failed=conn.execute(FAILED, (model.id,)).fetchone()["failed"],
                      active_model=model.label, oldest_pending_age_s=round(float(age), 1) if age is not None else None)
    report["backfill_model"] = backfill.label if backfill else None
    report["last_embed"] = jobs.last(conn, "embed")
    report["checked_at"] = datetime.datetime.now(datetime.timezone.utc)
    return report
