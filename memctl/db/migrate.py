"""Apply numbered sql/NNNN_*.sql files in order, once each, recording their checksums.

A file whose first line holds `-- memctl:no-transaction` runs outside a
transaction (for CREATE INDEX CONCURRENTLY); every other file runs in one.
A session advisory lock makes two processes that migrate at once take turns.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from memctl.errors import MemctlError, SchemaBehind


def _rows(conn, query, params=None):
    from psycopg.rows import tuple_row

    return conn.cursor(row_factory=tuple_row).execute(query, params).fetchall()

LOCK_KEY = 0x6D656D63746C  # "memctl"
NO_TRANSACTION = "-- memctl:no-transaction"
_NAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")

CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS memctl_migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
APPLIED = "SELECT name, checksum, applied_at FROM memctl_migrations ORDER BY name"
RECORD = "INSERT INTO memctl_migrations (name, checksum) VALUES (%s, %s)"
TABLE_EXISTS = "SELECT to_regclass('memctl_migrations') IS NOT NULL"


@dataclass
class Migration:
    name: str
    path: Path
    checksum: str
    status: str = "pending"  # pending | applied | changed
    applied_at: object = None

    @property
    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")


def sql_dir() -> Path:
    """The schema files: inside the installed package, or the checkout's sql/."""
    package = Path(__file__).parent.parent  # memctl/ (this is memctl/db/migrate.py)
    packaged = package / "sql"
    return packaged if packaged.is_dir() else package.parent / "sql"


def read_files(directory: Path | None = None) -> list[Migration]:
    directory = directory or sql_dir()
    found = []
    for path in sorted(directory.glob("*.sql")):
        if _NAME.match(path.name):
            checksum = hashlib.sha256(path.read_bytes()).hexdigest()
            found.append(Migration(path.name, path, checksum))
    return found


def plan(conn, directory: Path | None = None) -> list[Migration]:
    """Every migration file with its status against the database."""
    files = read_files(directory)
    applied = {}
    if _rows(conn, TABLE_EXISTS)[0][0]:
        applied = {row[0]: (row[1], row[2]) for row in _rows(conn, APPLIED)}
    for migration in files:
        if migration.name in applied:
            checksum, migration.applied_at = applied[migration.name]
            migration.status = "applied" if checksum == migration.checksum else "changed"
    return files


def _refuse_changed(migrations: list[Migration]) -> None:
    changed = [m.name for m in migrations if m.status == "changed"]
    if changed:
        raise MemctlError(
            f"applied migration file(s) changed since they ran: {', '.join(changed)}; "
            "restore the original file and add a new numbered file instead"
        )


def pending(conn, directory: Path | None = None) -> list[Migration]:
    migrations = plan(conn, directory)
    _refuse_changed(migrations)
    return [m for m in migrations if m.status == "pending"]


def apply(conn, directory: Path | None = None, report=None) -> list[Migration]:
    """Apply pending migrations; returns those applied by this call. `conn` is autocommit.

    First the server is checked (memctl.db.preflight.preflight): a PostgreSQL or pgvector too old, or a
    `vector` extension this role may not create, is refused with what to do, before anything changes.
    `report` receives warnings (e.g. a PostgreSQL newer than memctl was measured on).
    """
    from memctl.db import locks, preflight

    locks.session_lock(conn, LOCK_KEY, "migrate")
    try:
        todo = pending(conn, directory)
        for message in preflight.preflight(conn, schema_changes=bool(todo)):
            if report is not None:
                report(message)
        conn.execute(CREATE_TABLE)
        todo = pending(conn, directory)
        for migration in todo:
            text = migration.sql
            if text.lstrip().startswith(NO_TRANSACTION):
                conn.execute(text)
                conn.execute(RECORD, (migration.name, migration.checksum))
            else:
                with conn.transaction():
                    conn.execute(text)
                    conn.execute(RECORD, (migration.name, migration.checksum))
            migration.status = "applied"
        return todo
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


def ensure_current(conn, *, auto: bool) -> None:
    """Apply pending migrations (auto) or refuse to work on an older schema."""
    files = read_files()
    if _rows(conn, TABLE_EXISTS)[0][0]:
        applied = dict(_rows(conn, "SELECT name, checksum FROM memctl_migrations"))
        if all(applied.get(m.name) == m.checksum for m in files):
            return
    if auto:
        apply(conn)
        return
    behind = pending(conn)
    if behind:
        raise SchemaBehind(
            f"schema is behind: run memctl db migrate ({len(behind)} pending: {', '.join(m.name for m in behind)})"
        )
