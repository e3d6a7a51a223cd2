"""The erasure ledger: what every purge, fact erasure, episode delete, redaction fix and prune of a blocked
source's episodes removed, kept in two places so that losing either keeps the other (docs/retention.md).

An entry holds ids (episodes as agent and id, facts as namespace and key, fact history rows), the
source, the time, rows removed per table, and keyed digests of the erased texts: HMAC-SHA256 under a
per-installation key, never a text. Without the key a digest cannot be tested against a guess (a short
fact value could be, against a plain sha256), and with it memctl can tell whether a text came back.

Where: the table `erasures` (sql/0020_erasures.sql), and MEMCTL_HOME/erasure/ledger.jsonl, one JSON line
per entry, opened O_APPEND, fsynced, 0600, never rewritten; the key is MEMCTL_HOME/erasure/key (32
random bytes, 0600, made on first use). The file serves every database memctl reaches from this
MEMCTL_HOME: each line names its database and schema, and a reader takes its own lines only. A row is
written in the database first, then the line; a crash between them leaves the row only, and `sync`
(run by every erasure, restore and verify) appends what the file lacks and inserts what the table
lacks. A restore replaces the table with the backup's, older one: the file (and the rows read before
the restore) bring the newer entries back.

A lost key: a new one is made, and the digests made under the old one cannot be tested any more
(`key_id` names the key of each entry): verify says how many entries it cannot check, and a restore
re-applies those by ids alone.
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from memctl import places
from memctl.errors import MemctlError
from memctl.places import digest, digest_sql, key_id, pads  # noqa: F401 (the ledger's digests: one home)
from memctl.write.erased import key_path, load_key, state_dir  # noqa: F401 (the ledger's key: one home)
from memctl.write.values import WRITER

if TYPE_CHECKING:
    from memctl.db.memory import Memory

KEY_BYTES = places.KEY_BYTES
OPS = ("purge", "fact_erase", "episode_delete", "redact_fix", "prune_blocked")
MIN_QUOTE = 8  # an erased text shorter than this is not looked for inside job log rows (it would match anything)
ERASED = places.ERASED

INSERT = """
INSERT INTO erasures (id, erased_at, op, source, target, key_id, counts, items)
VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb) ON CONFLICT (id) DO NOTHING
"""
ALL = "SELECT id, erased_at, op, source, target, key_id, counts, items FROM erasures ORDER BY erased_at, id"
HAS_TABLE = "SELECT to_regclass('erasures') IS NOT NULL AS yes"
DATABASE = "SELECT current_database() AS db, current_schema() AS schema, now() AS now"


# --- where ------------------------------------------------------------------------------------------


def ledger_path() -> Path:
    return state_dir() / "ledger.jsonl"


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise MemctlError(
            f"cannot create the erasure ledger's directory {directory}: {exc.strerror or exc}"
        ) from None


# --- an entry ---------------------------------------------------------------------------------------


@dataclass
class Entry:
    op: str
    erased_at: datetime.datetime
    key_id: str
    source: str | None = None
    target: str | None = None
    counts: dict[str, Any] = field(default_factory=dict)
    # episodes: [{agent, id, digest, chunks: [digest], lineage}]; facts: [{namespace, key, digests, erased}];
    # history: [fact_history ids]; source_digest, since (a purge); texts: other digests (fact values);
    # quotes: digests of the whole values that rows quoting an erased text had (job log rows, runbook run outputs)
    items: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def to_dict(self) -> dict:
        found = asdict(self)
        found["erased_at"] = self.erased_at.isoformat()
        return found

    @classmethod
    def from_dict(cls, data: dict) -> Entry:
        when = data["erased_at"]
        if isinstance(when, str):
            when = datetime.datetime.fromisoformat(when)
        if data["op"] not in OPS or not isinstance(data.get("items"), dict):
            raise ValueError(f"not a ledger entry: op {data.get('op')!r}")
        return cls(
            op=data["op"],
            erased_at=when,
            key_id=data["key_id"],
            source=data.get("source"),
            target=data.get("target"),
            counts=data.get("counts") or {},
            items=data["items"],
            id=data["id"],
        )

    def digests(self) -> set[str]:
        """Every digest the entry holds."""
        found = set(self.items.get("texts", [])) | set(self.items.get("quotes", []))
        for episode in self.items.get("episodes", []):
            found.add(episode["digest"])
            found.update(episode.get("chunks", []))
        for fact in self.items.get("facts", []):
            found.update(fact.get("digests", []))
        return found

    def summary(self) -> str:
        what = self.target or self.source or ""
        episodes = len(self.items.get("episodes", []))
        facts = len(self.items.get("facts", []))
        return (
            f"{self.op} {what} at {self.erased_at.isoformat(timespec='seconds')} ({episodes} episode(s), "
            f"{facts} fact(s)) [{self.id[:12]}]".replace("  ", " ")
        )


def new_entry(conn: Memory, op: str, *, key: bytes | None = None, **fields: Any) -> Entry:
    key = key if key is not None else load_key()
    return Entry(op=op, erased_at=conn.one(DATABASE)["now"], key_id=key_id(key), **fields)


def database_tag(conn: Memory) -> str:
    row = conn.one(DATABASE)
    return f"{row['db']}/{row['schema']}"


# --- writing and reading the two copies -------------------------------------------------------------


INSERT_DIGESTS = """
INSERT INTO erasure_digests (digest, kind, erasure)
SELECT DISTINCT d.digest, d.kind, %(id)s FROM unnest(%(digests)s::text[], %(kinds)s::text[]) AS d(digest, kind)
ON CONFLICT DO NOTHING
"""
HAS_DIGESTS = "SELECT to_regclass('erasure_digests') IS NOT NULL AS yes"


def _insert(conn: Memory, entry: Entry) -> None:
    """The entry's row, and its digests for the look-up on the way in (memctl.write.erased; from sql/0024)."""
    conn.execute(
        INSERT,
        (
            entry.id,
            entry.erased_at,
            entry.op,
            entry.source,
            entry.target,
            entry.key_id,
            json.dumps(entry.counts, default=str),
            json.dumps(entry.items),
        ),
    )
    if conn.one(HAS_DIGESTS)["yes"]:
        found = [(e["digest"], "episode") for e in entry.items.get("episodes", [])]
        found += [(d, "quote") for d in entry.items.get("quotes", [])]
        conn.execute(
            INSERT_DIGESTS,
            {"id": entry.id, "digests": [d for d, _ in found], "kinds": [k for _, k in found]},
        )


def _append(entries: Iterable[Entry], tag: str) -> None:
    """Append lines to the ledger file (O_APPEND, 0600 from the first byte), then fsync it."""
    lines = "".join(
        json.dumps({"database": tag, **e.to_dict()}, default=str) + "\n" for e in entries
    )
    if not lines:
        return
    from memctl import files

    path = ledger_path()
    _make_dir(path.parent)
    created = not path.exists()
    try:
        fd = os.open(
            path,
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
            files.PRIVATE,
        )
        try:
            os.write(fd, lines.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise MemctlError(
            f"cannot append to the erasure ledger {path}: {exc.strerror or exc} (the entry is in "
            "the database's table erasures; the next erasure or `memctl erasure verify` copies it)"
        ) from None
    if created:
        files.fsync_dir(path.parent)


def record(conn: Memory, entry: Entry) -> Entry:
    """Keep the entry in the table (if the schema has it) and in the file."""
    if has_table(conn):
        _insert(conn, entry)
    _append([entry], database_tag(conn))
    return entry


def has_table(conn: Memory) -> bool:
    return bool(conn.one(HAS_TABLE)["yes"])


def read_file(tag: str, path: Path | None = None) -> tuple[list[Entry], int]:
    """This database's entries in the ledger file, and how many lines could not be read (a line cut short
    by a crash while it was written)."""
    path = path or ledger_path()
    found, bad = [], 0
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return [], 0
    with handle:
        for line in handle:  # each line parsed once: linear in the file
            try:
                data = json.loads(line)
                if data.get("database") == tag:
                    found.append(Entry.from_dict(data))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return found, bad


def read_table(conn: Memory) -> list[Entry]:
    if not has_table(conn):
        return []
    return [Entry.from_dict(row) for row in conn.execute(ALL).fetchall()]


def sync(conn: Memory, also: Iterable[Entry] = ()) -> list[Entry]:
    """Every entry of this database, from the table, the file and `also`, each copied where it is missing;
    oldest first."""
    tag = database_tag(conn)
    in_table = {e.id: e for e in read_table(conn)}
    in_file = {e.id: e for e in read_file(tag)[0]}
    extra = {e.id: e for e in also}
    merged = {**extra, **in_file, **in_table}
    _append([e for i, e in merged.items() if i not in in_file], tag)
    if has_table(conn):
        with conn.transaction():
            for i, e in merged.items():
                if i not in in_table:
                    _insert(conn, e)
    return sorted(merged.values(), key=lambda e: (e.erased_at, e.id))


# --- what an erasure removes: captured before, counted before and after -----------------------------

KEYS = "WITH k AS (SELECT * FROM unnest(%(agents)s::text[], %(ids)s::bigint[]) AS k(agent, id))\n"
CAPTURE = (
    KEYS
    + """
SELECT e.agent, e.id, e.content, e.source, e.kind,
       coalesce((SELECT array_agg(c.content ORDER BY c.seq) FROM chunks c
                 WHERE c.agent = e.agent AND c.episode_id = e.id), '{}') AS chunks
FROM episodes e JOIN k ON e.agent = k.agent AND e.id = k.id ORDER BY e.agent, e.id
"""
)
COUNTS = (
    KEYS
    + """
SELECT (SELECT count(*) FROM episodes e JOIN k USING (agent, id)) AS episodes,
       (SELECT count(*) FROM episodes e JOIN k USING (agent, id) WHERE e.repeat_of IS NOT NULL) AS repeats,
       (SELECT count(*) FROM episodes e JOIN k USING (agent, id) WHERE e.kind = 'summary') AS summaries,
       (SELECT count(*) FROM chunks c JOIN k ON c.agent = k.agent AND c.episode_id = k.id) AS chunks,
       (SELECT count(*) FROM embed_queue q JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id
        JOIN k ON c.agent = k.agent AND c.episode_id = k.id) AS embed_queue,
       (SELECT count(*) FROM embed_failures f JOIN chunks c ON c.agent = f.agent AND c.id = f.chunk_id
        JOIN k ON c.agent = k.agent AND c.episode_id = k.id) AS embed_failures,
       (SELECT count(*) FROM episode_access a JOIN k ON a.agent = k.agent AND a.episode_id = k.id) AS episode_access,
       (SELECT count(*) FROM summary_sources s JOIN k ON s.agent = k.agent AND s.summary_id = k.id)
           AS summary_sources
"""
)
VECTOR_COUNT = (
    KEYS
    + """
SELECT count(*) AS n FROM {table} v JOIN chunks c ON c.agent = v.agent AND c.id = v.chunk_id
JOIN k ON c.agent = k.agent AND c.episode_id = k.id
"""
)
MODELS = "SELECT table_name, state FROM embedding_models ORDER BY id"
# A run whose record episode is erased keeps its outcome, not the link nor the output the episode repeated;
# the digest of the output it had goes into the ledger (a restore, an import and verify find it again).
UNLINK_RUNS = (
    WRITER
    + KEYS
    + """, was AS (
    SELECT r.agent, r.id, CASE WHEN length(r.output_tail) >= %(min)s THEN {digest} END AS d
    FROM runbook_runs r JOIN k ON r.agent = k.agent AND r.episode_id = k.id)
UPDATE runbook_runs r SET episode_id = NULL, output_tail = %(erased)s
FROM was WHERE r.agent = was.agent AND r.id = was.id
RETURNING was.d
""".format(digest=digest_sql("r.output_tail"))
)


def _keys(keys: Iterable[tuple[str, int]]) -> dict:
    pairs = list(keys)
    return {"agents": [a for a, _ in pairs], "ids": [i for _, i in pairs]}


def capture_episodes(
    conn: Memory, keys: Iterable[tuple[str, int]], key: bytes
) -> tuple[list[dict], list[str]]:
    """The ledger's items for these episodes (agent, id, digest of the text and of each chunk, the keyed digest
    lineage keeps of it), and the texts (to look for in the job log)."""
    import hashlib

    items, texts = [], []
    for row in conn.execute(CAPTURE, _keys(keys)).fetchall():
        sha = hashlib.sha256(row["content"].encode("utf-8")).digest()
        items.append(
            {
                "agent": row["agent"],
                "id": row["id"],
                "digest": digest(key, row["content"]),
                "chunks": sorted(
                    {digest(key, c) for c in row["chunks"]} - {digest(key, row["content"])}
                ),
                "lineage": places.lineage_digest(key, sha).hex(),
            }
        )
        texts.append(row["content"])
    return items, texts


# The summaries built from these episodes (through their lineage), with the repeats of such a summary: an
# erasure of a source takes the summary with it (docs/retention.md: removed, never rewritten by a model; the
# window's other sources are summarized again by the next `memctl summarize`).
SUMMARIES_OF = (
    KEYS
    + """
SELECT DISTINCT s.agent, s.id FROM summary_sources l JOIN k ON l.agent = k.agent AND l.source_id = k.id
JOIN episodes f ON f.agent = l.agent AND f.id = l.summary_id
JOIN episodes s ON s.agent = f.agent AND (s.id = f.id OR s.repeat_of = f.id)
ORDER BY s.agent, s.id
"""
)
# Of those summaries' sources, the ones prune had already deleted: what they said goes with the summary.
SOURCES_GONE = (
    KEYS
    + """
SELECT count(*) AS n FROM summary_sources l JOIN k ON l.agent = k.agent AND l.summary_id = k.id
WHERE NOT EXISTS (SELECT 1 FROM episodes e WHERE e.agent = l.agent AND e.id = l.source_id)
"""
)


def summaries_of(conn: Memory, keys: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """The summaries (and their repeats) built from any of these episodes, not among them."""
    keys = list(keys)
    given = set(keys)
    return [
        (r["agent"], r["id"])
        for r in conn.execute(SUMMARIES_OF, _keys(keys)).fetchall()
        if (r["agent"], r["id"]) not in given
    ]


def sources_gone(conn: Memory, summaries: Iterable[tuple[str, int]]) -> int:
    """How many sources of these summaries prune had deleted already (counted before the summaries go)."""
    summaries = list(summaries)
    return conn.one(SOURCES_GONE, _keys(summaries))["n"] if summaries else 0


def count_rows(conn: Memory, keys: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Rows these episodes hold in each table (every model's vectors by table: a re-embed's too)."""
    from psycopg import sql

    params = _keys(keys)
    found = dict(conn.one(COUNTS, params))
    for model in conn.execute(MODELS).fetchall():
        query = sql.SQL(VECTOR_COUNT).format(table=sql.Identifier(model["table_name"]))
        found[model["table_name"]] = conn.one(query, params)["n"]
    return found


def removed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {table: n - after.get(table, 0) for table, n in before.items()}


def unlink_runs(
    conn: Memory, keys: Iterable[tuple[str, int]], key: bytes, quotes: list[str]
) -> int:
    """Runbook runs whose record episode is erased: the link and the output tail cleared, the digest of the
    output each had added to `quotes`; how many."""
    ipad, opad = pads(key)
    rows = conn.execute(
        UNLINK_RUNS, {**_keys(keys), "erased": ERASED, "ipad": ipad, "opad": opad, "min": MIN_QUOTE}
    ).fetchall()
    quotes.extend(r["d"] for r in rows if r["d"] is not None)
    return len(rows)


MAX_QUOTED = (
    1000  # erased texts looked for in the job log per erasure (each costs a pass over its rows)
)
QUOTING_JOBS = """
SELECT j.id, j.error, j.detail, j.detail::text AS detail_text FROM jobs j WHERE EXISTS (
    SELECT 1 FROM unnest(%(raw)s::text[], %(esc)s::text[]) AS t(raw, esc)
    WHERE strpos(coalesce(j.error, ''), t.raw) > 0 OR strpos(j.detail::text, t.esc) > 0)
"""
SET_JOB = "UPDATE jobs SET error = %s, detail = %s::jsonb WHERE id = %s"
QUOTING_RUNS = """
SELECT r.agent, r.id, r.output_tail FROM runbook_runs r
WHERE EXISTS (SELECT 1 FROM unnest(%(raw)s::text[]) AS t(raw) WHERE strpos(r.output_tail, t.raw) > 0)
"""
SET_RUN = WRITER + "UPDATE runbook_runs SET output_tail = %s WHERE agent = %s AND id = %s"


def _replace(value: Any, texts: list[str]) -> Any:
    if isinstance(value, str):
        for text in texts:
            value = value.replace(text, ERASED)
        return value
    if isinstance(value, list):
        return [_replace(v, texts) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, texts) for k, v in value.items()}
    return value


def scrub_quotes(
    conn: Memory, texts: Iterable[str], key: bytes, quotes: list[str]
) -> dict[str, int]:
    """Job log rows and runbook run outputs that quote an erased text (of at least MIN_QUOTE characters; the
    longest MAX_QUOTED texts): the quote replaced by [erased], the digest of the whole value each changed column
    had added to `quotes` (memctl.places: QUOTE). Rows changed per table, and texts looked for."""
    wanted = sorted({t for t in texts if t and len(t) >= MIN_QUOTE}, key=len, reverse=True)
    looked = wanted[:MAX_QUOTED]
    params = {"raw": looked, "esc": [json.dumps(t, ensure_ascii=False)[1:-1] for t in looked]}
    jobs = runs = 0
    if looked:
        for row in conn.execute(QUOTING_JOBS, params).fetchall():
            detail, error = _replace(row["detail"], looked), _replace(row["error"], looked)
            if detail != row["detail"] or error != row["error"]:
                conn.execute(SET_JOB, (error, json.dumps(detail), row["id"]))
                if error != row["error"]:
                    quotes.append(digest(key, row["error"]))
                if detail != row["detail"]:
                    quotes.append(digest(key, row["detail_text"]))
                jobs += 1
        for row in conn.execute(QUOTING_RUNS, params).fetchall():
            conn.execute(SET_RUN, (_replace(row["output_tail"], looked), row["agent"], row["id"]))
            quotes.append(digest(key, row["output_tail"]))
            runs += 1
    return {
        "jobs": jobs,
        "runbook_runs_quoting": runs,
        "texts_looked_for": len(looked),
        "texts_not_looked_for": len(wanted) - len(looked),
    }
