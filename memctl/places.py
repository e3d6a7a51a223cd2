"""Every place that holds memory text, declared once (DESIGN 14), and the one way memctl keeps a digest of it.

TABLES names every table of memctl's schema and, in each, every column that can hold text or a digest (text,
text[], json, jsonb, tsvector, bytea), with how an erasure reaches it (its rule). tests/test_places.py holds the
declaration against the catalog of a migrated database: a new table, or a new column of those types, fails it
until it is declared here. What reads it:

- the gate's writers and the writer check: MEMORY_TABLES, the tables whose records enter from outside
  (memctl.write.store, tests/conftest.py);
- a migration's look for memory: AGENT_TABLES, the tables with an agent or a namespace column,
  which the agents' wall keeps a role to (memctl.db.migrate; tests/test_agents.py);
- `erasure verify` (memctl.backup.erasure): every WHOLE and QUOTE column tested against the ledger's digests,
  VALUE columns against their key's;
- a restore's re-application (memctl.backup.erasure) and an import (memctl.write.erased): a QUOTE column whose
  whole value the ledger holds is rewritten to its ERASED value;
- `redact scan` (memctl.records.redact_scan): the columns it reads are SCANNED's;
- export (memctl.transfer.export): no plain digest leaves the database (ROW digests are never exported,
  KEYED ones are under the ledger's key).

A digest of memory text that can outlive its text (summary lineage, the erasure ledger) is keyed: HMAC-SHA256 under
the installation's erasure key (MEMCTL_HOME/erasure/key, outside the database), never a plain hash, which a guess
could confirm. The plain sha256 columns (episodes.content_hash, norm_hash, record_key, chunks' and vectors'
content_hash) stand beside their own text, go with its row and are never exported.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, overload

if TYPE_CHECKING:
    import psycopg

# How an erasure reaches a column.
WHOLE = "whole"  # holds a memory text whole: the erasure deletes its row; verify tests its value's digest
VALUE = "value"  # a fact value: an erasure clears it by namespace and key; verify tests its key's digests
QUOTE = "quote"  # may quote memory text: rewritten where an erased text is found, the ledger keeping the digest of
#                  the whole value it had, so a restore, an import and verify find that value again
ROW = "row"  # belongs to a row the erasure deletes (derived from its text, or a plain digest of it): gone with it
KEYED = "keyed"  # a keyed digest of memory text (or the ledger's ids and digests): outlives the text, reveals nothing
NONE = "none"  # holds no memory text (a name, a setting, a position, a key): said why
RULES = (WHOLE, VALUE, QUOTE, ROW, KEYED, NONE)

ERASED = "[erased]"  # what an erased quote becomes in a text column
ERASED_JSON = '{"erased": true}'  # ... and a json column whose whole value the ledger holds


@dataclass(frozen=True)
class Column:
    name: str
    rule: str
    why: str = ""
    cast: str = ""  # how the column is read as text ('::text' for jsonb)

    def __post_init__(self) -> None:
        if self.rule not in RULES or (self.rule == NONE and not self.why):
            raise ValueError(
                f"column {self.name}: rule {self.rule!r} (a column that holds no memory text says why)"
            )

    @property
    def erased(self) -> str:
        return ERASED_JSON if self.cast else ERASED


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    erased: str  # how an erasure reaches its rows
    gate: bool = False  # its records enter from outside, written only by memctl.write.store
    label: str = ""  # how verify names a row (SQL over the table's columns)
    scanned: tuple[
        str, ...
    ] = ()  # the columns `redact scan` reads for secrets (memctl.records.redact_scan)
    keys: tuple[str, ...] = ()  # the columns that name a row, read with them

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def rule(self, rule: str) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.rule == rule)


def _c(name: str, rule: str, why: str = "", cast: str = "") -> Column:
    return Column(name, rule, why, cast)


_AGENT = _c("agent", ROW, "the agent's name: its rows go with the agent's episode")
_PLAIN = "plain sha256 of the row's own text: stands beside it, goes with the row, never exported"
_NAME = "a name memctl and agents address memory by, not memory text"

TABLES: tuple[Table, ...] = (
    Table(
        "episodes",
        (
            _c("content", WHOLE),
            _c("agent", NONE, _NAME),
            _c("kind", NONE, _NAME),
            _c(
                "source",
                NONE,
                "where a record came from: a purge matches it by the source's keyed digest",
            ),
            _c("meta", ROW, "the episode's metadata: deleted with it", "::text"),
            _c("tsv", ROW, "the words of content"),
            _c("content_hash", ROW, _PLAIN),
            _c("norm_hash", ROW, _PLAIN + " (normalized; keyed when redacted)"),
            _c("record_key", ROW, _PLAIN + " (with agent, source and time)"),
        ),
        "deleted by id (episode delete), by source (purge), by policy (prune); a summary built from it goes too",
        gate=True,
        label="agent || '/' || id",
        scanned=("agent", "content", "meta", "kind", "source"),
        keys=("agent", "id"),
    ),
    Table(
        "chunks",
        (_c("content", WHOLE), _AGENT, _c("content_hash", ROW, _PLAIN)),
        "deleted with their episode (foreign key cascade)",
        gate=True,
        label="agent || '/' || id || ' (episode ' || episode_id || ')'",
        scanned=("content",),
        keys=("agent", "id", "episode_id"),
    ),
    Table(
        "facts",
        (
            _c("value", VALUE),
            _c("namespace", NONE, _NAME),
            _c("key", NONE, _NAME),
            _c("source", NONE, "where the value came from"),
        ),
        "deleted by key (fact delete --erase, purge --facts)",
        gate=True,
        label="namespace || '/' || key",
        scanned=("namespace", "key", "value", "source"),
        keys=("namespace", "key"),
    ),
    Table(
        "fact_history",
        (
            _c("old_value", VALUE),
            _c("new_value", VALUE),
            _c("namespace", NONE, _NAME),
            _c("key", NONE, _NAME),
            _c("op", NONE, "set, delete or erase"),
            _c("source", NONE, "where the value came from"),
        ),
        "values cleared by key (fact delete --erase); the row stays as the record of a change",
        gate=True,
        label="id::text",
        scanned=("namespace", "key", "old_value", "new_value", "source"),
        keys=("id", "namespace", "key"),
    ),
    Table(
        "summary_sources",
        (_AGENT, _c("source_hash", KEYED, "the source's sha256, keyed: outlives the source")),
        "deleted with their summary (foreign key cascade), which an erasure of any source deletes",
        gate=True,
        scanned=("agent",),
    ),
    Table(
        "runbook_runs",
        (
            _c("output_tail", QUOTE),
            _c("agent", NONE, _NAME),
            _c("name", NONE, "a runbook's name"),
            _c("commit", NONE, "a git commit (as an import gives it: redacted, scanned)"),
            _c("outcome", NONE, "ok, failed or running"),
        ),
        "an erased record episode's run keeps its outcome; link and output cleared",
        gate=True,
        label="agent || '/' || id",
        scanned=("agent", "name", "commit", "output_tail"),
        keys=("agent", "id"),
    ),
    Table(
        "blocked_sources",
        (
            _c("source", NONE, "a source's name"),
            _c("reason", NONE, "the operator's reason for the block"),
        ),
        "not memory: kept",
        gate=True,
        scanned=("source", "reason"),
        keys=("source",),
    ),
    Table(
        "jobs",
        (
            _c("error", QUOTE),
            _c("detail", QUOTE, cast="::text"),
            _c("job", NONE, "the job's name"),
            _c("outcome", NONE, "a job's outcome"),
        ),
        "kept; quotes of an erased text rewritten",
        label="id::text",
        scanned=("error", "detail"),
        keys=("id",),
    ),
    Table("embed_queue", (_AGENT,), "deleted with their chunk (foreign key cascade)"),
    Table(
        "embed_failures",
        (_AGENT, _c("error", ROW, "the embedder's error for the chunk: deleted with it")),
        "deleted with their chunk (foreign key cascade)",
    ),
    Table("episode_access", (_AGENT,), "deleted with their episode (foreign key cascade)"),
    Table(
        "erasures",
        (
            _c("id", NONE, "a uuid"),
            _c("op", NONE, "the erasure's kind"),
            _c("source", NONE, "a purged source's name"),
            _c("target", NONE, "a fact's key, ids, a time"),
            _c("key_id", NONE, "which key made the digests"),
            _c("counts", NONE, "rows removed per table"),
            _c("items", KEYED, "ids and keyed digests of the erased texts, never a text"),
        ),
        "the erasure ledger itself: never erased",
    ),
    Table(
        "erasure_digests",
        (
            _c("digest", KEYED, "a ledger entry's digest, indexed for the look-up on the way in"),
            _c("kind", NONE, "episode or quote"),
            _c("erasure", NONE, "the entry's id"),
        ),
        "derived from the ledger: never erased",
    ),
    Table(
        "embedding_models",
        (
            _c("embedder", NONE, "a model's provider"),
            _c("model", NONE, "a model's name"),
            _c("storage", NONE, "vector or halfvec"),
            _c("table_name", NONE, "a table's name"),
            _c("state", NONE, "a model's state"),
            _c("query_prefix", NONE, "the model's instruction"),
            _c("document_prefix", NONE, "the model's instruction"),
        ),
        "not memory: kept",
    ),
    Table(
        "agents",
        (
            _c("name", NONE, _NAME),
            _c("role_name", NONE, "a PostgreSQL role"),
            _c("writes_namespace", NONE, _NAME),
            _c("reads_namespaces", NONE, _NAME),
            _c("token_sha256", NONE, "a digest of a random bearer token, not of memory text"),
        ),
        "not memory: the registry of agents",
    ),
    Table(
        "fold_key",
        (_c("key", NONE, "random bytes keying the fold digest of redacted texts"),),
        "not memory: a key",
    ),
    Table(
        "ingest_cursors",
        (
            _c("name", NONE, "a cursor file's path"),
            _c("position", NONE, "a journald cursor or a byte offset"),
        ),
        "not memory: positions",
    ),
    Table(
        "memctl_migrations",
        (
            _c("name", NONE, "a migration file"),
            _c("checksum", NONE, "a file's sha256"),
            _c("memctl_version", NONE, "the memctl that applied it"),
            _c("fixed_from", NONE, "an earlier content's sha256 of an edited file"),
        ),
        "not memory: the schema's history",
    ),
)
# Each embedding model's vectors (sql/templates/vectors.sql), one table per model: embedding_models.table_name.
VECTORS = Table(
    "vectors",
    (_AGENT, _c("content_hash", ROW, _PLAIN)),
    "deleted with their chunk (foreign key cascade)",
)

# The tables whose records enter from outside: written only by memctl.write.store, through the gate.
MEMORY_TABLES = tuple(t.name for t in TABLES if t.gate)
# The tables that hold an agent's rows, each with an agent or a namespace column: what row-level
# security keeps an agent's role to (sql/0019, sql/0023 find them in the catalog by that column),
# and what a database holding memory has rows in (memctl.db.migrate.holds_memory). Each model's
# vector table (VECTORS) is one too.
AGENT_TABLES = tuple(t.name for t in TABLES if {"agent", "namespace"} & {c.name for c in t.columns})


def places(rule: str) -> Iterator[tuple[Table, Column]]:
    """Every (table, column) declared with RULE, in declaration order."""
    for table in TABLES:
        for column in table.rule(rule):
            yield table, column


# --- keyed digests ----------------------------------------------------------------------------------------

KEY_BYTES = 32


def key_file(home: Path) -> Path:
    """The erasure key of the installation whose MEMCTL_HOME is HOME."""
    return home / "erasure" / "key"


@overload
def load_key(path: Path, *, create: Literal[True] = True) -> bytes: ...
@overload
def load_key(path: Path, *, create: bool) -> bytes | None: ...
def load_key(path: Path, *, create: bool = True) -> bytes | None:
    """The key at PATH; made (32 random bytes, 0600, O_EXCL, its directory 0700) when missing and `create`."""
    from memctl import files
    from memctl.errors import MemctlError

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as exc:  # another user's key (0600): said, never a traceback
        raise MemctlError(
            f"cannot read the erasure key {path}: {exc.strerror or exc} (it is its owner's: run "
            "memctl as that user, with the same MEMCTL_HOME)"
        ) from None
    if data is not None:
        if len(data) == KEY_BYTES:
            return data
        raise MemctlError(f"{path}: not an erasure key ({len(data)} bytes, {KEY_BYTES} expected)")
    if not create:
        return None
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise MemctlError(
            f"cannot create the erasure ledger's directory {path.parent}: {exc.strerror or exc}"
        ) from None
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), files.PRIVATE
        )
    except FileExistsError:  # another process made it first
        return load_key(path, create=False)
    with os.fdopen(fd, "wb") as handle:
        handle.write(os.urandom(KEY_BYTES))
        handle.flush()
        os.fsync(handle.fileno())
    files.fsync_dir(path.parent)
    return load_key(path, create=False)


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"memctl-erasure-key\0" + key).hexdigest()[:16]


def digest(key: bytes, text: str) -> str:
    """HMAC-SHA256 of the text's UTF-8 under the key, in hex: what the ledger keeps of a text."""
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def lineage_digest(key: bytes, content_hash: bytes) -> bytes:
    """What summary lineage keeps of a source: HMAC-SHA256 of the source's sha256 (episodes.content_hash) under
    the key. Computable from the plain digest alone, so a plain one is rekeyed without its text (sql/0024)."""
    return hmac.new(key, bytes(content_hash), hashlib.sha256).digest()


def pads(key: bytes) -> tuple[bytes, bytes]:
    """The HMAC's inner and outer keys, so the server computes the same digest with sha256() alone
    (digest_sql): HMAC(k, m) = sha256(k ^ opad || sha256(k ^ ipad || m)), k zero-padded to 64 bytes."""
    block = key.ljust(64, b"\0")
    return bytes(b ^ 0x36 for b in block), bytes(b ^ 0x5C for b in block)


def digest_sql(column: str) -> str:
    """The digest of a text column in SQL, hex, with the pads as parameters %(ipad)s and %(opad)s."""
    return (
        f"encode(pg_catalog.sha256(%(opad)s::bytea || pg_catalog.sha256(%(ipad)s::bytea || "
        f"pg_catalog.convert_to({column}, 'UTF8'))), 'hex')"
    )


def lineage_sql(column: str) -> str:
    """lineage_digest of a bytea column in SQL (bytea), with the pads as %(ipad)s and %(opad)s."""
    return f"pg_catalog.sha256(%(opad)s::bytea || pg_catalog.sha256(%(ipad)s::bytea || {column}))"


# The key's pads for a migration that rekeys plain digests (sql/0024): session settings, set only while
# migrations run and cleared after, on the migrating connection alone.
SET_PADS = (
    "SELECT pg_catalog.set_config('memctl.digest_ipad', %s, false), "
    "pg_catalog.set_config('memctl.digest_opad', %s, false)"
)


@contextlib.contextmanager
def key_for_migrations(conn: psycopg.Connection[Any], key: bytes | None) -> Iterator[None]:
    """Give migrations run on CONN inside the block the key's pads (sql/0024 reads them); none without a key."""
    if key is None:
        yield
        return
    ipad, opad = pads(key)
    conn.execute(SET_PADS, (ipad.hex(), opad.hex()))
    try:
        yield
    finally:
        if not conn.closed:
            conn.execute(SET_PADS, ("", ""))
