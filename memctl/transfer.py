"""The whole memory as one JSONL stream: `memctl export` and `memctl import`.

Format 1. The first line is a header: {"type": "header", "format": 1, "memctl": version,
"models": [...], "vectors": model or null, "exported_at", "agent", "since"}. Then one object
per record, each with a `type`, in this order (an import relies on it to remap ids):

    blocked_source  source, reason, blocked_at
    fact            namespace, key, value (null once deleted), source, version, updated_at,
                    history: [{version, op, old_value, new_value, source, changed_at}, ...]
    episode         id, agent, kind, source, importance, created_at, meta, content;
                    with --vectors also chunks: [{seq, content, embedding}] of the model in the header
    summary_source  agent, summary_id, source_id, source_created_at, source_hash (hex)
    runbook_run     agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step,
                    failed_step, exit_code, duration_s, output_tail, episode_id

Export reads one REPEATABLE READ snapshot through server-side cursors, so memory stays
constant whatever the row count. `--agent` and `--since` filter episodes, lineage and runbook
runs; facts and blocked sources are global and always exported whole.

Import runs in one transaction: a corrupt or unknown line fails it, naming the line, and
nothing is left behind. Episodes are deduplicated by (agent, content hash, created_at), fact
histories merged in version order, lineage and run records remapped to the new episode ids,
every text redacted on the way in. Vectors are used when the target's active model is the
header's (or the target has none yet: the model is registered from the header, no embedder
needed); otherwise, or when redaction changed an episode, its chunks are made anew and queued.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

from memctl import __version__, chunking, episodes, facts, jsonl, models, redact
from memctl.config import Settings
from memctl.errors import InvalidInput

FORMAT = 1
TYPES = ("header", "blocked_source", "fact", "episode", "summary_source", "runbook_run")
ITERSIZE = 2000
BATCH = 2000

# --- export -------------------------------------------------------------------

SNAPSHOT = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"
HAS_LINEAGE = "SELECT to_regclass('summary_sources') IS NOT NULL AS present"
BLOCKED = "SELECT source, reason, blocked_at FROM blocked_sources ORDER BY source"
FACT_HISTORY = """
SELECT h.namespace, h.key, h.version AS h_version, h.op, h.old_value, h.new_value, h.source AS h_source,
       h.changed_at, f.value, f.source, f.version, f.updated_at
FROM fact_history h LEFT JOIN facts f ON f.namespace = h.namespace AND f.key = h.key
ORDER BY h.namespace, h.key, h.version, h.id
"""
# Episodes are turned into JSON lines by the server: most of an export is episodes, and
# building each line in Python cost about 20x a COPY of the same rows (measured, 20,000 rows).
EPISODES = """
SELECT json_build_object('type', 'episode', 'id', e.id, 'agent', e.agent, 'kind', e.kind, 'source', e.source,
                         'importance', e.importance, 'created_at', e.created_at, 'meta', e.meta,
                         'content', e.content{chunks})::text AS line
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


def _json(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"), default=_json)


def _stream(conn, query, params=None) -> Iterator[dict]:
    with conn.cursor(name="memctl_export") as cur:
        cur.itersize = ITERSIZE
        cur.execute(query, params)
        yield from cur


def export(conn, write: Callable[[str], Any], *, agent: str | None = None, since: datetime.datetime | None = None,
           vectors: bool = False) -> ExportResult:
    """Write the memory as JSONL lines through `write` (one call per line), from one snapshot."""
    result = ExportResult()
    filters = {"agent": agent, "since": since}
    with conn.transaction():
        conn.execute(SNAPSHOT)
        conn.execute("SET LOCAL TimeZone = 'UTC'")  # every time in the file written alike
        active = models.active(conn)
        if vectors and active is None:
            raise InvalidInput("--vectors: the database has no active embedding model yet (run memctl embed)")
        header = {"type": "header", "format": FORMAT, "memctl": __version__,
                  "exported_at": datetime.datetime.now(datetime.timezone.utc), "agent": agent, "since": since,
                  "models": [_model(m) for m in models.all_models(conn)],
                  "vectors": _model(active) if vectors else None}
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
        if conn.execute(HAS_LINEAGE).fetchone()["present"]:
            for row in _stream(conn, LINEAGE, filters):
                write(dumps({"type": "summary_source", **row}) + "\n")
                result.summary_sources += 1
        for row in _stream(conn, RUNS, filters):
            write(dumps({"type": "runbook_run", **row}) + "\n")
            result.runbook_runs += 1
    return result


def _model(model: models.Model) -> dict:
    return {"embedder": model.embedder, "model": model.model, "dims": model.dims, "storage": model.storage,
            "request_dims": model.request_dims, "state": model.state}


def _facts(rows: Iterable[dict]) -> Iterator[dict]:
    """One record per key, its history in version order (the rows arrive sorted by key)."""
    record = None
    for row in rows:
        if record is None or (record["namespace"], record["key"]) != (row["namespace"], row["key"]):
            if record is not None:
                yield record
            record = {"type": "fact", "namespace": row["namespace"], "key": row["key"], "value": row["value"],
                      "source": row["source"], "version": row["version"], "updated_at": row["updated_at"],
                      "history": []}
        record["history"].append({"version": row["h_version"], "op": row["op"], "old_value": row["old_value"],
                                  "new_value": row["new_value"], "source": row["h_source"],
                                  "changed_at": row["changed_at"]})
    if record is not None:
        yield record


def _episode_lines(conn, filters: dict, model: models.Model | None, result: ExportResult) -> Iterator[str]:
    from psycopg import sql

    chunks = sql.SQL("")
    if model is not None:
        table = sql.Identifier(model.table_name)
        chunks = sql.SQL(CHUNKS).format(table=table)
        result.vectors = conn.execute(sql.SQL(VECTORS).format(table=table), filters).fetchone()["n"]
    for row in _stream(conn, sql.SQL(EPISODES).format(chunks=chunks), filters):
        yield row["line"]


# --- import -------------------------------------------------------------------


@dataclass
class ImportResult:
    blocked_sources: int = 0
    facts: int = 0
    fact_changes: int = 0  # history entries added
    episodes: int = 0
    duplicates: int = 0
    chunks: int = 0
    vectors: int = 0  # vectors taken from the file
    queued: int = 0  # chunks queued for embedding
    summary_sources: int = 0
    runbook_runs: int = 0
    redactor: redact.Redactor = field(default_factory=redact.Redactor)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("redactor")
        data["redacted"] = self.redactor.count
        return data


FIELDS = {
    "header": ({"type", "format", "memctl", "models", "vectors", "exported_at", "agent", "since"}, ("format",)),
    "blocked_source": ({"type", "source", "reason", "blocked_at"}, ("source",)),
    "fact": ({"type", "namespace", "key", "value", "source", "version", "updated_at", "history"},
             ("namespace", "key", "history")),
    "episode": ({"type", "id", "agent", "kind", "source", "importance", "created_at", "meta", "content", "chunks"},
                ("id", "agent", "content", "created_at")),
    "summary_source": ({"type", "agent", "summary_id", "source_id", "source_created_at", "source_hash"},
                       ("agent", "summary_id", "source_id", "source_created_at", "source_hash")),
    "runbook_run": ({"type", "agent", "name", "commit", "dirty", "started_at", "finished_at", "outcome", "steps",
                     "from_step", "failed_step", "exit_code", "duration_s", "output_tail", "episode_id"},
                    ("agent", "name", "commit", "started_at", "outcome", "steps")),
}


def records(lines: Iterable[bytes]) -> Iterator[tuple[int, dict]]:
    """(line number, record) with the header checked first and every record's type and fields checked."""
    first = True
    for number, item in jsonl.read(lines, required=("type",)):
        kind = item["type"]
        if first and kind != "header":
            raise jsonl.LineError(number, f"expected the header line of a memctl export first, got type {kind!r}")
        if kind not in FIELDS or (kind == "header" and not first):
            raise jsonl.LineError(number, f"unknown record type {kind!r}, expected one of {', '.join(TYPES[1:])}")
        allowed, required = FIELDS[kind]
        unknown = set(item) - allowed
        missing = [name for name in required if name not in item]
        if unknown or missing:
            what = f"unknown field(s) {', '.join(sorted(unknown))}" if unknown else f"missing {', '.join(missing)}"
            raise jsonl.LineError(number, f"{kind}: {what}")
        if first:
            _check_header(number, item)
            first = False
        yield number, item
    if first:
        raise InvalidInput("empty input: an export starts with its header line")


def _check_header(number: int, header: dict) -> None:
    version = header["format"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise jsonl.LineError(number, f"header: format must be an integer, got {version!r}")
    if version > FORMAT:
        raise InvalidInput(f"this export is format {version} (written by memctl {header.get('memctl', '?')}); "
                           f"this memctl {__version__} reads format {FORMAT} and older: upgrade memctl to import it")


def import_stream(conn, settings: Settings, lines: Iterable[bytes], *,
                  redactor: redact.Redactor | None = None) -> ImportResult:
    """Load an export in one transaction: all of it, or (on any bad line) nothing."""
    import psycopg

    result = ImportResult(redactor=redactor if redactor is not None else redact.Redactor.from_settings(settings))
    with conn.transaction():
        conn.execute("SET LOCAL gin_pending_list_limit = '64MB'")
        conn.execute(models.WRITE_LOCK)
        loader = _Loader(conn, settings, result)
        for number, item in records(lines):
            try:
                loader.add(item)
            except InvalidInput as exc:
                raise jsonl.at(number, exc) from None
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                # A value of the wrong type or range: the record (or, for episodes, the batch it ends) is refused.
                raise jsonl.LineError(number, f"{item['type']}: rejected by the database: "
                                              f"{str(exc).strip().splitlines()[0]}") from None
        loader.flush()
        if loader.index_later is not None:
            conn.execute(models.index_statement(loader.index_later, concurrently=False))
    return result


@dataclass
class _Described:
    """An embedder as an export's header describes it: enough to register its model without calling it."""

    name: str
    model: str
    request_dims: int | None
    size: int

    def dims(self) -> int:
        return self.size


class _Loader:
    def __init__(self, conn, settings: Settings, result: ImportResult):
        self.conn, self.settings, self.result = conn, settings, result
        # (agent, id in the file) -> id here, kept in a temporary table: memory stays flat at any size
        for statement in ID_MAP:
            conn.execute(statement)
        self.mapped: list[tuple[str, int, int]] = []
        self.batch: list[tuple[dict, episodes.NewEpisode]] = []
        self.model: models.Model | None = None  # whose vectors the file's chunks carry, when usable here
        self.index_later: models.Model | None = None  # registered by this import, its index not built yet
        self.queued: list[int] = []
        self.chunk_size = episodes.chunk_size(settings)
        self.overlap = settings.get("chunking", "overlap")

    def add(self, item: dict) -> None:
        kind = item["type"]
        if kind != "episode" and self.batch:
            self.flush()
        getattr(self, f"_{kind}")(item)

    def _header(self, item: dict) -> None:
        described = item.get("vectors")
        if described:
            self.model = self._usable_model(described)
        self.queued = [r["id"] for r in self.conn.execute(episodes.QUEUED_MODELS).fetchall()]

    def _usable_model(self, described: dict) -> models.Model | None:
        active = models.active(self.conn)
        if active is None:
            # The index is built once the vectors are in: inserting into an HNSW index one vector at a time
            # ran at about 300 rows/s (measured, 20,000 rows of 384 dims); a build after the load is far faster.
            self.index_later = models.register(
                self.conn, _Described(described["embedder"], described["model"], described.get("request_dims"),
                                      described["dims"]), state="active", storage=described.get("storage") or "vector",
                build_index=False)
            return self.index_later
        same = (active.embedder, active.model, active.dims) == (described["embedder"], described["model"],
                                                               described["dims"])
        return active if same else None

    def _blocked_source(self, item: dict) -> None:
        if not isinstance(item["source"], str) or not item["source"]:
            raise InvalidInput("blocked_source: source must be a non-empty string")
        if self.conn.execute(INSERT_BLOCKED, (item["source"], item.get("reason"),
                                              item.get("blocked_at"))).rowcount:
            self.result.blocked_sources += 1

    def _fact(self, item: dict) -> None:
        merge_fact(self.conn, item, self.result)

    def _episode(self, item: dict) -> None:
        if isinstance(item["id"], bool) or not isinstance(item["id"], int):
            raise InvalidInput("episode: id must be an integer")
        episode = episodes.validate(self.settings, item["content"], kind=item.get("kind"), source=item.get("source"),
                                    agent=item["agent"], importance=item.get("importance"),
                                    created_at=item["created_at"], meta=item.get("meta"))
        clean = episodes.redacted(episode, self.result.redactor)
        if clean is not episode:
            item = {**item, "chunks": None}  # vectors of the secret's text are not kept
        self.batch.append((item, clean))
        if len(self.batch) >= BATCH:
            self.flush()

    def _summary_source(self, item: dict) -> None:
        agent = item["agent"]
        summary = self.new_id(agent, item["summary_id"])
        if summary is None:
            raise InvalidInput(f"summary_source: summary {item['summary_id']} of agent {agent!r} is not in the file")
        try:
            digest = bytes.fromhex(item["source_hash"])
        except (TypeError, ValueError):
            raise InvalidInput("summary_source: source_hash must be hex") from None
        source = self.new_id(agent, item["source_id"])
        if source is None:  # pruned before the export: an id that names no episode here
            found = self.conn.execute(FIND_EPISODE, (agent, digest, item["source_created_at"])).fetchone()
            source = found["id"] if found else -abs(item["source_id"])
        self.result.summary_sources += self.conn.execute(
            INSERT_LINEAGE, (agent, summary, source, item["source_created_at"], digest)).rowcount

    def _runbook_run(self, item: dict) -> None:
        row = {name: item.get(name) for name in FIELDS["runbook_run"][0] if name != "type"}
        row["episode_id"] = self.new_id(item["agent"], item.get("episode_id")) if item.get("episode_id") else None
        row["dirty"] = bool(row["dirty"])
        row["from_step"] = row["from_step"] or 1
        row["output_tail"] = redact.redact_text(row["output_tail"] or "")
        self.result.runbook_runs += self.conn.execute(INSERT_RUN, row).rowcount

    def new_id(self, agent: str, old_id: Any) -> int | None:
        if isinstance(old_id, bool) or not isinstance(old_id, int):
            raise InvalidInput(f"an episode id must be an integer, got {old_id!r}")
        row = self.conn.execute(LOOK_UP_ID, (agent, old_id)).fetchone()
        return row["new_id"] if row else None

    def flush(self) -> None:
        if self.batch:
            _insert_episodes(self, self.batch)
            self.batch = []
        if self.mapped:
            with self.conn.cursor() as cur, cur.copy(COPY_IDS) as copy:
                for row in self.mapped:
                    copy.write_row(row)
            self.mapped = []


ID_MAP = (
    "DROP TABLE IF EXISTS pg_temp.memctl_import_ids",
    "CREATE TEMPORARY TABLE memctl_import_ids (agent text, old_id bigint, new_id bigint) ON COMMIT DROP",
    "CREATE INDEX ON memctl_import_ids (agent, old_id)",
)
COPY_IDS = "COPY memctl_import_ids (agent, old_id, new_id) FROM STDIN"
LOOK_UP_ID = "SELECT new_id FROM memctl_import_ids WHERE agent = %s AND old_id = %s"
INSERT_BLOCKED = """
INSERT INTO blocked_sources (source, reason, blocked_at) VALUES (%s, %s, coalesce(%s::timestamptz, now()))
ON CONFLICT (source) DO NOTHING
"""
FIND_EPISODE = "SELECT id FROM episodes WHERE agent = %s AND content_hash = %s AND created_at = %s LIMIT 1"
INSERT_LINEAGE = """
INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
INSERT_RUN = """
INSERT INTO runbook_runs (agent, name, commit, dirty, started_at, finished_at, outcome, steps, from_step,
                          failed_step, exit_code, duration_s, output_tail, episode_id)
SELECT %(agent)s, %(name)s, %(commit)s, %(dirty)s, %(started_at)s, %(finished_at)s, %(outcome)s, %(steps)s,
       %(from_step)s, %(failed_step)s, %(exit_code)s, %(duration_s)s, %(output_tail)s, %(episode_id)s
WHERE NOT EXISTS (SELECT 1 FROM runbook_runs WHERE agent = %(agent)s AND name = %(name)s
                  AND started_at = %(started_at)s)
"""
# By created_at, which is indexed (content_hash is not); the hash is compared here.
EXISTING = """
SELECT agent, content_hash, created_at, id FROM episodes WHERE created_at = ANY(%s)
"""
COPY_VECTORS = "COPY {table} (agent, chunk_id, content_hash, embedding) FROM STDIN"


def _insert_episodes(loader: _Loader, batch: list[tuple[dict, episodes.NewEpisode]]) -> None:
    """Insert a batch with COPY: new episodes only, their chunks (with the file's vectors when usable), queue rows."""
    from psycopg import sql
    from psycopg.types.json import Jsonb

    conn, result = loader.conn, loader.result
    times = list({ep.created_at for _, ep in batch})
    known = {(r["agent"], bytes(r["content_hash"]), r["created_at"]): r["id"]
             for r in conn.execute(EXISTING, (times,)).fetchall()}
    fresh, repeated = [], []
    for item, ep in batch:
        key = (ep.agent, ep.content_hash, ep.created_at)
        if key in known:
            repeated.append((ep.agent, item["id"], key))
            result.duplicates += 1
            continue
        fresh.append((item, ep))
        known[key] = None  # a second copy in this batch maps to the id the first one gets below
    new_ids = episodes._take_ids(conn, episodes.EPISODE_SEQ, len(fresh))
    chunk_rows, vector_rows = [], []
    for new_id, (item, ep) in zip(new_ids, fresh):
        loader.mapped.append((ep.agent, item["id"], new_id))
        known[(ep.agent, ep.content_hash, ep.created_at)] = new_id
        given = item.get("chunks") if loader.model is not None else None
        if given and all(isinstance(c, dict) and isinstance(c.get("content"), str) for c in given):
            for chunk in given:
                chunk_rows.append((ep.agent, new_id, chunk["seq"], chunk["content"], chunk.get("embedding")))
        else:
            for seq, text in enumerate(chunking.chunk_text(ep.content, loader.chunk_size, loader.overlap)):
                chunk_rows.append((ep.agent, new_id, seq, text, None))
    loader.mapped.extend((agent, old_id, known[key]) for agent, old_id, key in repeated)
    chunk_ids = episodes._take_ids(conn, episodes.CHUNK_SEQ, len(chunk_rows))
    with conn.cursor() as cur:
        with cur.copy(episodes.COPY_EPISODES) as copy:
            copy.set_types(episodes.EPISODE_TYPES)
            for new_id, (_, ep) in zip(new_ids, fresh):
                copy.write_row((new_id, ep.agent, ep.kind, ep.content, ep.content_hash, ep.source, ep.importance,
                                ep.created_at, Jsonb(ep.meta)))
        with cur.copy(episodes.COPY_CHUNKS) as copy:
            copy.set_types(episodes.CHUNK_TYPES)
            for chunk_id, (agent, episode_id, seq, text, vector) in zip(chunk_ids, chunk_rows):
                digest = hashlib.sha256(text.encode("utf-8")).digest()
                copy.write_row((chunk_id, agent, episode_id, seq, text, digest))
                if vector is not None:
                    vector_rows.append((agent, chunk_id, digest, _vector_text(vector)))
        if vector_rows:
            table = sql.Identifier(loader.model.table_name)
            with cur.copy(sql.SQL(COPY_VECTORS).format(table=table)) as copy:
                for row in vector_rows:
                    copy.write_row(row)
        with_vector = {row[1] for row in vector_rows}
        with cur.copy(episodes.COPY_QUEUE) as copy:
            copy.set_types(["int4", "text", "int8"])
            for model_id in loader.queued:
                skip = with_vector if loader.model is not None and model_id == loader.model.id else set()
                for chunk_id, row in zip(chunk_ids, chunk_rows):
                    if chunk_id not in skip:
                        copy.write_row((model_id, row[0], chunk_id))
                        result.queued += 1
    result.episodes += len(fresh)
    result.chunks += len(chunk_rows)
    result.vectors += len(vector_rows)


def _vector_text(vector: Any) -> str:
    """pgvector's text form; the server checks every element (a non-number fails the import, naming the line)."""
    if not isinstance(vector, list) or not vector:
        raise InvalidInput("episode: a chunk's embedding must be a list of numbers")
    return json.dumps(vector)


# --- facts: merge a key's history ----------------------------------------------

KEY_HISTORY = """
SELECT version, op, old_value, new_value, source, changed_at FROM fact_history
WHERE namespace = %s AND key = %s ORDER BY version, id
"""
INSERT_HISTORY = """
INSERT INTO fact_history (namespace, key, version, op, old_value, new_value, source, changed_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
"""
PUT_FACT = """
INSERT INTO facts (namespace, key, value, source, version, updated_at) VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (namespace, key) DO UPDATE
   SET value = excluded.value, source = excluded.source, version = excluded.version, updated_at = excluded.updated_at
"""
OPS = ("set", "delete", "erase")


def merge_fact(conn, item: dict, result: ImportResult) -> None:
    """Add a key's history: as it is on an empty key; else the entries not yet here, after the last version."""
    namespace, key, history = item["namespace"], item["key"], item["history"]
    if not isinstance(namespace, str) or not namespace or not isinstance(key, str):
        raise InvalidInput("fact: namespace and key must be non-empty strings")
    facts.check_key(key)
    if not isinstance(history, list) or not history:
        raise InvalidInput(f"fact {key!r}: history must be a non-empty list")
    redactor = result.redactor
    entries = []
    for entry in sorted(history, key=lambda e: e.get("version") or 0 if isinstance(e, dict) else 0):
        if not isinstance(entry, dict) or entry.get("op") not in OPS or not isinstance(entry.get("version"), int):
            raise InvalidInput(f"fact {key!r}: a history entry needs an integer version and op set|delete|erase")
        for name in ("old_value", "new_value", "source"):
            if entry.get(name) is not None and not isinstance(entry[name], str):
                raise InvalidInput(f"fact {key!r}: history {name} must be a string or null")
        if entry.get("changed_at") is None:
            raise InvalidInput(f"fact {key!r}: a history entry needs changed_at")
        entries.append({**entry, "changed_at": episodes.parse_time(entry["changed_at"]),
                        "old_value": redactor.text(entry.get("old_value"), f"history of fact {key!r}"),
                        "new_value": redactor.text(entry.get("new_value"), f"history of fact {key!r}")})
    value = item.get("value")
    if value is not None:
        facts.validate(key, value, namespace, item.get("source"))
        value = redactor.text(value, f"value of fact {key!r}")
    conn.execute(facts.LOCK_KEY, (namespace, key))
    here = conn.execute(KEY_HISTORY, (namespace, key)).fetchall()
    seen = {(h["op"], h["old_value"], h["new_value"], h["changed_at"]) for h in here}
    new = [e for e in entries if (e["op"], e["old_value"], e["new_value"], e["changed_at"]) not in seen] \
        if here else entries
    if not new:
        return
    last = max((h["version"] for h in here), default=0)
    for offset, entry in enumerate(new, start=1):
        version = entry["version"] if not here else last + offset
        conn.execute(INSERT_HISTORY, (namespace, key, version, entry["op"], entry["old_value"], entry["new_value"],
                                      entry.get("source"), entry["changed_at"]))
    result.fact_changes += len(new)
    result.facts += 1
    newest_here = max((h["changed_at"] for h in here), default=None)
    if here and newest_here >= new[-1]["changed_at"]:
        return  # this database's own later change stays the current value
    version = item.get("version") if not here else last + len(new)
    if value is None:
        conn.execute(facts.DELETE, (namespace, key))
    else:
        conn.execute(PUT_FACT, (namespace, key, value, item.get("source"), version or new[-1]["version"],
                                item.get("updated_at") or new[-1]["changed_at"]))
