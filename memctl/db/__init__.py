"""The database layer; this module holds the connections: which database, one connect(), the schema check.

Its modules: embedded (the bundled server), preflight (what the server offers), migrate, cluster (Citus),
pgservice, locks (the model registry's advisory lock). They import only the base modules (memctl, errors,
config, files, jsonl, redact, model_catalogue) and each other.

Writes go to the primary (resolve, open_database). Commands that only read may go to a
replica named by [database] read_url (resolve_read, open_replica), which is checked, never migrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from memctl import config as config_mod
from memctl.errors import DatabaseUnavailable, SchemaBehind

APPLICATION_NAME = "memctl"


@dataclass
class Target:
    url: str
    embedded: bool
    origin: str


def resolve(url_option: str | None, settings: config_mod.Settings) -> Target:
    """--database-url, else MEMCTL_DATABASE_URL, else the config file, else embedded."""
    if url_option:
        return Target(url_option, False, "--database-url")
    if settings.database_url:
        origin = settings.origins.get(("", "database_url"), "file")
        return Target(settings.database_url, False, origin)
    from memctl.db import embedded

    info = embedded.status()
    return Target(info.url if info.running else "", True, "embedded")


@dataclass
class ReadTarget:
    url: str
    origin: str


def resolve_read(settings: config_mod.Settings) -> ReadTarget | None:
    """[database] read_url, or MEMCTL_READ_DATABASE_URL; None: reads go to the primary."""
    url = settings.get("database", "read_url")
    if not url:
        return None
    return ReadTarget(url, settings.origins.get(("database", "read_url"), "file"))


def connect(url: str, *, vector: bool = False, autocommit: bool = True, timeout: int = 10):
    """An autocommit connection with dict rows; `vector` registers pgvector types."""
    import psycopg
    from psycopg.rows import dict_row

    try:
        conn = psycopg.connect(
            url,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=APPLICATION_NAME,
            connect_timeout=timeout,
        )
    except psycopg.OperationalError as exc:
        message = config_mod.mask_url(str(exc).strip().splitlines()[0] if str(exc).strip() else "connection failed")
        raise DatabaseUnavailable(f"database unavailable: {message}") from None
    if vector:
        register_vector(conn)
    return conn


def register_vector(conn) -> None:
    """Register pgvector's types (imports numpy: only for commands that need vectors)."""
    from pgvector.psycopg import register_vector as register

    try:
        register(conn)
    except Exception:
        pass  # the extension is not installed yet; migration creates it


def open_database(target: Target, *, report: Callable[[str], None] | None = None, vector: bool = False,
                  migrate: bool = True):
    """Connect to the target, starting the embedded server and migrating it as needed."""
    from memctl.db import migrate as migrate_mod

    if target.embedded and not target.url:
        from memctl.db import embedded

        target.url = embedded.start(report=report).url
    try:
        conn = connect(target.url)
    except DatabaseUnavailable:
        if not target.embedded:
            raise
        # Found running while another memctl was still creating its database (or stopped since):
        # wait for that start to finish, then connect once more.
        from memctl.db import embedded

        target.url = embedded.await_start(report=report).url
        conn = connect(target.url)
    if migrate:
        migrate_mod.ensure_current(conn, auto=target.embedded)
    if vector:
        register_vector(conn)
    return conn


def open_replica(target: ReadTarget, *, vector: bool = False):
    """Connect to the read replica and check its schema is current; never migrates (a standby is read-only)."""
    from memctl.db import migrate as migrate_mod

    try:
        conn = connect(target.url)
    except DatabaseUnavailable as exc:
        raise DatabaseUnavailable(f"read replica ({target.origin}): {exc}") from None
    try:
        migrate_mod.ensure_current(conn, auto=False)
    except SchemaBehind as exc:
        conn.close()
        raise SchemaBehind(f"read replica ({target.origin}): {exc} on the primary; the replica has not replayed "
                           "it yet, or read_url is not a replica of this primary") from None
    if vector:
        register_vector(conn)
    return conn
