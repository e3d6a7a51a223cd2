"""`memctl redact scan [--fix]`: secrets already in the database (written before redaction, or with it off).

The scan reads every text memctl keeps (episodes and their meta, chunks, facts, fact history,
the job log, runbook run records) through server-side cursors and reports where a secret
is: table, row, column, kinds. Never the value.

The fix rewrites in place, in one transaction under the model write lock: an episode's
text and meta are redacted, its chunks deleted (their vectors, queue and failure rows
cascade) and made anew from the redacted text and queued for the active and backfill
models, as `episode add` does; facts get the redacted value; in fact history the value
that held a secret is cleared (NULL), as `fact delete --erase` clears them, and the fact
tables are vacuumed; job errors and details and run output are redacted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

from memctl import episodes, facts, models
from memctl.redact import find, redact_text, redact_value


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
    episodes: set[tuple[str, int]] = field(default_factory=set)  # (agent, id) to rewrite and re-chunk
    facts: set[tuple[str, str]] = field(default_factory=set)
    history: dict[int, set[str]] = field(default_factory=dict)  # fact_history id -> columns to clear
    jobs: set[int] = field(default_factory=set)
    runs: set[tuple[str, int]] = field(default_factory=set)


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
SOURCES = {
    "episodes": "SELECT agent, id, content, meta::text AS meta FROM episodes",
    "chunks": "SELECT agent, id, episode_id, content FROM chunks",
    "facts": "SELECT namespace, key, value FROM facts",
    "fact_history": "SELECT id, namespace, key, old_value, new_value FROM fact_history",
    "jobs": "SELECT id, error, detail::text AS detail FROM jobs",
    "runbook_runs": "SELECT agent, id, output_tail FROM runbook_runs",
}


def _kinds(text: str | None) -> str | None:
    if not text:
        return None
    found = find(text)
    if not found:
        return None
    counts = Counter(f.kind for f in found)
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(counts.items()))


def _rows(conn, table: str) -> Iterator[dict]:
    with conn.transaction(), conn.cursor(name=f"memctl_scan_{table}") as cur:
        cur.itersize = ITERSIZE
        cur.execute(SOURCES[table])
        yield from cur


def scan(conn) -> Scan:
    result = Scan()
    for row in _rows(conn, "episodes"):
        for column in ("content", "meta"):
            kinds = _kinds(row[column])
            if kinds:
                result.hits.append(Hit("episodes", str(row["id"]), column, kinds))
                result.episodes.add((row["agent"], row["id"]))
    for row in _rows(conn, "chunks"):
        kinds = _kinds(row["content"])
        if kinds:
            result.hits.append(Hit("chunks", str(row["id"]), "content", kinds))
            result.episodes.add((row["agent"], row["episode_id"]))
    for row in _rows(conn, "facts"):
        kinds = _kinds(row["value"])
        if kinds:
            result.hits.append(Hit("facts", f"{row['namespace']}/{row['key']}", "value", kinds))
            result.facts.add((row["namespace"], row["key"]))
    for row in _rows(conn, "fact_history"):
        for column in ("old_value", "new_value"):
            kinds = _kinds(row[column])
            if kinds:
                result.hits.append(Hit("fact_history", str(row["id"]), column, kinds))
                result.history.setdefault(row["id"], set()).add(column)
    for row in _rows(conn, "jobs"):
        for column in ("error", "detail"):
            kinds = _kinds(row[column])
            if kinds:
                result.hits.append(Hit("jobs", str(row["id"]), column, kinds))
                result.jobs.add(row["id"])
    for row in _rows(conn, "runbook_runs"):
        kinds = _kinds(row["output_tail"])
        if kinds:
            result.hits.append(Hit("runbook_runs", str(row["id"]), "output_tail", kinds))
            result.runs.add((row["agent"], row["id"]))
    return result


GET_EPISODE = "SELECT content, meta FROM episodes WHERE agent = %s AND id = %s FOR UPDATE"
SET_EPISODE = "UPDATE episodes SET content = %s, content_hash = %s, meta = %s WHERE agent = %s AND id = %s"
DROP_CHUNKS = "DELETE FROM chunks WHERE agent = %s AND episode_id = %s"
SET_FACT = "UPDATE facts SET value = %s WHERE namespace = %s AND key = %s"
GET_FACT = "SELECT value FROM facts WHERE namespace = %s AND key = %s FOR UPDATE"
CLEAR_OLD = "UPDATE fact_history SET old_value = NULL WHERE id = %s"
CLEAR_NEW = "UPDATE fact_history SET new_value = NULL WHERE id = %s"
GET_JOB = "SELECT error, detail FROM jobs WHERE id = %s FOR UPDATE"
SET_JOB = "UPDATE jobs SET error = %s, detail = %s::jsonb WHERE id = %s"
GET_RUN = "SELECT output_tail FROM runbook_runs WHERE agent = %s AND id = %s FOR UPDATE"
SET_RUN = "UPDATE runbook_runs SET output_tail = %s WHERE agent = %s AND id = %s"


def fix(conn, settings, found: Scan) -> Fixed:
    """Rewrite every row the scan found, in one transaction; then vacuum the fact tables if history changed."""
    from psycopg.types.json import Jsonb

    done = Fixed()
    with conn.transaction():
        conn.execute(models.WRITE_LOCK)
        for agent, episode_id in sorted(found.episodes):
            _fix_episode(conn, settings, agent, episode_id, done, Jsonb)
        for namespace, key in sorted(found.facts):
            conn.execute(facts.LOCK_KEY, (namespace, key))
            row = conn.execute(GET_FACT, (namespace, key)).fetchone()
            if row is not None:
                conn.execute(SET_FACT, (redact_text(row["value"]), namespace, key))
                done.facts += 1
        for history_id, columns in sorted(found.history.items()):
            for column in sorted(columns):
                conn.execute(CLEAR_OLD if column == "old_value" else CLEAR_NEW, (history_id,))
                done.history_values_cleared += 1
        for job_id in sorted(found.jobs):
            row = conn.execute(GET_JOB, (job_id,)).fetchone()
            if row is not None:
                conn.execute(SET_JOB, (redact_text(row["error"]), json.dumps(redact_value(row["detail"])), job_id))
                done.jobs += 1
        for agent, run_id in sorted(found.runs):
            row = conn.execute(GET_RUN, (agent, run_id)).fetchone()
            if row is not None:
                conn.execute(SET_RUN, (redact_text(row["output_tail"]), agent, run_id))
                done.runbook_runs += 1
    if found.history and conn.autocommit:
        facts._vacuum(conn, full=False)
        done.vacuum = True
    return done


def _fix_episode(conn, settings, agent: str, episode_id: int, done: Fixed, Jsonb: Any) -> None:
    row = conn.execute(GET_EPISODE, (agent, episode_id)).fetchone()
    if row is None:
        return
    content = redact_text(row["content"])
    conn.execute(SET_EPISODE, (content, hashlib.sha256(content.encode("utf-8")).digest(),
                               Jsonb(redact_value(row["meta"])), agent, episode_id))
    conn.execute(DROP_CHUNKS, (agent, episode_id))  # vectors, queue and failure rows cascade
    with conn.cursor() as cur:
        for seq, text in enumerate(episodes.chunks_of(settings, content)):
            cur.execute(episodes.INSERT_CHUNK, (agent, episode_id, seq, text,
                                                hashlib.sha256(text.encode("utf-8")).digest()))
            done.chunks += 1
    done.queued += conn.execute(episodes.ENQUEUE_EPISODE, (agent, episode_id)).rowcount
    done.episodes += 1
