"""Episodes: an append-only log of what happened, split into chunks for search.

A write stores text and metadata only and queues its chunks for the embed
worker; it never waits for an embedding.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Iterator

from memctl import chunking, jsonl, models, redact
from memctl.config import Settings, parse_duration
from memctl.errors import InvalidInput, NotFound, UsageError

DEFAULT_AGENT = "default"
DEFAULT_KIND = "observation"
FALLBACK_IMPORTANCE = 5
FIELDS = ("content", "kind", "source", "agent", "importance", "created_at", "meta")


@dataclass
class NewEpisode:
    """A validated episode, ready to store."""

    content: str
    kind: str
    agent: str
    source: str | None
    importance: int
    created_at: datetime.datetime | None
    meta: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def content_hash(self) -> bytes:
        return hashlib.sha256(self.content.encode("utf-8")).digest()


def _no_nul(value: str | None, what: str) -> None:
    if value is not None and "\x00" in value:
        raise InvalidInput(f"the {what} contains a NUL character (\\0) at position {value.index(chr(0))}; "
                           "PostgreSQL text cannot store it: remove or escape it")


def parse_time(value: Any) -> datetime.datetime:
    """ISO 8601 to an aware datetime; a time without a zone is taken as UTC."""
    if isinstance(value, datetime.datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(f"not an ISO 8601 date/time: {value!r} (e.g. 2026-08-11T09:30:00Z)") from None
    else:
        raise InvalidInput(f"created_at must be an ISO 8601 string, got {type(value).__name__}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed


def parse_since(value: str) -> datetime.datetime:
    """'7d' (a duration back from now) or an ISO 8601 date/time."""
    try:
        seconds = parse_duration(value)
    except ValueError:
        try:
            return parse_time(value)
        except InvalidInput:
            raise UsageError(f"--since {value!r}: give a duration back from now (30m, 12h, 7d) "
                             "or an ISO 8601 date/time (2026-08-11T09:30:00Z)") from None
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds)


def importance_for(settings: Settings, kind: str) -> int:
    policy = settings.section("importance")
    return policy.get(kind, policy.get("default", FALLBACK_IMPORTANCE))


def validate(settings: Settings, content: Any, *, kind: Any = None, source: Any = None, agent: Any = None,
             importance: Any = None, created_at: Any = None, meta: Any = None) -> NewEpisode:
    if not isinstance(content, str):
        raise InvalidInput("content must be a string")
    if not content.strip():
        raise InvalidInput("the episode text is empty")
    _no_nul(content, "episode text")
    kind = DEFAULT_KIND if kind is None else kind
    agent = DEFAULT_AGENT if agent is None else agent
    for name, value in (("kind", kind), ("agent", agent), ("source", source)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise InvalidInput(f"{name} must be a non-empty string")
        _no_nul(value, name)
    if importance is None:
        importance = importance_for(settings, kind)
    elif isinstance(importance, bool) or not isinstance(importance, int) or not 0 <= importance <= 10:
        raise InvalidInput(f"importance must be an integer from 0 to 10, got {importance!r}")
    when = None if created_at is None else parse_time(created_at)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise InvalidInput("meta must be a JSON object")
    if "\\u0000" in json.dumps(meta):
        raise InvalidInput("meta contains a NUL character, which PostgreSQL jsonb cannot store")
    return NewEpisode(content, kind, agent, source, importance, when, meta)


def chunk_size(settings: Settings) -> int:
    return chunking.chunk_size_for(settings.get("embedding", "model"), settings.get("chunking", "max_chars"))


def chunks_of(settings: Settings, content: str) -> list[str]:
    return chunking.chunk_text(content, chunk_size(settings), settings.get("chunking", "overlap"))


INSERT_EPISODE = """
INSERT INTO episodes (agent, kind, content, content_hash, source, importance, created_at, meta)
VALUES (%(agent)s, %(kind)s, %(content)s, %(content_hash)s, %(source)s, %(importance)s,
        coalesce(%(created_at)s, now()), %(meta)s)
RETURNING id
"""
INSERT_CHUNK = """
INSERT INTO chunks (agent, episode_id, seq, content, content_hash) VALUES (%s, %s, %s, %s, %s) RETURNING id
"""
ENQUEUE_EPISODE = """
INSERT INTO embed_queue (model_id, agent, chunk_id)
SELECT m.id, c.agent, c.id
FROM chunks c CROSS JOIN embedding_models m
WHERE c.agent = %s AND c.episode_id = %s AND m.state IN ('active', 'backfill')
"""


def redacted(episode: NewEpisode, redactor: redact.Redactor) -> NewEpisode:
    """The episode with every secret in its text and meta replaced (or refused, in block mode)."""
    content = redactor.text(episode.content, "episode text")
    meta = redactor.value(episode.meta, "episode meta") if episode.meta else episode.meta
    if content is episode.content and meta == episode.meta:
        return episode
    return replace(episode, content=content, meta=meta)


def add(conn, settings: Settings, content: Any, *, kind: Any = None, source: Any = None, agent: Any = None,
        importance: Any = None, created_at: Any = None, meta: Any = None,
        redactor: redact.Redactor | None = None) -> int | None:
    """Store one episode; returns its id, or None when the write policy drops it (importance 0).

    Secrets are redacted first ([redaction] mode), so none reaches the table, the chunks or the
    embedder; `redactor` (default: one from the settings) counts what was replaced.
    """
    from psycopg.types.json import Jsonb

    from memctl import sources

    episode = validate(settings, content, kind=kind, source=source, agent=agent, importance=importance,
                       created_at=created_at, meta=meta)
    if episode.importance == 0:
        return None
    episode = redacted(episode, redactor if redactor is not None else redact.Redactor.from_settings(settings))
    sources.check_allowed(conn, episode.source)
    with conn.transaction():
        conn.execute(models.WRITE_LOCK)
        row = conn.execute(INSERT_EPISODE, {**asdict(episode), "content_hash": episode.content_hash,
                                            "meta": Jsonb(episode.meta)}).fetchone()
        episode_id = row["id"]
        with conn.cursor() as cur:
            for seq, text in enumerate(chunks_of(settings, episode.content)):
                digest = hashlib.sha256(text.encode("utf-8")).digest()
                cur.execute(INSERT_CHUNK, (episode.agent, episode_id, seq, text, digest))
        conn.execute(ENQUEUE_EPISODE, (episode.agent, episode_id))
    return episode_id


COLUMNS = "id, agent, kind, source, importance, created_at, meta, content"
SHOW = f"SELECT {COLUMNS} FROM episodes WHERE id = %s"  # noqa: S608 - constant column list
SHOW_CHUNKS = """
SELECT c.id, c.seq, length(c.content) AS chars,
       (SELECT count(*) FROM embed_queue q WHERE q.agent = c.agent AND q.chunk_id = c.id) AS pending,
       (SELECT string_agg(f.error, '; ') FROM embed_failures f WHERE f.agent = c.agent AND f.chunk_id = c.id) AS error
FROM chunks c WHERE c.agent = %s AND c.episode_id = %s ORDER BY c.seq
"""


def show(conn, episode_id: int) -> dict:
    row = conn.execute(SHOW, (episode_id,)).fetchone()
    if row is None:
        raise NotFound(f"no episode {episode_id}")
    row["chunks"] = conn.execute(SHOW_CHUNKS, (row["agent"], episode_id)).fetchall()
    return row


def list_episodes(conn, *, agent: str | None = None, kind: str | None = None, source: str | None = None,
                  since: str | None = None, limit: int = 50) -> list[dict]:
    from psycopg import sql

    clauses, params = filters(agent=agent, kind=kind, source=source, since=since)
    query = sql.SQL("SELECT {cols} FROM episodes e {where} ORDER BY e.created_at DESC, e.id DESC LIMIT {limit}").format(
        cols=sql.SQL(", ").join(sql.SQL("e.{}").format(sql.Identifier(c.strip())) for c in COLUMNS.split(",")),
        where=where(clauses), limit=sql.Literal(int(limit)))
    return conn.execute(query, params).fetchall()


def filters(*, agent=None, kind=None, source=None, since=None, alias: str = "e"):
    """SQL conditions on the episodes table for the common filters, with named parameters."""
    from psycopg import sql

    clauses, params = [], {}
    table = sql.Identifier(alias)
    for column, value in (("agent", agent), ("kind", kind), ("source", source)):
        if value is not None:
            clauses.append(sql.SQL("{}.{} = {}").format(table, sql.Identifier(column), sql.Placeholder(column)))
            params[column] = value
    if since is not None:
        clauses.append(sql.SQL("{}.created_at >= {}").format(table, sql.Placeholder("since")))
        params["since"] = parse_since(since)
    return clauses, params


def where(clauses):
    from psycopg import sql

    if not clauses:
        return sql.SQL("")
    return sql.SQL("WHERE ") + sql.SQL(" AND ").join(clauses)


DELETE = "DELETE FROM episodes WHERE id = ANY(%s) RETURNING id"


def delete(conn, ids: list[int]) -> list[int]:
    """Delete episodes with their chunks and vectors (all models); returns ids deleted."""
    with conn.transaction():
        found = [r["id"] for r in conn.execute(DELETE, (list(ids),)).fetchall()]
    return found


# --- bulk import -----------------------------------------------------------


@dataclass
class ImportResult:
    imported: int = 0
    dropped: int = 0  # importance 0 by policy
    chunks: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, reason)
    redactor: redact.Redactor | None = None  # what was redacted; default: from the settings


def parse_jsonl(settings: Settings, lines: Iterable[bytes], *, skip_invalid: bool,
                result: ImportResult) -> Iterator[NewEpisode]:
    """Validated episodes from JSONL (memctl.jsonl); a bad line raises (naming it) unless skip_invalid."""
    def skip(error: jsonl.LineError) -> None:
        if not skip_invalid:
            raise jsonl.LineError(error.number, f"{error.reason}; nothing was imported")
        result.skipped.append((error.number, error.reason))

    for number, item in jsonl.read(lines, fields=FIELDS, required=("content",), on_error=skip):
        try:
            episode = _from_record(settings, item)
        except InvalidInput as exc:
            skip(jsonl.at(number, exc))
            continue
        if episode.importance == 0:
            result.dropped += 1
            continue
        yield episode


def _from_record(settings: Settings, item: dict) -> NewEpisode:
    return validate(settings, item["content"], kind=item.get("kind"), source=item.get("source"),
                    agent=item.get("agent"), importance=item.get("importance"), created_at=item.get("created_at"),
                    meta=item.get("meta"))


EPISODE_SEQ = "SELECT pg_get_serial_sequence('episodes', 'id') AS s"
CHUNK_SEQ = "SELECT pg_get_serial_sequence('chunks', 'id') AS s"
TAKE_IDS = "SELECT nextval(%s::regclass) AS id FROM generate_series(1, %s)"
COPY_EPISODES = """COPY episodes (id, agent, kind, content, content_hash, source, importance, created_at, meta)
FROM STDIN (FORMAT BINARY)"""
EPISODE_TYPES = ["int8", "text", "text", "text", "bytea", "text", "int2", "timestamptz", "jsonb"]
COPY_CHUNKS = "COPY chunks (id, agent, episode_id, seq, content, content_hash) FROM STDIN (FORMAT BINARY)"
CHUNK_TYPES = ["int8", "text", "int8", "int4", "text", "bytea"]
QUEUED_MODELS = "SELECT id FROM embedding_models WHERE state IN ('active', 'backfill') ORDER BY id"
COPY_QUEUE = "COPY embed_queue (model_id, agent, chunk_id) FROM STDIN (FORMAT BINARY)"
BATCH = 5000


def _take_ids(conn, sequence_query: str, count: int) -> list[int]:
    if count == 0:
        return []
    seq = conn.execute(sequence_query).fetchone()["s"]
    return [r["id"] for r in conn.execute(TAKE_IDS, (seq, count)).fetchall()]


def import_episodes(conn, settings: Settings, episodes: Iterable[NewEpisode], *, result: ImportResult) -> ImportResult:
    """Load episodes with binary COPY, in one transaction: all of them or none.

    Every episode is redacted on its way in (result.redactor, default from the settings).
    """
    from psycopg.types.json import Jsonb

    from memctl import sources

    if result.redactor is None:
        result.redactor = redact.Redactor.from_settings(settings)
    now = datetime.datetime.now(datetime.timezone.utc)
    size, overlap = chunk_size(settings), settings.get("chunking", "overlap")
    blocked = sources.blocked_set(conn)
    with conn.transaction():
        # GIN indexes gather inserts in a pending list; a larger one for this
        # transaction merges it in fewer, larger passes.
        conn.execute("SET LOCAL gin_pending_list_limit = '64MB'")
        conn.execute(models.WRITE_LOCK)
        batch: list[NewEpisode] = []
        for episode in episodes:
            if episode.source in blocked:
                sources.refuse(episode.source, blocked[episode.source])
            batch.append(redacted(episode, result.redactor))
            if len(batch) >= BATCH:
                _copy_batch(conn, batch, now, size, overlap, result, Jsonb)
                batch = []
        if batch:
            _copy_batch(conn, batch, now, size, overlap, result, Jsonb)
    return result


def _copy_batch(conn, batch, now, size, overlap, result, Jsonb) -> None:
    # Under models.WRITE_LOCK no model registers while this transaction runs.
    queued = [r["id"] for r in conn.execute(QUEUED_MODELS).fetchall()]
    episode_ids = _take_ids(conn, EPISODE_SEQ, len(batch))
    chunk_rows = []
    with conn.cursor() as cur:
        with cur.copy(COPY_EPISODES) as copy:
            copy.set_types(EPISODE_TYPES)
            for episode_id, ep in zip(episode_ids, batch):
                copy.write_row((episode_id, ep.agent, ep.kind, ep.content, ep.content_hash, ep.source,
                                ep.importance, ep.created_at or now, Jsonb(ep.meta)))
                for seq, text in enumerate(chunking.chunk_text(ep.content, size, overlap)):
                    chunk_rows.append((ep.agent, episode_id, seq, text))
        chunk_ids = _take_ids(conn, CHUNK_SEQ, len(chunk_rows))
        with cur.copy(COPY_CHUNKS) as copy:
            copy.set_types(CHUNK_TYPES)
            for chunk_id, (agent, episode_id, seq, text) in zip(chunk_ids, chunk_rows):
                copy.write_row((chunk_id, agent, episode_id, seq, text, hashlib.sha256(text.encode()).digest()))
        if queued:
            with cur.copy(COPY_QUEUE) as copy:
                copy.set_types(["int4", "text", "int8"])
                for model_id in queued:
                    for chunk_id, row in zip(chunk_ids, chunk_rows):
                        copy.write_row((model_id, row[0], chunk_id))
    result.imported += len(batch)
    result.chunks += len(chunk_rows)
