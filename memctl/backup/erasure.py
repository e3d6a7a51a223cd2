"""An erasure kept true over time: its receipt, the check that nothing erased is back, and a restore's
re-application of the erasures newer than its backup (the ledger itself: memctl.records.erasures).

How digests are matched (`find_matches`), each under the key the entry names, in every place memctl.places
declares:
  WHOLE and QUOTE columns               (episodes.content, chunks.content, runbook_runs.output_tail, jobs.error
                                        and detail) against every digest of every entry;
  summary_sources.source_hash           against the lineage digest of every erased episode (an entry made before
                                        those were kept: the lineage row of an erased episode's agent and id);
  episodes.source                       against a purge's source digest, for episodes created in the purge's
                                        window (after --since, before the purge): the source may write again;
  facts.value, fact_history old/new     against the digests of the same namespace and key (a value such as
                                        "true" under another key is not a copy).
An entry made under another key (the key file was lost) cannot be tested: it is counted, not matched.

A restore (memctl.backup.restore) runs `reapply_sql` in the transaction that restores and checks the
dump: the episodes of every entry newer than the backup go (by agent and id, and only while their text
still has the recorded digest: ids are reused after a restore of an older backup), with their chunks,
vectors, queue and access rows (cascade), and the summaries built from them; runs lose the link to them;
every QUOTE column whose whole value the entry holds is rewritten (memctl.places); the facts an erasure
removed go and their history values are cleared. Then, before the restore returns, `after_restore` adds
what SQL alone cannot: the history marker of each fact erasure, the facts a purge deleted (as deletions),
and a redaction fix run again.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import TYPE_CHECKING

from psycopg import sql

from memctl import places
from memctl.records import erasures

if TYPE_CHECKING:
    from memctl.db.memory import Memory

WARNING_TAG = "memctl-reapplied "
VACUUMED = (
    "episodes",
    "chunks",
    "embed_queue",
    "embed_failures",
    "episode_access",
    "summary_sources",
    "runbook_runs",
    "jobs",
)
WAL_NOTE = (
    "the WAL written before the erasure holds the texts until the server recycles those segments (after "
    "the next checkpoints, once max_wal_size/wal_keep_size no longer keep them); WAL archives "
    "(archive_mode), base backups and streaming or logical replicas keep them until they age out or are "
    "rebuilt; file systems and disks may keep freed blocks until overwritten"
)


# --- --full ----------------------------------------------------------------------------------------


def vacuum_full(conn: Memory, *, facts: bool = False) -> dict:
    """VACUUM FULL every table an erasure of episodes touches (each rewritten into new files; an exclusive lock
    while it runs), pg_statistic where allowed (ANALYZE keeps sample values of text columns there), then
    CHECKPOINT (superuser or pg_checkpoint; skipped and said otherwise)."""
    import psycopg

    tables = [*VACUUMED, *(r["table_name"] for r in conn.execute(erasures.MODELS).fetchall())]
    tables += ["facts", "fact_history"] if facts else []
    for table in tables:
        conn.execute(sql.SQL("VACUUM (FULL, ANALYZE) {}").format(sql.Identifier(table)))
    statistics = conn.one("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")["rolsuper"]
    if statistics:
        conn.execute("VACUUM (FULL) pg_catalog.pg_statistic")
    try:
        conn.execute("CHECKPOINT")
        checkpoint = True
    except psycopg.errors.InsufficientPrivilege:
        checkpoint = False
    return {
        "ran": "VACUUM FULL",
        "tables": tables,
        "pg_statistic": bool(statistics),
        "checkpoint": checkpoint,
    }


# --- the receipt -----------------------------------------------------------------------------------

JOB_FILES = """
SELECT job, started_at, detail->>'file' AS file FROM jobs
WHERE job IN ('backup', 'export') AND outcome IN ('ok', 'partial') AND detail ? 'file' AND started_at <= %s
ORDER BY started_at
"""
REPLICAS = "SELECT application_name, state, sync_state FROM pg_stat_replication"
SETTINGS = "SELECT current_setting('archive_mode') AS archive_mode, current_setting('wal_level') AS wal_level"


def copies(conn: Memory, erased_at: datetime.datetime) -> dict:
    """Where copies of what was erased can still be: memctl's backups and exports made before it, WAL, replicas."""
    settings = conn.settings
    import psycopg

    from memctl.backup import backup

    found: dict[str, dict] = {}
    directory = backup.default_dir(settings)
    for path in sorted(directory.glob("memctl-*.tar")) if directory.is_dir() else []:
        when = _stamp(path.name)
        if when is not None and when <= erased_at:
            found[str(path)] = {
                "file": str(path),
                "created_at": when.isoformat(),
                "exists": True,
                "kind": "safety" if path.name.startswith(backup.SAFETY_PREFIX) else "backup",
            }
    exports = []
    for row in conn.execute(JOB_FILES, (erased_at,)).fetchall():
        item = {
            "file": row["file"],
            "created_at": row["started_at"].isoformat(),
            "exists": row["file"] != "-" and Path(row["file"]).exists(),
        }
        if row["job"] == "export":
            exports.append(
                {**item, "note": "written to stdout: wherever it was piped"}
                if row["file"] == "-"
                else item
            )
        elif row["file"] not in found:
            found[row["file"]] = {**item, "kind": "backup"}
    try:
        replicas = conn.execute(REPLICAS).fetchall()
    except psycopg.Error:
        replicas = []
    wal = conn.one(SETTINGS)
    return {
        "backups": sorted(
            (b for b in found.values() if b["exists"]), key=lambda b: b["created_at"]
        ),
        "backups_gone": sorted((b["file"] for b in found.values() if not b["exists"])),
        "exports": exports,
        "wal": WAL_NOTE,
        "archive_mode": wal["archive_mode"],
        "replicas": replicas,
    }


def _stamp(name: str) -> datetime.datetime | None:
    import re

    match = re.search(r"(\d{8}T\d{6})Z", name)
    if match is None:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(
        tzinfo=datetime.timezone.utc
    )


def receipt(
    conn: Memory,
    *,
    op: str,
    ledger: str | None,
    target: dict,
    removed: dict,
    vacuum: dict | None,
    entry: erasures.Entry | None = None,
) -> dict:
    """The receipt of one erasure (its schema: docs/retention.md)."""
    entry = entry or next((e for e in erasures.read_table(conn) if e.id == ledger), None)
    erased_at = entry.erased_at if entry else conn.one(erasures.DATABASE)["now"]
    return {
        "receipt": "memctl-erasure",
        "version": 1,
        "op": op,
        "erased_at": erased_at.isoformat(),
        "target": target,
        "removed": removed,
        "vacuum": vacuum
        or {"ran": None, "note": "autovacuum makes the space reusable; --full rewrites"},
        "ledger": {
            "id": ledger,
            "table": "erasures",
            "file": str(erasures.ledger_path()),
            "digests": len(entry.digests()) if entry else 0,
        },
        "copies": copies(conn, erased_at),
    }


def find_entry(conn: Memory, wanted: str) -> erasures.Entry:
    """The ledger entry whose id is WANTED or starts with it (at least 8 characters; table and file synced)."""
    from memctl.errors import NotFound, UsageError

    if len(wanted) < 8 or not all(c in "0123456789abcdef" for c in wanted.lower()):
        raise UsageError(
            f"an erasure's id is 8 to 32 hex digits, as a receipt or `erasure verify` names it, got "
            f"{wanted[:40]!r}"
        )
    found = [e for e in erasures.sync(conn) if e.id.startswith(wanted.lower())]
    if not found:
        raise NotFound(
            f"no erasure {wanted!r} in the ledger (table erasures, {erasures.ledger_path()})"
        )
    if len(found) > 1:
        raise UsageError(f"{len(found)} erasures start with {wanted!r}: give more of the id")
    return found[0]


def reissue(conn: Memory, entry: erasures.Entry) -> dict:
    """The receipt of a past erasure, written again from its ledger entry (what it removed is what the entry
    counted; which vacuum ran is not kept there)."""
    items = entry.items
    if entry.op == "fact_erase" and items.get("facts"):
        target = {"namespace": items["facts"][0]["namespace"], "key": items["facts"][0]["key"]}
    elif entry.op == "episode_delete":
        target = {
            "ids": [int(i) for i in (entry.target or "").split(",") if i],
            "summaries": items.get("summaries", []),
        }
    else:
        target = {
            "source": entry.source,
            "since": items.get("since"),
            "facts": [f"{f['namespace']}/{f['key']}" for f in items.get("facts", [])],
        }
    found = receipt(
        conn,
        op=entry.op,
        ledger=entry.id,
        target=target,
        removed=entry.counts,
        vacuum={
            "ran": None,
            "note": "written again from the ledger, which does not record the vacuum",
        },
        entry=entry,
    )
    return {**found, "reissued": True}


# --- verify ----------------------------------------------------------------------------------------

PLACE_MATCHES = """
SELECT {name} AS table, r AS row, {column} AS column, d FROM (
    SELECT ({label})::text AS r, {digest} AS d FROM {table} t WHERE t.{column_id} IS NOT NULL) AS x
WHERE d = ANY(%(digests)s)
"""
LINEAGE_MATCHES = """
SELECT 'summary_sources' AS table, agent || '/' || summary_id || ' (source ' || source_id || ')' AS row,
       'source_hash' AS column, encode(source_hash, 'hex') AS d, NULL AS entry
FROM summary_sources WHERE encode(source_hash, 'hex') = ANY(%(lineage)s)
UNION ALL
SELECT 'summary_sources', l.agent || '/' || l.summary_id || ' (source ' || l.source_id || ')', 'source_hash',
       NULL, w.entry
FROM summary_sources l
JOIN unnest(%(agents)s::text[], %(ids)s::bigint[], %(entries)s::text[], %(until)s::timestamptz[])
     AS w(agent, id, entry, until)
  ON l.agent = w.agent AND l.source_id = w.id AND l.source_created_at <= w.until
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


def text_column(column: places.Column, alias: str = "t") -> sql.Composable:
    """A declared column read as text (jsonb as its text form), qualified by ALIAS."""
    return sql.SQL("{}.{}{}").format(
        sql.Identifier(alias), sql.Identifier(column.name), sql.SQL(column.cast)
    )


def _place_queries() -> list[sql.Composed]:
    """One query per WHOLE and QUOTE column of every declared table: its rows whose value an entry holds."""
    found = []
    for rule in (places.WHOLE, places.QUOTE):
        for table, column in places.places(rule):
            found.append(
                sql.SQL(PLACE_MATCHES).format(
                    name=sql.Literal(table.name),
                    column=sql.Literal(column.name),
                    label=sql.SQL(table.label),
                    digest=sql.SQL(erasures.digest_sql("{c}")).format(c=text_column(column)),
                    table=sql.Identifier(table.name),
                    column_id=sql.Identifier(column.name),
                )
            )
    return found


def find_matches(
    conn: Memory, entries: list[erasures.Entry], key: bytes | None
) -> tuple[list[dict], list[erasures.Entry]]:
    """Rows that still hold an erased text (table, row, column, the erasure), and the entries no key tests."""
    kid = erasures.key_id(key) if key else None
    usable = [e for e in entries if e.key_id == kid]
    untestable = [e for e in entries if e.key_id != kid]
    if not usable:
        return [], untestable
    assert key is not None  # the usable entries are under this key
    owner: dict[str, erasures.Entry] = {}
    for entry in usable:
        for d in entry.digests():
            owner.setdefault(d, entry)
    ipad, opad = erasures.pads(key)
    params = {"ipad": ipad, "opad": opad, "digests": sorted(owner)}
    rows = [
        dict(r, erasure=owner[r["d"]])
        for query in _place_queries()
        for r in conn.execute(query, params, prepare=False).fetchall()
    ]
    rows += _lineage_matches(conn, usable)
    purges = [e for e in usable if e.op == "purge" and e.items.get("source_digest")]
    if purges:
        windows = {
            "sources": [e.items["source_digest"] for e in purges],
            "since": [e.items.get("since") for e in purges],
            "until": [e.erased_at for e in purges],
        }
        by_source = {e.items["source_digest"]: e for e in purges}
        query = sql.SQL(SOURCE_MATCHES).format(digest=sql.SQL(erasures.digest_sql("e.source")))
        rows += [
            dict(r, erasure=by_source[r["d"]])
            for r in conn.execute(query, {**params, **windows}, prepare=False).fetchall()
        ]
    rows += _fact_matches(conn, usable, key)
    return [_shown(r) for r in rows], untestable


def _lineage_matches(conn: Memory, usable: list[erasures.Entry]) -> list[dict]:
    """Lineage rows of a summary still built from an erased episode: by the keyed digest the entry keeps of each
    episode, or (an entry made before it kept one) by the episode's agent and id, up to the erasure's time."""
    by_lineage: dict[str, erasures.Entry] = {}
    by_id: dict[tuple[str, int], erasures.Entry] = {}
    for entry in (
        e for e in usable if e.op != "redact_fix"
    ):  # a fix rewrote its episodes: their lineage stays
        for episode in entry.items.get("episodes", []):
            if episode.get("lineage"):
                by_lineage.setdefault(episode["lineage"], entry)
            else:
                by_id.setdefault((episode["agent"], episode["id"]), entry)
    if not by_lineage and not by_id:
        return []
    entries = {e.id: e for e in usable}
    params = {
        "lineage": sorted(by_lineage),
        "agents": [a for a, _ in by_id],
        "ids": [i for _, i in by_id],
        "entries": [e.id for e in by_id.values()],
        "until": [e.erased_at for e in by_id.values()],
    }
    return [
        dict(r, erasure=by_lineage[r["d"]] if r["d"] else entries[r["entry"]])
        for r in conn.execute(LINEAGE_MATCHES, params).fetchall()
    ]


def _fact_matches(conn: Memory, usable: list[erasures.Entry], key: bytes) -> list[dict]:
    wanted: dict[tuple[str, str], tuple[set[str], erasures.Entry]] = {}
    for entry in usable:
        for fact in entry.items.get("facts", []):
            if fact.get(
                "erased", True
            ):  # a purge's deleted facts keep their history (not an erasure)
                digests, _ = wanted.setdefault((fact["namespace"], fact["key"]), (set(), entry))
                digests.update(fact.get("digests", []))
    if not wanted:
        return []
    names = list(wanted)
    found = conn.execute(
        FACT_ROWS, {"ns": [n for n, _ in names], "keys": [k for _, k in names]}
    ).fetchall()
    matches = []
    for row in found:
        digests, entry = wanted[(row["namespace"], row["key"])]
        if erasures.digest(key, row["text"]) in digests:
            matches.append(
                {
                    "table": row["table"],
                    "row": row["row"],
                    "column": row["column"],
                    "erasure": entry,
                }
            )
    return matches


def _shown(row: dict) -> dict:
    entry = row["erasure"]
    return {
        "table": row["table"],
        "row": row["row"],
        "column": row["column"],
        "erasure": entry.id[:12],
        "op": entry.op,
        "what": entry.target or entry.source,
        "erased_at": entry.erased_at.isoformat(),
    }


def verify(conn: Memory) -> dict:
    """Every ledger entry (both copies synced) tested against what is live."""
    entries = erasures.sync(conn)
    matches, untestable = find_matches(conn, entries, erasures.load_key(create=False))
    return {"entries": len(entries), "matches": matches, "untestable": len(untestable)}


def backup_report(conn: Memory, scratch) -> dict:
    """For `backup verify`: the erasures newer than the backup in `scratch`, and its rows of erased text."""
    entries = erasures.sync(conn) if erasures.has_table(conn) else []
    known = {e.id for e in erasures.read_table(scratch)}
    matches, _ = find_matches(scratch, entries, erasures.load_key(create=False))
    return {"newer": [e.summary() for e in entries if e.id not in known], "matches": matches}


# --- a restore re-applies ----------------------------------------------------------------------------

REAPPLY = """
SELECT pg_catalog.set_config('memctl.erasure_ipad', {ipad}, true),
       pg_catalog.set_config('memctl.erasure_opad', {opad}, true),
       pg_catalog.set_config('memctl.erasure_entries', {entries}, true);
/* memctl:writer */
DO $memctl$ DECLARE
  e jsonb; n_ep bigint; n_f bigint; n_h bigint; n_s bigint := 0; n_r bigint; n_q bigint; n bigint;
  gone_agents text[]; gone_ids bigint[];
  ipad bytea := pg_catalog.decode(pg_catalog.current_setting('memctl.erasure_ipad'), 'hex');
  opad bytea := pg_catalog.decode(pg_catalog.current_setting('memctl.erasure_opad'), 'hex');
BEGIN
  FOR e IN SELECT x FROM pg_catalog.jsonb_array_elements(
                           pg_catalog.current_setting('memctl.erasure_entries')::jsonb) AS x LOOP
    WITH gone AS (
      DELETE FROM {episodes} t
      USING pg_catalog.jsonb_to_recordset(e->'episodes') AS r(agent text, id bigint, digest text)
      WHERE t.agent = r.agent AND t.id = r.id
        AND (NOT (e->>'keyed')::boolean OR pg_catalog.encode(pg_catalog.sha256(opad || pg_catalog.sha256(
             ipad || pg_catalog.convert_to(t.content, 'UTF8'))), 'hex') = r.digest)
      RETURNING t.agent, t.id)
    SELECT coalesce(pg_catalog.array_agg(agent), '{{}}'), coalesce(pg_catalog.array_agg(id), '{{}}')
    INTO gone_agents, gone_ids FROM gone;
    n_ep := pg_catalog.cardinality(gone_ids);
    -- a backup from before summaries has no lineage table
    IF pg_catalog.to_regclass(pg_catalog.quote_ident({schema_name}) || '.summary_sources') IS NOT NULL THEN
      DELETE FROM {episodes} t USING {lineage} l, unnest(gone_agents, gone_ids) AS g(agent, id)
      WHERE l.agent = g.agent AND l.source_id = g.id AND t.agent = l.agent AND t.id = l.summary_id;
      GET DIAGNOSTICS n_s = ROW_COUNT;
    END IF;
    UPDATE {runs} t SET episode_id = NULL FROM unnest(gone_agents, gone_ids) AS g(agent, id)
    WHERE t.agent = g.agent AND t.episode_id = g.id;
    GET DIAGNOSTICS n_r = ROW_COUNT;
    n_q := 0;
    IF (e->>'keyed')::boolean THEN
      {quotes}
    END IF;
    DELETE FROM {facts} t USING pg_catalog.jsonb_to_recordset(e->'facts') AS r(namespace text, key text, erased boolean)
    WHERE r.erased AND t.namespace = r.namespace AND t.key = r.key;
    GET DIAGNOSTICS n_f = ROW_COUNT;
    UPDATE {history} t SET old_value = NULL, new_value = NULL
    FROM pg_catalog.jsonb_to_recordset(e->'facts') AS r(namespace text, key text, erased boolean)
    WHERE r.erased AND t.namespace = r.namespace AND t.key = r.key
      AND (t.old_value IS NOT NULL OR t.new_value IS NOT NULL);
    GET DIAGNOSTICS n_h = ROW_COUNT;
    RAISE WARNING '{tag}%', pg_catalog.jsonb_build_object('id', e->>'id', 'episodes', n_ep, 'summaries', n_s,
                                                          'runbook_runs', n_r, 'quotes', n_q, 'facts', n_f,
                                                          'fact_history_values', n_h);
  END LOOP;
END $memctl$;
"""
# One QUOTE column (memctl.places) of the restored tables: a value whose whole digest the entry holds, rewritten.
REAPPLY_QUOTE = """
UPDATE {table} t SET {column} = {erased} WHERE t.{column} IS NOT NULL
  AND pg_catalog.encode(pg_catalog.sha256(opad || pg_catalog.sha256(ipad || pg_catalog.convert_to({text}, 'UTF8'))),
                        'hex') IN (SELECT pg_catalog.jsonb_array_elements_text(e->'quotes'));
      GET DIAGNOSTICS n = ROW_COUNT;
      n_q := n_q + n;"""


def newer_than(entries: list[erasures.Entry], created_at: str) -> list[erasures.Entry]:
    created = datetime.datetime.fromisoformat(created_at)
    return [e for e in entries if e.erased_at > created]


def reapply_sql(conn: Memory, schema: str, entries: list[erasures.Entry], key: bytes | None) -> str:
    """The statements that re-apply `entries` in the restore's transaction (its search_path is empty: every
    name qualified). The key's pads travel in the script on psql's standard input, never in its arguments."""
    if not entries:
        return ""
    kid = erasures.key_id(key) if key else None
    ipad, opad = erasures.pads(key) if key else (b"", b"")
    # A redaction fix rewrote its rows rather than deleting them: after_restore runs it again.
    data = [
        {
            "id": e.id,
            "keyed": e.key_id == kid,
            "episodes": [] if e.op == "redact_fix" else e.items.get("episodes", []),
            "facts": [] if e.op == "redact_fix" else e.items.get("facts", []),
            "quotes": e.items.get("quotes", []),
        }
        for e in entries
    ]
    quotes = sql.SQL("\n      ").join(
        sql.SQL(REAPPLY_QUOTE).format(
            table=sql.Identifier(schema, table.name),
            column=sql.Identifier(column.name),
            erased=sql.SQL("{}{}").format(
                sql.Literal(column.erased), sql.SQL("::jsonb" if column.cast else "")
            ),
            text=text_column(column),
        )
        for table, column in places.places(places.QUOTE)
    )
    return (
        sql.SQL(REAPPLY)
        .format(
            ipad=sql.Literal(ipad.hex()),
            opad=sql.Literal(opad.hex()),
            entries=sql.Literal(json.dumps(data)),
            episodes=sql.Identifier(schema, "episodes"),
            facts=sql.Identifier(schema, "facts"),
            history=sql.Identifier(schema, "fact_history"),
            runs=sql.Identifier(schema, "runbook_runs"),
            lineage=sql.Identifier(schema, "summary_sources"),
            schema_name=sql.Literal(schema),
            quotes=quotes,
            tag=sql.SQL(WARNING_TAG),
        )
        .as_string(conn)
    )


def reapplied_counts(stderr: bytes) -> dict[str, dict]:
    """The rows each re-applied entry removed, from the warnings the script raised."""
    found = {}
    for line in stderr.decode("utf-8", "replace").splitlines():
        at = line.find(WARNING_TAG)
        if at >= 0:
            with_counts = json.loads(line[at + len(WARNING_TAG) :])
            found[with_counts.pop("id")] = with_counts
    return found


def after_restore(conn: Memory, entries: list[erasures.Entry]) -> None:
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
                    facts.delete_fact(
                        conn,
                        fact["key"],
                        namespace=fact["namespace"],
                        source=f"purge:{entry.source}",
                    )
            except NotFound:
                pass  # not in the backup
    if any(e.op == "redact_fix" for e in entries):
        found = redact_scan.scan(conn)
        if found.hits:
            redact_scan.fix(conn, found)
