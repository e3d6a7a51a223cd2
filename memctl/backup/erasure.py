"""An erasure kept true over time: its receipt, the check that nothing erased is back, and a restore's
re-application of the erasures newer than its backup (the ledger itself: memctl.records.erasures).

How digests are matched (`find_matches`), each under the key the entry names:
  episodes.content and chunks.content   against every episode, chunk and text digest of every entry;
  episodes.source                       against a purge's source digest, for episodes created in the purge's
                                        window (after --since, before the purge): the source may write again;
  facts.value, fact_history old/new     against the digests of the same namespace and key (a value such as
                                        "true" under another key is not a copy).
An entry made under another key (the key file was lost) cannot be tested: it is counted, not matched.

A restore (memctl.backup.restore) runs `reapply_sql` in the transaction that restores and checks the
dump: the episodes of every entry newer than the backup go (by agent and id, and only while their text
still has the recorded digest: ids are reused after a restore of an older backup), with their chunks,
vectors, queue and access rows (cascade); the facts an erasure removed go and their history values are
cleared. Then, before the restore returns, `after_restore` adds what SQL alone cannot: the history
marker of each fact erasure, the facts a purge deleted (as deletions), and a redaction fix run again.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from psycopg import sql

from memctl.records import erasures

WARNING_TAG = "memctl-reapplied "
VACUUMED = ("episodes", "chunks", "embed_queue", "embed_failures", "episode_access", "summary_sources",
            "runbook_runs", "jobs")
WAL_NOTE = ("the WAL written before the erasure holds the texts until the server recycles those segments (after "
            "the next checkpoints, once max_wal_size/wal_keep_size no longer keep them); WAL archives "
            "(archive_mode), base backups and streaming or logical replicas keep them until they age out or are "
            "rebuilt; file systems and disks may keep freed blocks until overwritten")


# --- --full ----------------------------------------------------------------------------------------


def vacuum_full(conn, *, facts: bool = False) -> dict:
    """VACUUM FULL every table an erasure of episodes touches (each rewritten into new files; an exclusive lock
    while it runs), pg_statistic where allowed (ANALYZE keeps sample values of text columns there), then
    CHECKPOINT (superuser or pg_checkpoint; skipped and said otherwise)."""
    import psycopg

    tables = [*VACUUMED, *(r["table_name"] for r in conn.execute(erasures.MODELS).fetchall())]
    tables += ["facts", "fact_history"] if facts else []
    for table in tables:
        conn.execute(sql.SQL("VACUUM (FULL, ANALYZE) {}").format(sql.Identifier(table)))
    statistics = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()["rolsuper"]
    if statistics:
        conn.execute("VACUUM (FULL) pg_catalog.pg_statistic")
    try:
        conn.execute("CHECKPOINT")
        checkpoint = True
    except psycopg.errors.InsufficientPrivilege:
        checkpoint = False
    return {"ran": "VACUUM FULL", "tables": tables, "pg_statistic": bool(statistics), "checkpoint": checkpoint}


# --- the receipt -----------------------------------------------------------------------------------

JOB_FILES = """
SELECT job, started_at, detail->>'file' AS file FROM jobs
WHERE job IN ('backup', 'export') AND outcome IN ('ok', 'partial') AND detail ? 'file' AND started_at <= %s
ORDER BY started_at
"""
REPLICAS = "SELECT application_name, state, sync_state FROM pg_stat_replication"
SETTINGS = "SELECT current_setting('archive_mode') AS archive_mode, current_setting('wal_level') AS wal_level"


def copies(conn, settings, erased_at: datetime.datetime) -> dict:
    """Where copies of what was erased can still be: memctl's backups and exports made before it, WAL, replicas."""
    import psycopg

    from memctl.backup import backup

    found: dict[str, dict] = {}
    directory = backup.default_dir(settings)
    for path in sorted(directory.glob("memctl-*.tar")) if directory.is_dir() else []:
        when = _stamp(path.name)
        if when is not None and when <= erased_at:
            found[str(path)] = {"file": str(path), "created_at": when.isoformat(), "exists": True,
                                "kind": "safety" if path.name.startswith(backup.SAFETY_PREFIX) else "backup"}
    exports = []
    for row in conn.execute(JOB_FILES, (erased_at,)).fetchall():
        item = {"file": row["file"], "created_at": row["started_at"].isoformat(),
                "exists": row["file"] != "-" and Path(row["file"]).exists()}
        if row["job"] == "export":
            exports.append({**item, "note": "written to stdout: wherever it was piped"} if row["file"] == "-" else item)
        elif row["file"] not in found:
            found[row["file"]] = {**item, "kind": "backup"}
    try:
        replicas = conn.execute(REPLICAS).fetchall()
    except psycopg.Error:
        replicas = []
    wal = conn.execute(SETTINGS).fetchone()
    return {"backups": sorted((b for b in found.values() if b["exists"]), key=lambda b: b["created_at"]),
            "backups_gone": sorted((b["file"] for b in found.values() if not b["exists"])),
            "exports": exports, "wal": WAL_NOTE, "archive_mode": wal["archive_mode"],
            "replicas": replicas}


def _stamp(name: str) -> datetime.datetime | None:
    import re

    match = re.search(r"(\d{8}T\d{6})Z", name)
    if match is None:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=datetime.timezone.utc)


def receipt(conn, settings, *, op: str, ledger: str | None, target: dict, removed: dict,
            vacuum: dict | None) -> dict:
    """The receipt of one erasure (its schema: docs/retention.md)."""
    entry = next((e for e in erasures.read_table(conn) if e.id == ledger), None)
    erased_at = entry.erased_at if entry else conn.execute(erasures.DATABASE).fetchone()["now"]
    return {"receipt": "memctl-erasure", "version": 1, "op": op, "erased_at": erased_at.isoformat(),
            "target": target, "removed": removed,
            "vacuum": vacuum or {"ran": None, "note": "autovacuum makes the space reusable; --full rewrites"},
            "ledger": {"id": ledger, "table": "erasures", "file": str(erasures.ledger_path()),
                       "digests": len(entry.digests()) if entry else 0},
            "copies": copies(conn, settings, erased_at)}


# --- verify ----------------------------------------------------------------------------------------

EPISODE_MATCHES = """
SELECT 'episodes' AS table, agent || '/' || id AS row, 'content' AS column, d FROM (
    SELECT agent, id, {digest} AS d FROM episodes) AS x WHERE d = ANY(%(digests)s)
UNION ALL
SELECT 'chunks', agent || '/' || id || ' (episode ' || episode_id || ')', 'content', d FROM (
    SELECT agent, id, episode_id, {chunk_digest} AS d FROM chunks) AS x WHERE d = ANY(%(digests)s)
"""
SOURCE_MATCHES = """
SELECT 'episodes' AS table, e.agent || '/' || e.id AS row, 'source' AS column, w.d
FROM episodes e JOIN unnest(%(sources)s::text[], %(since)s::timestamptz[], %(until)s::timestamptz[]) AS w(d, since, until)
  ON {digest} = w.d AND (w.since IS NULL OR e.created_at >= w.since) AND e.created_at <= w.until
WHERE e.source IS NOT NULL
"""
FACT_ROWS = """
SELECT 'facts' AS table, namespace || '/' || key AS row, 'value' AS column, namespace, key, value AS text
FROM facts WHERE (namespace, key) IN (SELECT * FROM unnest(%(ns)s::text[], %(keys)s::text[]))
UNION ALL
SELECT 'fact_history', id::text, c.col, namespace, key, c.text FROM fact_history h
CROSS JOIN LATERAL (VALUES ('old_value', h.old_value), ('new_value', h.new_value)) AS c(col, text)
WHERE c.text IS NOT NULL AND (namespace, key) IN (SELECT * FROM unnest(%(ns)s::text[], %(keys)s::text[]))
"""


def find_matches(conn, entries: list[erasures.Entry], key: bytes | None) -> tuple[list[dict], list[erasures.Entry]]:
    """Rows that still hold an erased text (table, row, column, the erasure), and the entries no key tests."""
    kid = erasures.key_id(key) if key else None
    usable = [e for e in entries if e.key_id == kid]
    untestable = [e for e in entries if e.key_id != kid]
    if not usable:
        return [], untestable
    owner: dict[str, erasures.Entry] = {}
    for entry in usable:
        for d in entry.digests():
            owner.setdefault(d, entry)
    ipad, opad = erasures.pads(key)
    params = {"ipad": ipad, "opad": opad, "digests": sorted(owner)}
    query = sql.SQL(EPISODE_MATCHES).format(digest=sql.SQL(erasures.digest_sql("content")),
                                            chunk_digest=sql.SQL(erasures.digest_sql("content")))
    rows = [dict(r, erasure=owner[r["d"]]) for r in conn.execute(query, params, prepare=False).fetchall()]
    purges = [e for e in usable if e.op == "purge" and e.items.get("source_digest")]
    if purges:
        windows = {"sources": [e.items["source_digest"] for e in purges],
                   "since": [e.items.get("since") for e in purges], "until": [e.erased_at for e in purges]}
        by_source = {e.items["source_digest"]: e for e in purges}
        query = sql.SQL(SOURCE_MATCHES).format(digest=sql.SQL(erasures.digest_sql("e.source")))
        rows += [dict(r, erasure=by_source[r["d"]])
                 for r in conn.execute(query, {**params, **windows}, prepare=False).fetchall()]
    rows += _fact_matches(conn, usable, key)
    return [_shown(r) for r in rows], untestable


def _fact_matches(conn, usable: list[erasures.Entry], key: bytes) -> list[dict]:
    wanted: dict[tuple[str, str], tuple[set[str], erasures.Entry]] = {}
    for entry in usable:
        for fact in entry.items.get("facts", []):
            if fact.get("erased", True):  # a purge's deleted facts keep their history (not an erasure)
                digests, _ = wanted.setdefault((fact["namespace"], fact["key"]), (set(), entry))
                digests.update(fact.get("digests", []))
    if not wanted:
        return []
    names = list(wanted)
    found = conn.execute(FACT_ROWS, {"ns": [n for n, _ in names], "keys": [k for _, k in names]}).fetchall()
    matches = []
    for row in found:
        digests, entry = wanted[(row["namespace"], row["key"])]
        if erasures.digest(key, row["text"]) in digests:
            matches.append({"table": row["table"], "row": row["row"], "column": row["column"], "erasure": entry})
    return matches


def _shown(row: dict) -> dict:
    entry = row["erasure"]
    return {"table": row["table"], "row": row["row"], "column": row["column"], "erasure": entry.id[:12],
            "op": entry.op, "what": entry.target or entry.source, "erased_at": entry.erased_at.isoformat()}


def verify(conn) -> dict:
    """Every ledger entry (both copies synced) tested against what is live."""
    entries = erasures.sync(conn)
    matches, untestable = find_matches(conn, entries, erasures.load_key(create=False))
    return {"entries": len(entries), "matches": matches, "untestable": len(untestable)}


def backup_report(conn, scratch) -> dict:
    """For `backup verify`: the erasures newer than the backup in `scratch`, and its rows of erased text."""
    entries = erasures.sync(conn) if erasures.has_table(conn) else []
    known = {e.id for e in erasures.read_table(scratch)}
    matches, _ = find_matches(scratch, entries, erasures.load_key(create=False))
    return {"newer": [e.summary() for e in entries if e.id not in known],
            "matches": matches}


# --- a restore re-applies ----------------------------------------------------------------------------

REAPPLY = """
SELECT pg_catalog.set_config('memctl.erasure_ipad', {ipad}, true),
       pg_catalog.set_config('memctl.erasure_opad', {opad}, true),
       pg_catalog.set_config('memctl.erasure_entries', {entries}, true);
DO $memctl$ DECLARE
  e jsonb; n_ep bigint; n_f bigint; n_h bigint;
  ipad bytea := pg_catalog.decode(pg_catalog.current_setting('memctl.erasure_ipad'), 'hex');
  opad bytea := pg_catalog.decode(pg_catalog.current_setting('memctl.erasure_opad'), 'hex');
BEGIN
  FOR e IN SELECT x FROM pg_catalog.jsonb_array_elements(
                           pg_catalog.current_setting('memctl.erasure_entries')::jsonb) AS x LOOP
    DELETE FROM {episodes} t
    USING pg_catalog.jsonb_to_recordset(e->'episodes') AS r(agent text, id bigint, digest text)
    WHERE t.agent = r.agent AND t.id = r.id
      AND (NOT (e->>'keyed')::boolean OR pg_catalog.encode(pg_catalog.sha256(opad || pg_catalog.sha256(
           ipad || pg_catalog.convert_to(t.content, 'UTF8'))), 'hex') = r.digest);
    GET DIAGNOSTICS n_ep = ROW_COUNT;
    DELETE FROM {facts} t USING pg_catalog.jsonb_to_recordset(e->'facts') AS r(namespace text, key text, erased boolean)
    WHERE r.erased AND t.namespace = r.namespace AND t.key = r.key;
    GET DIAGNOSTICS n_f = ROW_COUNT;
    UPDATE {history} t SET old_value = NULL, new_value = NULL
    FROM pg_catalog.jsonb_to_recordset(e->'facts') AS r(namespace text, key text, erased boolean)
    WHERE r.erased AND t.namespace = r.namespace AND t.key = r.key
      AND (t.old_value IS NOT NULL OR t.new_value IS NOT NULL);
    GET DIAGNOSTICS n_h = ROW_COUNT;
    RAISE WARNING '{tag}%', pg_catalog.jsonb_build_object('id', e->>'id', 'episodes', n_ep, 'facts', n_f,
                                                          'fact_history_values', n_h);
  END LOOP;
END $memctl$;
"""


def newer_than(entries: list[erasures.Entry], created_at: str) -> list[erasures.Entry]:
    created = datetime.datetime.fromisoformat(created_at)
    return [e for e in entries if e.erased_at > created]


def reapply_sql(conn, schema: str, entries: list[erasures.Entry], key: bytes | None) -> str:
    """The statements that re-apply `entries` in the restore's transaction (its search_path is empty: every
    name qualified). The key's pads travel in the script on psql's standard input, never in its arguments."""
    if not entries:
        return ""
    kid = erasures.key_id(key) if key else None
    ipad, opad = erasures.pads(key) if key else (b"", b"")
    # A redaction fix rewrote its rows rather than deleting them: after_restore runs it again.
    data = [{"id": e.id, "keyed": e.key_id == kid, "episodes": [] if e.op == "redact_fix" else e.items.get("episodes", []),
             "facts": [] if e.op == "redact_fix" else e.items.get("facts", [])} for e in entries]
    return sql.SQL(REAPPLY).format(
        ipad=sql.Literal(ipad.hex()), opad=sql.Literal(opad.hex()), entries=sql.Literal(json.dumps(data)),
        episodes=sql.Identifier(schema, "episodes"), facts=sql.Identifier(schema, "facts"),
        history=sql.Identifier(schema, "fact_history"), tag=sql.SQL(WARNING_TAG)).as_string(conn)


def reapplied_counts(stderr: bytes) -> dict[str, dict]:
    """The rows each re-applied entry removed, from the warnings the script raised."""
    found = {}
    for line in stderr.decode("utf-8", "replace").splitlines():
        at = line.find(WARNING_TAG)
        if at >= 0:
            with_counts = json.loads(line[at + len(WARNING_TAG):])
            found[with_counts.pop("id")] = with_counts
    return found


def after_restore(conn, settings, entries: list[erasures.Entry]) -> None:
    """What the script cannot do: each fact erasure's history marker, a purge's fact deletions (as deletions,
    in the history), a redaction fix run again over what came back."""
    from memctl.errors import NotFound
    from memctl.records import facts
    from memctl.records import redact_scan

    for entry in (e for e in entries if e.op != "redact_fix"):
        for fact in entry.items.get("facts", []):
            try:
                if fact.get("erased", True):
                    facts.erase_fact(conn, fact["key"], namespace=fact["namespace"], record=False)
                else:
                    facts.delete_fact(conn, fact["key"], namespace=fact["namespace"], source=f"purge:{entry.source}")
            except NotFound:
                pass  # not in the backup
    if any(e.op == "redact_fix" for e in entries):
        found = redact_scan.scan(conn)
        if found.hits:
            redact_scan.fix(conn, settings, found)
