"""Purge: delete what a source wrote (its episodes, the summaries built from them, and on request the facts
it last set), in short batches (memctl.retention.deletion); recorded as job 'purge'.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memctl.errors import NotFound, UsageError
from memctl.records import lineage
from memctl.retention import deletion

if TYPE_CHECKING:
    from memctl.db.memory import Memory

# The episodes from a source (a WHERE clause over `episodes e`), of one kind. A repeat has its first's source
# (memctl.write.repeats folds only within one source), so a purge takes a first with its repeats; with --since,
# the repeats since then go and a first from before stays, uncounted (memctl.retention.deletion).
PURGE_WHERE = (
    "e.source = %(source)s AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s)"
)
PURGE_KIND_WHERE = PURGE_WHERE + " AND e.kind = %(kind)s"


def purge_selection(source: str, since: datetime.datetime | None) -> deletion.Selection:
    return deletion.Selection(PURGE_WHERE, {"source": source, "since": since})


def purge_kind_selection(
    source: str, since: datetime.datetime | None, kind: str
) -> deletion.Selection:
    return deletion.Selection(PURGE_KIND_WHERE, {"source": source, "since": since, "kind": kind})


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
    summaries: list[dict] = field(
        default_factory=list
    )  # built from the source's episodes: purged with them

    @property
    def rows(self) -> int:
        return sum(k["rows"] for k in self.kinds)


def _since(since: str | datetime.datetime | None) -> datetime.datetime | None:
    from memctl.records.filters import parse_since

    if since is None or isinstance(since, datetime.datetime):
        return since
    return parse_since(since)


def _check_source(source: str) -> None:
    if not source or "\x00" in source:
        raise UsageError("a source must be a non-empty string without NUL characters")


# The sources that wrote, each found by one index probe (episodes_source_idx; facts is small): what a purge that
# matched nothing suggests instead of a typo.
SOURCES = """
WITH RECURSIVE s AS (
    (SELECT source FROM episodes WHERE source IS NOT NULL ORDER BY source LIMIT 1)
    UNION ALL
    SELECT (SELECT e.source FROM episodes e WHERE e.source > s.source ORDER BY e.source LIMIT 1) FROM s
    WHERE s.source IS NOT NULL
)
SELECT source FROM (SELECT source FROM s LIMIT %(limit)s) AS episodes WHERE source IS NOT NULL
UNION SELECT DISTINCT source FROM facts WHERE source IS NOT NULL
"""
SOURCES_LOOKED_AT = 10_000


def near_sources(conn: Memory, source: str, n: int = 3) -> list[str]:
    """The sources that wrote whose names are closest to `source` (a purge that matched nothing: a typo?)."""
    import difflib

    known = [r["source"] for r in conn.execute(SOURCES, {"limit": SOURCES_LOOKED_AT}).fetchall()]
    return difflib.get_close_matches(source, known, n=n, cutoff=0.5)


def _source_facts(conn: Memory, source: str, since: datetime.datetime | None) -> list[dict]:
    return [
        {**f, "deleted": False}
        for f in conn.execute(SOURCE_FACTS, (source, since, since)).fetchall()
    ]


def purge_plan(
    conn: Memory, source: str, since: str | datetime.datetime | None = None
) -> PurgePlan:
    """Dry run of a purge: per kind the episodes from `source` (since `since`), and the facts it last set."""
    _check_source(source)
    when = _since(since)
    kinds = deletion.summarise(
        conn, purge_selection(source, when), deletion.vector_table_names(conn)
    )
    blocked = conn.execute(IS_BLOCKED, (source,)).fetchone() is not None
    return PurgePlan(
        source,
        when,
        blocked,
        kinds,
        _source_facts(conn, source, when),
        lineage.built_from(conn, source, when),
    )


PURGED_KEYS = "SELECT e.agent, e.id FROM episodes e WHERE {where}"


def purge(
    conn: Memory,
    source: str,
    since: str | datetime.datetime | None = None,
    *,
    delete_facts: bool = False,
    batch_size: int = deletion.DEFAULT_BATCH,
    full: bool = False,
) -> deletion.Report:
    """Delete the episodes (chunks, vectors) from `source`, and with delete_facts the facts it last set.

    Facts go through facts.delete_fact, so their history records the deletion
    (source 'purge:<source>'); the values stay in the history until erased.
    Recorded as job 'purge', and in the erasure ledger (memctl.records.erasures): the episodes and summaries
    deleted (ids, keyed digests of their texts and chunks), the source's digest, the facts deleted, and the
    rows removed per table (report.removed). With `full`, VACUUM FULL of every table touched and a
    CHECKPOINT (erasure.vacuum_full).
    """
    from psycopg import sql

    from memctl.records import erasures, jobs

    _check_source(source)
    when = _since(since)
    secret = erasures.load_key()
    query = sql.SQL(PURGED_KEYS).format(where=sql.SQL(PURGE_WHERE))
    keys = [
        (r["agent"], r["id"])
        for r in conn.execute(query, {"source": source, "since": when}).fetchall()
    ]
    built = [(s["agent"], s["id"]) for s in lineage.built_from(conn, source, when)]
    keys += built
    items, texts = erasures.capture_episodes(conn, keys, secret)
    before = erasures.count_rows(conn, keys)
    gone_sources = erasures.sources_gone(conn, built)
    quotes: list[str] = []
    with jobs.record(conn, "purge") as job:
        # Summaries first: found through the lineage while the sources still exist (and again after, by the
        # source names each summary records, for one written meanwhile): a poisoned source must not live on.
        summaries = _purge_summaries(conn, source, when, batch_size)
        query = sql.SQL(KINDS_OF).format(where=sql.SQL(PURGE_WHERE))
        kinds = [
            r["kind"] for r in conn.execute(query, {"source": source, "since": when}).fetchall()
        ]
        selections = {kind: purge_kind_selection(source, when, kind) for kind in kinds}
        report, _ = deletion.run(conn, selections, batch_size=batch_size, run_vacuum=False)
        report.summaries = summaries + _purge_summaries(conn, source, when, batch_size)
        report.facts = _source_facts(conn, source, when)
        fact_values = {(f["namespace"], f["key"]): f["value"] for f in report.facts}
        if delete_facts:
            _delete_facts(conn, report.facts, source)
        with conn.transaction():
            report.removed = erasures.removed(before, erasures.count_rows(conn, keys))
            report.removed["summary_sources_pruned"] = gone_sources
            report.removed["runbook_runs"] = erasures.unlink_runs(conn, keys, secret, quotes)
            report.removed["facts"] = sum(f["deleted"] for f in report.facts)
            report.removed.update(erasures.scrub_quotes(conn, texts, secret, quotes))
        if report.remaining:
            report.outcome = "partial"
            report.error = f"{report.remaining} episode(s) from {source!r} were written during the purge and remain"
        job.rows = report.rows + len(report.summaries) + sum(f["deleted"] for f in report.facts)
        job.outcome, job.error = report.outcome, report.error
        job.detail = deletion.detail(report, source=source, since=when)
        # keys only: the job log must not keep a copy of the values being removed
        job.detail["facts"] = [
            {k: f[k] for k in ("namespace", "key", "deleted")} for f in report.facts
        ]
    facts_items = [
        {
            "namespace": ns,
            "key": k,
            "digests": [erasures.digest(secret, fact_values[(ns, k)])],
            "erased": False,
        }
        for ns, k in ((f["namespace"], f["key"]) for f in report.facts if f["deleted"])
    ]
    entry = erasures.new_entry(
        conn,
        "purge",
        key=secret,
        source=source,
        target=when.isoformat() if when else None,
        counts=report.removed,
        items={
            "episodes": items,
            "facts": facts_items,
            "quotes": quotes,
            "since": when.isoformat() if when else None,
            "source_digest": erasures.digest(secret, source),
        },
    )
    report.ledger = erasures.record(conn, entry).id
    if full:
        from memctl.backup import erasure

        report.vacuum = erasure.vacuum_full(conn, facts=delete_facts)
    return report


SUMMARIES_WHERE = "e.kind = 'summary' AND e.id = ANY(%(ids)s)"


def _purge_summaries(
    conn: Memory, source: str, since: datetime.datetime | None, batch_size: int
) -> list[dict]:
    """Delete the summaries built from `source`'s episodes (their lineage rows cascade); the ones deleted."""
    found = lineage.built_from(conn, source, since)
    delete_summaries(conn, [s["id"] for s in found], batch_size)
    return found


def delete_summaries(
    conn: Memory, ids: list[int], batch_size: int = deletion.DEFAULT_BATCH
) -> None:
    """Delete these summaries (their chunks, vectors and lineage rows cascade), in batches."""
    if ids:
        selection = deletion.Selection(SUMMARIES_WHERE, {"ids": ids})
        deletion.delete_selected(
            conn, "summary", selection, deletion.Deleted(), batch_size=batch_size
        )


def _delete_facts(conn: Memory, found: list[dict], source: str) -> None:
    from memctl.records import facts as facts_mod

    for fact in found:
        try:
            facts_mod.delete_fact(
                conn, fact["key"], namespace=fact["namespace"], source=f"purge:{source}"
            )
            fact["deleted"] = True
        except NotFound:
            pass  # deleted meanwhile
