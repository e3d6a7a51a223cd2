"""The whole memory as one JSONL stream: `memctl export` and `memctl import`.

Format 1. The first line is a header: {"type": "header", "format": 1, "memctl": version,
"models": [...], "vectors": model or null, "exported_at", "agent", "since", "digest_key"}. Then one object
per record, each with a `type`, in this order (an import relies on it to remap ids):

    blocked_source  source, reason, blocked_at
    fact            namespace, key, value (null once deleted), source, version, updated_at, [valid_from],
                    history: [{version, op, old_value, new_value, source, changed_at, [valid_from]}, ...]
    episode         id, agent, kind, source, importance, created_at, meta, content, repeat_of (the id of
                    the first it repeats, null for a first: docs/repeats.md; absent in older files),
                    record_key (32 lowercase hex digits: the identity `episode import` and `ingest` gave the
                    record, docs/ingest.md; null for an episode written otherwise; absent in older files);
                    with --vectors also chunks: [{seq, content, embedding}] of the model in the header
    summary_source  agent, summary_id, source_id, source_created_at, source_hash (hex: the source's sha256,
                    keyed under the installation's erasure key, which the header names as digest_key: never a
                    plain digest; a file without digest_key was written before, with plain ones)
    runbook_run     agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step,
                    failed_step, exit_code, duration_s, output_tail, episode_id

Export reads one REPEATABLE READ snapshot through server-side cursors, so memory stays
constant whatever the row count. `--agent` and `--since` filter episodes, lineage and runbook
runs; facts and blocked sources are global and always exported whole. A fact's valid_from
(when the value became true, docs/facts.md) is written only where it differs from the time
the version was recorded (updated_at, changed_at): absent, as in files written before memctl
kept valid time, it is that time.
Reading it back is memctl.transfer.import_.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from memctl import __version__
from memctl.embedding import models
from memctl.errors import InvalidInput
from memctl.files import jsonl

if TYPE_CHECKING:
    from memctl.db.memory import Memory

FORMAT = 1
TYPES = ("header", "blocked_source", "fact", "episode", "summary_source", "runbook_run")
ITERSIZE = 2000


SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
HAS_LINEAGE = "SELECT to_regclass('summary_sources') IS NOT NULL AS present"
BLOCKED = "SELECT source, reason, blocked_at FROM blocked_sources ORDER BY source"
FACT_HISTORY = """
SELECT h.namespace, h.key, h.version AS h_version, h.op, h.old_value, h.new_value, h.source AS h_source,
       h.changed_at, h.valid_from AS h_valid_from, f.value, f.source, f.version, f.updated_at, f.valid_from
FROM fact_history h LEFT JOIN facts f ON f.namespace = h.namespace AND f.key = h.key
ORDER BY h.namespace, h.key, h.version, h.id
"""
# Episodes are turned into JSON lines by the server: most of an export is episodes, and
# building each line in Python cost about 20x a COPY of the same rows (measured, 20,000 rows).
EPISODES = """
SELECT json_build_object('type', 'episode', 'id', e.id, 'agent', e.agent, 'kind', e.kind, 'source', e.source,
                         'importance', e.importance, 'created_at', e.created_at, 'meta', e.meta,
                         'content', e.content, 'repeat_of', e.repeat_of,
                         'record_key', encode(e.record_key, 'hex'){chunks})::text AS line
FROM episodes e
WHERE (%(agent)s::text IS NULL OR e.agent = %(agent)s) AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s)
ORDER BY e.id
"""
CHUNKS = """, 'chunks', (
    SELECT coalesce(json_agg(json_build_object('seq', c.seq, 'content', c.content,
                                               'embedding', v.embedding::text::json) ORDER BY c.seq), '[]')
    FROM chunks c LEFT JOIN {table} v ON v.agent = c.agent AND v.chunk_id = c.id
    WHERE c.agent = e.agent AND c.episode_id = e.id)"""
VECTORS = """
SELECT count(*) AS n FROM {table} v JOIN chunks c ON c.agent = v.agent AND c.id = v.chunk_id
JOIN episodes e ON e.agent = c.agent AND e.id = c.episode_id
WHERE (%(agent)s::text IS NULL OR e.agent = %(agent)s) AND (%(since)s::timestamptz IS NULL OR e.created_at >= %(since)s)
"""
LINEAGE = """
SELECT l.agent, l.summary_id, l.source_id, l.source_created_at, encode(l.source_hash, 'hex') AS source_hash
FROM summary_sources l JOIN episodes s ON s.agent = l.agent AND s.id = l.summary_id
WHERE (%(agent)s::text IS NULL OR l.agent = %(agent)s) AND (%(since)s::timestamptz IS NULL OR s.created_at >= %(since)s)
ORDER BY l.agent, l.summary_id, l.source_id
"""
RUNS = """
SELECT agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step, failed_step, exit_code,
       duration_s, output_tail, episode_id
FROM runbook_runs
WHERE (%(agent)s::text IS NULL OR agent = %(agent)s) AND (%(since)s::timestamptz IS NULL OR started_at >= %(since)s)
ORDER BY started_at, id
"""


@dataclass
class ExportResult:
    blocked_sources: int = 0
    facts: int = 0
    fact_history: int = 0
    episodes: int = 0
    vectors: int = 0
    summary_sources: int = 0
    runbook_runs: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def dumps(record: dict) -> str:
    return jsonl.dumps(record, compact=True)


def _stream(conn: Memory, query, params=None) -> Iterator[dict]:
    with conn.cursor(name="memctl_export") as cur:
        cur.itersize = ITERSIZE
        cur.execute(query, params)
        yield from cur


def export(
    conn: Memory,
    write: Callable[[str], Any],
    *,
    agent: str | None = None,
    since: datetime.datetime | None = None,
    vectors: bool = False,
) -> ExportResult:
    """Write the memory as JSONL lines through `write` (one call per line), from one snapshot."""
    result = ExportResult()
    filters = {"agent": agent, "since": since}
    with conn.transaction():
        conn.execute(SNAPSHOT)
        conn.execute("SET LOCAL TimeZone = 'UTC'")  # every time in the file written alike
        active = models.active(conn)
        if vectors and active is None:
            raise InvalidInput(
                "--vectors: the database has no active embedding model yet (run memctl embed)"
            )
        header = {
            "type": "header",
            "format": FORMAT,
            "memctl": __version__,
            "exported_at": datetime.datetime.now(datetime.timezone.utc),
            "agent": agent,
            "since": since,
            "models": [_model(m) for m in models.all_models(conn)],
            "vectors": _model(active) if vectors and active is not None else None,
            "digest_key": _digest_key(),
        }
        write(dumps(header) + "\n")
        for row in conn.execute(BLOCKED).fetchall():
            write(dumps({"type": "blocked_source", **row}) + "\n")
            result.blocked_sources += 1
        for record in _facts(_stream(conn, FACT_HISTORY)):
            write(dumps(record) + "\n")
            result.facts += 1
            result.fact_history += len(record["history"])
        for line in _episode_lines(conn, filters, active if vectors else None, result):
            write(line + "\n")
            result.episodes += 1
        if conn.one(HAS_LINEAGE)["present"]:
            for row in _stream(conn, LINEAGE, filters):
                write(dumps({"type": "summary_source", **row}) + "\n")
                result.summary_sources += 1
        for row in _stream(conn, RUNS, filters):
            write(dumps({"type": "runbook_run", **row}) + "\n")
            result.runbook_runs += 1
    return result


def _digest_key() -> str:
    """The id of the key the lineage digests are keyed under (memctl.places.key_id; "unknown" without one here)."""
    from memctl import places
    from memctl.write import erased

    key = erased.load_key(create=False)
    return places.key_id(key) if key is not None else "unknown"


def _model(model: models.Model) -> dict:
    return {
        "embedder": model.embedder,
        "model": model.model,
        "dims": model.dims,
        "storage": model.storage,
        "request_dims": model.request_dims,
        "state": model.state,
        "query_prefix": model.query_prefix,
        "document_prefix": model.document_prefix,
    }


def _facts(rows: Iterable[dict]) -> Iterator[dict]:
    """One record per key, its history in version order (the rows arrive sorted by key)."""
    record = None
    for row in rows:
        if record is None or (record["namespace"], record["key"]) != (row["namespace"], row["key"]):
            if record is not None:
                yield record
            record = {
                "type": "fact",
                "namespace": row["namespace"],
                "key": row["key"],
                "value": row["value"],
                "source": row["source"],
                "version": row["version"],
                "updated_at": row["updated_at"],
                **_valid_from(row["valid_from"], row["updated_at"]),
                "history": [],
            }
        record["history"].append(
            {
                "version": row["h_version"],
                "op": row["op"],
                "old_value": row["old_value"],
                "new_value": row["new_value"],
                "source": row["h_source"],
                "changed_at": row["changed_at"],
                **_valid_from(row["h_valid_from"], row["changed_at"]),
            }
        )
    if record is not None:
        yield record


def _valid_from(valid_from: datetime.datetime | None, recorded: datetime.datetime | None) -> dict:
    """{"valid_from": ...} where it says more than the recorded time, else nothing (the reader's default)."""
    return {} if valid_from is None or valid_from == recorded else {"valid_from": valid_from}


def _episode_lines(
    conn: Memory, filters: dict, model: models.Model | None, result: ExportResult
) -> Iterator[str]:
    from psycopg import sql

    chunks: sql.Composable = sql.SQL("")
    if model is not None:
        table = sql.Identifier(model.table_name)
        chunks = sql.SQL(CHUNKS).format(table=table)
        result.vectors = conn.one(sql.SQL(VECTORS).format(table=table), filters)["n"]
    for row in _stream(conn, sql.SQL(EPISODES).format(chunks=chunks), filters):
        yield row["line"]
