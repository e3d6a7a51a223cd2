"""`memctl redact scan [--fix]`: secrets already in the database (written before redaction, or with it off).

The scan reads every text memctl keeps (the columns memctl.places declares for it: episodes and
their meta, chunks, facts, fact history, the job log, runbook run records, lineage's agents,
blocked sources) through server-side cursors and reports where a secret is: table, row, column,
kinds. Never the value.

The fix rewrites in place, in one transaction under the model write lock: an episode's
text and meta are redacted, its chunks deleted (their vectors, queue and failure rows
cascade) and made anew from the redacted text and queued for the active and backfill
models, as `episode add` does; facts get the redacted value; in fact history the value
that held a secret is cleared (NULL), as `fact delete --erase` clears them, and the fact
tables are vacuumed; job errors and details and run output are redacted.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from memctl import places
from memctl.db import locks
from memctl.records import facts
from memctl.write.values import WRITER
from memctl.redact import Redactor, find, redact_named, redact_text, redact_value

if TYPE_CHECKING:
    from memctl.db.memory import Memory


@dataclass
class Hit:
    table: str
    id: str
    column: str
    kinds: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Scan:
    hits: list[Hit] = field(default_factory=list)
    episodes: set[tuple[str, int]] = field(
        default_factory=set
    )  # (agent, id) to rewrite and re-chunk
    facts: set[tuple[str, str]] = field(default_factory=set)
    history: dict[int, set[str]] = field(
        default_factory=dict
    )  # fact_history id -> columns to clear
    jobs: set[int] = field(default_factory=set)
    runs: set[tuple[str, int]] = field(default_factory=set)
    # Secrets in names that are keys (an agent, a fact's namespace or key, a blocked source): reported,
    # not rewritten, since other rows refer to them by name; rename or delete them by hand.
    names: list[Hit] = field(default_factory=list)
    blocked: set[str] = field(default_factory=set)  # blocked sources whose reason holds a secret


@dataclass
class Fixed:
    episodes: int = 0
    chunks: int = 0
    queued: int = 0
    facts: int = 0
    history_values_cleared: int = 0
    jobs: int = 0
    runbook_runs: int = 0
    vacuum: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


ITERSIZE = 2000
# Columns found by scan() but rewritten by fix() only through the row they belong to.
NAME_COLUMNS = {
    "episodes": ("agent",),
    "facts": ("namespace", "key"),
    "fact_history": ("namespace", "key"),
    "runbook_runs": ("agent", "name"),
    "summary_sources": ("agent",),
    "blocked_sources": ("source",),
}
# A fact value is judged with its key (the gate's rule): under a key that names a secret it is one.
NAMED_VALUES = {"facts": ("value",), "fact_history": ("old_value", "new_value")}


def source(table: places.Table):
    """What the scan reads of a table: the columns memctl.places says it scans, and the ones naming a row
    (one row per distinct value where none does)."""
    from psycopg import sql

    names = list(dict.fromkeys([*table.keys, *table.scanned]))
    read = sql.SQL(", ").join(
        sql.SQL("{}{} AS {}").format(
            sql.Identifier(n),
            sql.SQL(table.column(n).cast if n in table.scanned else ""),
            sql.Identifier(n),
        )
        for n in names
    )
    return sql.SQL("SELECT {distinct}{read} FROM {table}").format(
        distinct=sql.SQL("" if table.keys else "DISTINCT "),
        read=read,
        table=sql.Identifier(table.name),
    )


# Every table memctl.places declares with columns to scan: every column the write gate (memctl.write.gate)
# redacts, and the job log.
SOURCES = {t.name: source(t) for t in places.TABLES if t.scanned}


def _named_kinds(key: str, value: str | None) -> str | None:
    """A fact value under a key that names a secret is one (the gate's rule), else what find() sees."""
    if value and redact_named(key, value) != redact_text(value):
        return "secret-named"
    return _kinds(value)


def _kinds(text: str | None) -> str | None:
    if not text:
        return None
    found = find(text)
    if not found:
        return None
    counts = Counter(f.kind for f in found)
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(counts.items()))


def _rows(conn: Memory, table: str) -> Iterator[dict]:
    with conn.transaction(), conn.cursor(name=f"memctl_scan_{table}") as cur:
        cur.itersize = ITERSIZE
        cur.execute(SOURCES[table])
        yield from cur


def _row_id(row: dict) -> str:
    if "id" in row:
        return str(row["id"])
    return f"{row['namespace']}/{row['key']}" if "namespace" in row else "-"


# What the fix rewrites for a hit in each table's columns (a name column is only reported).
MARK = {
    "episodes": lambda found, row, column: found.episodes.add((row["agent"], row["id"])),
    "chunks": lambda found, row, column: found.episodes.add((row["agent"], row["episode_id"])),
    "facts": lambda found, row, column: found.facts.add((row["namespace"], row["key"])),
    "fact_history": lambda found, row, column: found.history.setdefault(row["id"], set()).add(
        column
    ),
    "jobs": lambda found, row, column: found.jobs.add(row["id"]),
    "blocked_sources": lambda found, row, column: found.blocked.add(row["source"]),
    "runbook_runs": lambda found, row, column: found.runs.add((row["agent"], row["id"])),
}


def scan(conn: Memory) -> Scan:
    """Every secret in every column memctl.places says the scan reads: where (table, row, column, kinds)."""
    result = Scan()
    for table in (t for t in places.TABLES if t.scanned):
        names, named = NAME_COLUMNS.get(table.name, ()), NAMED_VALUES.get(table.name, ())
        for row in _rows(conn, table.name):
            for column in table.scanned:
                kinds = (
                    _named_kinds(row["key"], row[column])
                    if column in named
                    else _kinds(row[column])
                )
                if not kinds:
                    continue
                hit = Hit(table.name, _row_id(row), column, kinds)
                result.hits.append(hit)
                if column in names:
                    result.names.append(hit)
                else:
                    MARK[table.name](result, row, column)
    return result


GET_EPISODE = """
SELECT kind, source, content, meta, repeat_of FROM episodes WHERE agent = %s AND id = %s FOR UPDATE
"""
SET_EPISODE = (
    WRITER
    + """
UPDATE episodes SET kind = %s, source = %s, content = %s, content_hash = %s, norm_hash = %s, meta = %s
WHERE agent = %s AND id = %s
"""
)
SET_REASON = WRITER + "UPDATE blocked_sources SET reason = %s WHERE source = %s"
DROP_CHUNKS = "DELETE FROM chunks WHERE agent = %s AND episode_id = %s"
SET_FACT = WRITER + "UPDATE facts SET value = %s, source = %s WHERE namespace = %s AND key = %s"
GET_FACT = "SELECT value, source FROM facts WHERE namespace = %s AND key = %s FOR UPDATE"
CLEAR_OLD = WRITER + "UPDATE fact_history SET old_value = NULL WHERE id = %s"
CLEAR_NEW = WRITER + "UPDATE fact_history SET new_value = NULL WHERE id = %s"
CLEAR_SOURCE = WRITER + "UPDATE fact_history SET source = NULL WHERE id = %s"
GET_JOB = "SELECT error, detail FROM jobs WHERE id = %s FOR UPDATE"
SET_JOB = "UPDATE jobs SET error = %s, detail = %s::jsonb WHERE id = %s"
GET_RUN = "SELECT commit, output_tail FROM runbook_runs WHERE agent = %s AND id = %s FOR UPDATE"
SET_RUN = (
    WRITER + "UPDATE runbook_runs SET commit = %s, output_tail = %s WHERE agent = %s AND id = %s"
)


def fix(conn: Memory, found: Scan) -> Fixed:
    """Rewrite every row the scan found, in one transaction; then vacuum the fact tables if history changed."""
    from psycopg.types.json import Jsonb

    from memctl.records import erasures

    done = Fixed()
    secret = erasures.load_key()
    with conn.transaction():
        conn.execute(locks.WRITE_LOCK)
        items = _ledger_items(conn, found, secret)
        for agent, episode_id in sorted(found.episodes):
            _fix_episode(conn, agent, episode_id, done, Jsonb)
        for namespace, key in sorted(found.facts):
            facts.lock_key(conn, namespace, key)
            row = conn.execute(GET_FACT, (namespace, key)).fetchone()
            if row is not None:
                conn.execute(
                    SET_FACT,
                    (redact_named(key, row["value"]), redact_text(row["source"]), namespace, key),
                )
                done.facts += 1
        for history_id, columns in sorted(found.history.items()):
            for column in sorted(columns):
                clear = {"old_value": CLEAR_OLD, "new_value": CLEAR_NEW, "source": CLEAR_SOURCE}[
                    column
                ]
                conn.execute(clear, (history_id,))
                done.history_values_cleared += 1
        for job_id in sorted(found.jobs):
            row = conn.execute(GET_JOB, (job_id,)).fetchone()
            if row is not None:
                conn.execute(
                    SET_JOB,
                    (redact_text(row["error"]), json.dumps(redact_value(row["detail"])), job_id),
                )
                done.jobs += 1
        for source in sorted(found.blocked):
            conn.execute(SET_REASON, (redact_text(_reason(conn, source)), source))
        for agent, run_id in sorted(found.runs):
            row = conn.execute(GET_RUN, (agent, run_id)).fetchone()
            if row is not None:
                conn.execute(
                    SET_RUN,
                    (redact_text(row["commit"]), redact_text(row["output_tail"]), agent, run_id),
                )
                done.runbook_runs += 1
    if found.history and conn.autocommit:
        facts.vacuum(conn, full=False)
        done.vacuum = True
    if items["episodes"] or items["facts"]:
        erasures.record(
            conn,
            erasures.new_entry(conn, "redact_fix", key=secret, counts=done.to_dict(), items=items),
        )
    return done


HELD_VALUES = """
SELECT namespace, key, value AS text FROM facts
WHERE (namespace, key) IN (SELECT * FROM unnest(%(ns)s::text[], %(keys)s::text[]))
UNION ALL SELECT namespace, key, old_value FROM fact_history WHERE id = ANY(%(old)s)
UNION ALL SELECT namespace, key, new_value FROM fact_history WHERE id = ANY(%(new)s)
"""


def _ledger_items(conn: Memory, found: Scan, secret: bytes) -> dict:
    """What the fix is about to overwrite, for the erasure ledger: digests of the old texts, never the texts."""
    from memctl.records import erasures

    episodes, _ = erasures.capture_episodes(conn, sorted(found.episodes), secret)
    names = sorted(found.facts)
    params = {
        "ns": [n for n, _ in names],
        "keys": [k for _, k in names],
        "old": [i for i, cols in found.history.items() if "old_value" in cols],
        "new": [i for i, cols in found.history.items() if "new_value" in cols],
    }
    digests: dict[tuple[str, str], set[str]] = {}
    for row in conn.execute(HELD_VALUES, params).fetchall():
        if row["text"] is not None:
            digests.setdefault((row["namespace"], row["key"]), set()).add(
                erasures.digest(secret, row["text"])
            )
    return {
        "episodes": episodes,
        "history": sorted(found.history),
        "facts": [
            {"namespace": n, "key": k, "digests": sorted(d), "erased": True}
            for (n, k), d in digests.items()
        ],
    }


def _reason(conn: Memory, source: str) -> str | None:
    row = conn.execute("SELECT reason FROM blocked_sources WHERE source = %s", (source,)).fetchone()
    return row["reason"] if row else None


def _fix_episode(conn: Memory, agent: str, episode_id: int, done: Fixed, Jsonb: Any) -> None:
    settings = conn.settings
    from memctl.write import gate, store

    row = conn.execute(GET_EPISODE, (agent, episode_id)).fetchone()
    if row is None:
        return
    # Through the gate in redact mode, whatever [redaction] says: --fix replaces what it found.
    episode = gate.Gate(conn, settings, Redactor("redact")).stored_episode(
        agent, row["content"], row["meta"]
    )
    conn.execute(
        SET_EPISODE,
        (
            redact_text(row["kind"]),
            redact_text(row["source"]),
            episode.content,
            episode.content_hash,
            episode.norm_hash,
            Jsonb(episode.meta),
            agent,
            episode_id,
        ),
    )
    conn.execute(DROP_CHUNKS, (agent, episode_id))  # vectors, queue and failure rows cascade
    if (
        row["repeat_of"] is None
    ):  # a repeat has no chunks of its own (memctl.write.repeats): its first's count
        done.queued += store.insert_chunks(conn, episode, episode_id)
        done.chunks += len(episode.chunks)
    done.episodes += 1
