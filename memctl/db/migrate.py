"""Apply numbered sql/NNNN_*.sql files in order, once each, recording their checksums.

A file whose first line holds `-- memctl:no-transaction` runs outside a transaction, one statement at a
time (for CREATE INDEX CONCURRENTLY, or a backfill that commits in batches); every other file runs in one.
A session advisory lock makes two processes that migrate at once take turns. Each transaction waits at
most LOCK_TIMEOUT for a lock (a writer's long transaction): a migration queued behind one would make
every later write wait too; it gives way, and is tried again up to LOCK_RETRIES times.

A memory outlives the memctl that wrote it (DESIGN.md decision 15), so the record is checked both ways:
- a migration the database has applied but this memctl does not know was made by a newer memctl:
  SchemaAhead (refused for writing; a command that only reads goes on with a warning);
- a released file never changes, but three did before releases were cut (0002, 0019, 0022). A memory
  that ran an earlier content of one has its checksum recorded: sql/fixups/NAME, one file per edited
  migration, names each earlier sha256 it knows (`-- memctl:fixes NAME SHA256`) and the steps that
  bring such a memory to what the released file makes; a `-- memctl:released` line runs the released
  file itself at that point. Its record then carries the released checksum, the earlier one kept in
  fixed_from. An edited file with no fix-up is refused, as before.

Writers declare the schema they know: memctl.db.connect sets SETTING (memctl.schema) to this memctl's
newest migration in every session it opens, and from sql/0025 on the schema refuses an INSERT, UPDATE,
DELETE, COPY or TRUNCATE from a session that declares none or an older one (an older memctl, which
never learned this check). The migrator declares the newest file it applies, so migrations pass.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from memctl.errors import MemctlError, SchemaAhead, SchemaBehind, SchemaChanged

if TYPE_CHECKING:
    from memctl.db.memory import Memory


def _rows(conn: Memory, query, params=None):
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()


LOCK_KEY = 0x6D656D63746C  # "memctl"
NO_TRANSACTION = "-- memctl:no-transaction"
FIXES = re.compile(r"^-- memctl:fixes (\d{4}_[a-z0-9_]+\.sql) ([0-9a-f]{64})\s*$", re.MULTILINE)
RELEASED = re.compile(r"^-- memctl:released\s*$", re.MULTILINE)
_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
SETTING = "memctl.schema"
GUARD_SQLSTATE = "MC051"  # sql/0025_schema_guard.sql: a write from a session older than the schema
LOCK_TIMEOUT = "4s"
LOCK_RETRIES = 30

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS memctl_migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    memctl_version text,
    fixed_from text
)
"""
# Tables made before these columns existed get them (the record's own shape, not a numbered migration).
COLUMNS = """
SELECT count(*) AS n FROM pg_attribute
WHERE attrelid = 'memctl_migrations'::regclass AND attname IN ('memctl_version', 'fixed_from') AND NOT attisdropped
"""
ADD_COLUMNS = (
    "ALTER TABLE memctl_migrations ADD COLUMN IF NOT EXISTS memctl_version text, "
    "ADD COLUMN IF NOT EXISTS fixed_from text"
)
# to_jsonb(m): the columns a record made by an older memctl lacks read as NULL.
APPLIED = (
    "SELECT name, checksum, applied_at, to_jsonb(m) ->> 'memctl_version' AS memctl_version "
    "FROM memctl_migrations m ORDER BY name"
)
RECORD = "INSERT INTO memctl_migrations (name, checksum, memctl_version) VALUES (%s, %s, %s)"
RECORD_FIXUP = "UPDATE memctl_migrations SET checksum = %s, fixed_from = checksum, memctl_version = %s WHERE name = %s"
TABLE_EXISTS = "SELECT to_regclass('memctl_migrations') IS NOT NULL"
NEWEST = 'SELECT max(name COLLATE "C") FROM memctl_migrations'
DECLARE = "SELECT set_config('memctl.schema', %s, false)"
DECLARED = "SELECT current_setting('memctl.schema', true)"
# sql/0025: every table of memctl's schema carries the guard (a table a later migration made included).
GUARD_ALL = "SELECT memctl_guard_all()"
HAS_GUARD = "SELECT to_regprocedure('memctl_guard_all()') IS NOT NULL"
# The tables of an agent's rows (memctl.places.AGENT_TABLES) this schema has (an older one may lack
# some).
TABLES_PRESENT = """
SELECT c.oid::regclass::text AS name FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname = ANY(%s)
"""


@dataclass
class Migration:
    name: str
    path: Path | None
    checksum: str
    status: str = "pending"  # pending | applied | changed | fixup (an earlier content with a fix-up) | unknown
    applied_at: object = None
    applied_checksum: str | None = None
    memctl_version: str | None = None  # the memctl that applied it (None before 0.2.0)
    fixup: Path | None = None

    @property
    def sql(self) -> str:
        assert self.path is not None  # an unknown migration (applied, no file here) is never read
        return self.path.read_text(encoding="utf-8")

    def steps(self) -> str:
        """What running it executes: the file, or its fix-up with the released file where the fix-up says."""
        if self.status != "fixup":
            return self.sql
        assert self.fixup is not None
        before, *after = RELEASED.split(self.fixup.read_text(encoding="utf-8"), maxsplit=1)
        return before + (self.sql + "\n;\n" + after[0] if after else "")


@dataclass
class Schema:
    """The database's record against this memctl's files."""

    migrations: list[Migration] = field(default_factory=list)

    def by(self, *statuses: str) -> list[Migration]:
        return [m for m in self.migrations if m.status in statuses]

    @property
    def newest_applied(self) -> str | None:
        names = [m.name for m in self.migrations if m.status != "pending"]
        return max(names) if names else None


def sql_dir() -> Path:
    """The schema files: inside the installed package, or the checkout's sql/."""
    package = Path(__file__).parent.parent  # memctl/ (this is memctl/db/migrate.py)
    packaged = package / "sql"
    return packaged if packaged.is_dir() else package.parent / "sql"


def checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_files(directory: Path | None = None) -> list[Migration]:
    directory = directory or sql_dir()
    return [
        Migration(path.name, path, checksum(path))
        for path in sorted(directory.glob("*.sql"))
        if _NAME.match(path.name)
    ]


def read_fixups(directory: Path | None = None) -> dict[tuple[str, str], Path]:
    """(migration name, an earlier sha256 of it) -> the fix-up file that brings such a memory forward."""
    found = {}
    for path in sorted(((directory or sql_dir()) / "fixups").glob("*.sql")):
        for name, earlier in FIXES.findall(path.read_text(encoding="utf-8")):
            found[(name, earlier)] = path
    return found


@lru_cache(maxsize=8)
def _newest(directory: str) -> str:
    names = sorted(path.name for path in Path(directory).glob("*.sql") if _NAME.match(path.name))
    return names[-1] if names else ""


def newest(directory: Path | None = None) -> str:
    """The newest migration this memctl knows: what its sessions declare (SETTING)."""
    return _newest(str(directory or sql_dir()))


def session_options(url: str) -> str:
    """libpq `options` for a connection to URL that declare this memctl's schema, after the caller's own (the
    URL's, else PGOPTIONS: an explicit `options` replaces both)."""
    import os

    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        existing = conninfo_to_dict(url).get("options") or os.environ.get("PGOPTIONS")
    except ProgrammingError:
        existing = os.environ.get("PGOPTIONS")  # a malformed URL: connecting says why
    declared = f"-c {SETTING}={newest()}"
    return f"{existing} {declared}" if existing else declared


def read_schema(conn: Memory, directory: Path | None = None) -> Schema:
    """Every migration file with its status against the database, then those only the database has."""
    files = read_files(directory)
    applied = {}
    if _rows(conn, TABLE_EXISTS)[0][0]:
        applied = {row[0]: row[1:] for row in _rows(conn, APPLIED)}
    fixups = read_fixups(directory)
    for migration in files:
        if migration.name in applied:
            migration.applied_checksum, migration.applied_at, migration.memctl_version = (
                applied.pop(migration.name)
            )
            if migration.applied_checksum == migration.checksum:
                migration.status = "applied"
            else:
                migration.fixup = fixups.get((migration.name, migration.applied_checksum))
                migration.status = "fixup" if migration.fixup else "changed"
    unknown = [
        Migration(name, None, sums, "unknown", at, sums, version)
        for name, (sums, at, version) in applied.items()
    ]
    return Schema(sorted(files + unknown, key=lambda m: m.name))


def plan(conn: Memory, directory: Path | None = None) -> list[Migration]:
    """Every migration with its status (`memctl db migrate --list`)."""
    return read_schema(conn, directory).migrations


def _refuse(schema: Schema, directory: Path | None = None) -> None:
    unknown = schema.by("unknown")
    if unknown:
        raise SchemaAhead(ahead_message(unknown, directory))
    changed = [m.name for m in schema.by("changed")]
    if changed:
        raise MemctlError(
            f"applied migration file(s) changed since they ran: {', '.join(changed)}; "
            "restore the original file and add a new numbered file instead"
        )


def ahead_message(unknown: list[Migration], directory: Path | None = None) -> str:
    from memctl import __version__

    last = unknown[-1]
    made_by = f" (applied by memctl {last.memctl_version})" if last.memctl_version else ""
    return (
        f"this memory's schema is at {last.name}{made_by}, newer than memctl {__version__} knows (its newest "
        f"migration: {newest(directory) or 'none'}; {len(unknown)} it does not know): upgrade memctl "
        "(pip install -U memctl, in every venv that runs it: the systemd units' too)"
    )


def pending(conn: Memory, directory: Path | None = None) -> list[Migration]:
    """What a migrate would run, in order: pending files and fix-ups of earlier contents."""
    schema = read_schema(conn, directory)
    _refuse(schema, directory)
    return schema.by("pending", "fixup")


def apply(
    conn: Memory, directory: Path | None = None, report=None, progress=None
) -> list[Migration]:
    """Apply pending migrations; returns those applied by this call. `conn` is autocommit.

    First the server is checked (memctl.db.preflight.preflight): a PostgreSQL or pgvector too old, or a
    `vector` extension this role may not create, is refused with what to do, before anything changes.
    `report` receives warnings (e.g. a PostgreSQL newer than memctl was measured on); `progress` a line for
    each migration done, with how long it took.
    """
    from memctl.db import locks, preflight

    locks.session_lock(conn, LOCK_KEY, "migrate")
    try:
        todo = pending(conn, directory)
        for message in preflight.preflight(conn, schema_changes=bool(todo)):
            if report is not None:
                report(message)
        _declare(conn, newest(directory))
        conn.execute(CREATE_TABLE)
        if _rows(conn, COLUMNS)[0][0] < 2:
            conn.execute(ADD_COLUMNS)
        todo = pending(conn, directory)
        for migration in todo:
            started = time.monotonic()
            _run(conn, migration, report)
            if progress is not None:
                done = (
                    "fixed (its earlier content's fix-up)"
                    if migration.status == "fixup"
                    else "applied"
                )
                progress(f"{migration.name}: {done} in {time.monotonic() - started:.1f} s")
            migration.status = "applied"
        if todo and _rows(conn, HAS_GUARD)[0][0]:
            conn.execute(GUARD_ALL)  # a table an unguarded migration made gets the guard too
        return todo
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


def _declare(conn: Memory, name: str) -> None:
    """Declare NAME for this session unless it declares a newer one already."""
    declared = _rows(conn, DECLARED)[0][0] or ""
    if name > declared:
        conn.execute(DECLARE, (name,))


def _run(conn: Memory, migration: Migration, report) -> None:
    """One migration (or fix-up), tried again when it gave way to a writer's lock."""
    import psycopg

    from memctl import __version__

    text = migration.steps()
    record = (
        (RECORD_FIXUP, (migration.checksum, __version__, migration.name))
        if migration.status == "fixup"
        else (RECORD, (migration.name, migration.checksum, __version__))
    )
    for attempt in range(1, LOCK_RETRIES + 1):
        try:
            if text.lstrip().startswith(NO_TRANSACTION):
                conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
                try:
                    for statement in statements(text):
                        conn.execute(statement)
                finally:
                    conn.execute("RESET lock_timeout")
                conn.execute(*record)
            else:
                with conn.transaction():
                    conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                    conn.execute(text)
                    conn.execute(*record)
            return
        except psycopg.errors.LockNotAvailable:
            if attempt == LOCK_RETRIES:
                raise MemctlError(
                    f"{migration.name}: a lock on its tables was held by other sessions through "
                    f"{LOCK_RETRIES} tries of {LOCK_TIMEOUT} each (a long transaction?); nothing of "
                    "it was applied: run memctl db migrate again once it ends"
                ) from None
            if report is not None:
                report(
                    f"{migration.name}: a table is locked by another session; gave way after {LOCK_TIMEOUT} "
                    f"(try {attempt} of {LOCK_RETRIES}), trying again"
                )
            time.sleep(min(5.0, 0.5 * attempt))


def statements(text: str) -> list[str]:
    """SQL text split into statements at top-level semicolons (quotes, dollar quotes and comments kept whole)."""
    found, start, i, n = [], 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "-" and text.startswith("--", i):
            i = _after(text, "\n", i + 2)
        elif ch == "/" and text.startswith("/*", i):
            i = _after(text, "*/", i + 2)
        elif ch in "'\"":
            i = _after(text, ch, i + 1)
        elif ch == "$":
            tag = re.match(r"\$[A-Za-z_][A-Za-z0-9_]*\$|\$\$", text[i:])
            i = _after(text, tag.group(0), i + len(tag.group(0))) if tag else i + 1
        elif ch == ";":
            found.append(text[start:i])
            start = i = i + 1
        else:
            i += 1
    found.append(text[start:])
    return [s.strip() for s in found if _code(s)]


def _after(text: str, end: str, i: int) -> int:
    found = text.find(end, i)
    return len(text) if found < 0 else found + len(end)


def _code(statement: str) -> bool:
    """Whether a piece of SQL holds anything but comments and blanks."""
    return bool(re.sub(r"--[^\n]*|/\*.*?\*/|\s+", "", statement, flags=re.DOTALL))


def holds_memory(conn: Memory) -> bool:
    """Whether any memory table holds a row (a database only created and migrated holds none)."""
    from psycopg import sql

    from memctl import places

    if not _rows(conn, TABLE_EXISTS)[0][0]:
        return False
    tables = [row[0] for row in _rows(conn, TABLES_PRESENT, (list(places.AGENT_TABLES),))]
    if not tables:
        return False
    # `SELECT 1`, not a zero-column `SELECT FROM`: Citus plans the latter on a distributed table as a function
    # returning "record" and refuses it ("a column definition list is required").
    query = sql.SQL(" OR ").join(
        sql.SQL("EXISTS (SELECT 1 FROM {})").format(sql.SQL(t)) for t in tables
    )
    return bool(_rows(conn, sql.SQL("SELECT ") + query)[0][0])


def ensure_current(conn: Memory, *, auto: bool, reading: bool = False, report=None) -> None:
    """Check the database's schema is this memctl's; apply what is pending when `auto` and it holds no memory.

    A schema newer than this memctl's (a migration it does not know) is SchemaAhead, unless the command only
    reads (`reading`): then `report` gets the warning and it goes on. A schema behind, holding memory, is
    SchemaBehind: `memctl db migrate` takes a backup first, which is not this layer's to take.
    """
    files = read_files()
    if _rows(conn, TABLE_EXISTS)[0][0]:
        applied = dict(_rows(conn, "SELECT name, checksum FROM memctl_migrations"))
        if applied == {m.name: m.checksum for m in files}:
            return
    schema = read_schema(conn)
    if schema.by("unknown"):
        if not reading:
            raise SchemaAhead(ahead_message(schema.by("unknown")))
        if report is not None:
            report(f"{ahead_message(schema.by('unknown'))}; reading on, writes are refused")
        return
    _refuse(schema)
    behind = schema.by("pending", "fixup")
    if not behind:
        return
    if auto and not holds_memory(conn):
        apply(conn, report=report)
        return
    raise SchemaBehind(
        f"schema is behind: run memctl db migrate ({len(behind)} pending: {', '.join(m.name for m in behind)}; "
        "it takes a backup first, --dry-run shows the plan)"
    )


def newest_applied(conn: Memory) -> str | None:
    return _rows(conn, NEWEST)[0][0] if _rows(conn, TABLE_EXISTS)[0][0] else None


def check_unchanged(conn: Memory, known: str | None = None) -> None:
    """For a long-running process: SchemaChanged once the database's newest migration is not the one this
    memctl knows (a newer memctl migrated it since the process started)."""
    known = known or newest()
    found = newest_applied(conn)
    if found is not None and found != known:
        raise SchemaChanged(changed_message(found, known))


def changed_message(found: str, known: str) -> str:
    from memctl import __version__

    return (
        f"this memory's schema changed while this process ran (now at {found}; memctl {__version__} knows up "
        f"to {known}): stopping so it starts again with the memctl installed now (its systemd unit restarts "
        "it); nothing acknowledged is lost"
    )


def is_guard_refusal(exc: BaseException) -> bool:
    """A write the schema refused because this session's memctl is older than the schema (sql/0025)."""
    return getattr(exc, "sqlstate", None) == GUARD_SQLSTATE
