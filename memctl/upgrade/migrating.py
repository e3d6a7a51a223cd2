"""`memctl db migrate`: a verified backup before a migration touches memory, then the migrations.

A memory is kept for a year and migrated several times in it, so a migration of a database that holds memory
(a row in any memory table) first takes a backup (memctl.backup.backup, into [backup] dir, else
MEMCTL_HOME/backups, named memctl-before-migrate-*, never rotated away) and verifies it: restored into a scratch
database and every table compared with its manifest (memctl.backup.restore.verify), or, where this role may
not create a database, its dump's sha256 and pg_restore's reading of its whole table of contents. A backup that
cannot be taken or does not verify stops the migration before anything changes; `--no-backup` skips it on
purpose. Then pgvector is updated to the server's (ALTER EXTENSION vector UPDATE, where this role may), and the
pending migrations and fix-ups run (memctl.db.migrate.apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from memctl.db import migrate, preflight
from memctl.errors import MemctlError
from memctl.upgrade import plan as plan_mod

if TYPE_CHECKING:
    from memctl.db.memory import Memory

MAY_CREATE_DATABASE = (
    "SELECT rolcreatedb OR rolsuper AS may FROM pg_roles WHERE rolname = current_user"
)


@dataclass
class Outcome:
    todo: list[migrate.Migration] = field(
        default_factory=list
    )  # what ran (or, in a dry run, would run)
    backup: Path | None = None
    backup_dir: Path | None = None  # where a backup goes first (dry run), None when none is needed
    verified: str | None = None
    pgvector: str | None = None
    steps: list[plan_mod.Step] = field(default_factory=list)  # a dry run's plan
    holds_memory: bool = False


def run(
    conn: Memory,
    url: str,
    settings,
    *,
    backup: bool = True,
    dry_run: bool = False,
    report: Callable[[str], None] | None = None,
    directory: Path | None = None,
) -> Outcome:
    """Migrate the database `conn` is connected to (at `url`), a verified backup first when it holds memory."""
    from memctl.backup import backup as backup_mod

    say = report or (lambda _line: None)
    todo = migrate.pending(
        conn, directory
    )  # a schema newer than this memctl, or an edited file, stops here
    behind = preflight.pgvector_behind(conn)
    memory = migrate.holds_memory(conn)
    out = Outcome(todo, holds_memory=memory)
    needs_backup = memory and backup and bool(todo or behind)
    if dry_run:
        out.steps = plan_mod.make(conn, todo)
        out.backup_dir = backup_mod.default_dir(settings) if needs_backup else None
        out.pgvector = (
            preflight.behind_message(behind, preflight.rights(conn)["database"]) if behind else None
        )
        return out
    if needs_backup:
        out.backup, out.verified = take_verified(conn, url, backup_mod.default_dir(settings), say)
    elif memory and (todo or behind):
        say("no backup taken (--no-backup)")
    out.pgvector = preflight.update_pgvector(conn)
    if out.pgvector:
        say(out.pgvector)
    out.todo = apply(conn, directory, report=say, progress=say)
    return out


def apply(conn: Memory, directory: Path | None = None, **options) -> list:
    """migrate.apply with the installation's erasure key given to the migrations that rekey digests (sql/0024)."""
    from memctl import places
    from memctl.write import erased

    with places.key_for_migrations(conn, erased.load_key()):
        return migrate.apply(conn, directory, **options)


def take_verified(
    conn: Memory, url: str, directory: Path, say: Callable[[str], None], prefix: str | None = None
) -> tuple[Path, str]:
    """A backup of the whole database into DIRECTORY, verified; MemctlError (nothing migrated) if either fails.
    `prefix`: its name's (default memctl-before-migrate-; never rotated away)."""
    from memctl.backup import backup as backup_mod

    say(f"taking a backup first: {directory}")
    try:
        made = backup_mod.take(
            conn, url, directory, prefix=prefix or backup_mod.MIGRATE_PREFIX, record=False
        )
    except MemctlError as exc:
        raise MemctlError(
            f"no migration without a backup, and the backup failed: {exc}; nothing was migrated "
            "(memctl db migrate --no-backup skips it, on purpose)"
        ) from None
    try:
        verified = _verify(conn, url, made.path)
    except MemctlError as exc:
        raise MemctlError(
            f"the backup {made.path} does not verify: {exc}; nothing was migrated"
        ) from None
    say(f"backup {made.path} ({made.bytes} bytes): {verified}")
    return made.path, verified


def _verify(conn: Memory, url: str, path: Path) -> str:
    """Restore the backup into a scratch database and compare every table; the file's own checks where this
    role may not create a database."""
    import tempfile

    from memctl.backup import backup_file, pgtools, restore

    if conn.one(MAY_CREATE_DATABASE)["may"]:
        checked = restore.verify(conn, url, path)
        if (
            not checked.tables_ok
        ):  # the copy is whole or not; agents' roles are the server's, not the backup's
            raise MemctlError(f"tables differ from its manifest: {', '.join(checked.failed)}")
        return f"verified: restored into a scratch database, {len(checked.tables)} tables match its manifest"
    manifest = backup_file.read_manifest(path)
    with tempfile.TemporaryDirectory(prefix="memctl-verify.") as work:
        dump = backup_file.extract_dump(
            path, manifest, Path(work)
        )  # its sha256 against the manifest
        tools = pgtools.for_restore(
            manifest["server"]["version_num"] // 10000, manifest["pg_dump"]["major"]
        )
        pgtools.listing(tools, dump, Path(work) / "restore.list")
    return (
        "checked: the dump's sha256 and pg_restore's reading of its contents (this role may not create a "
        "scratch database for a full verify: memctl backup verify FILE --scratch-url URL)"
    )


def version_lines(url: str | None, *, timeout: int = 3) -> list[str]:
    """`memctl --version`: this memctl, the schema it knows, and the database's where it can reach it
    (`url` None: not reached, e.g. an embedded server that is not running, which this never starts)."""
    from memctl import __version__, db

    lines = [f"memctl {__version__}", f"schema {migrate.newest()} (this memctl's newest migration)"]
    if not url:
        return lines + [
            "database not reached: the embedded server is not running (memctl db start)"
        ]
    try:
        with db.connect(url, timeout=timeout) as conn:
            at = migrate.newest_applied(conn)
            _, server = preflight.server_version(conn)
            installed = preflight.pgvector_version(conn)
            available = (preflight.available_pgvector(conn) or {}).get("version")
    except MemctlError as exc:
        return lines + [f"database not reached: {exc}"]
    vector = ".".join(map(str, installed)) if installed else "not created"
    if available and available != installed:
        vector += f" (the server has {'.'.join(map(str, available))})"
    return lines + [
        f"database schema {at or 'none (never migrated)'}",
        f"PostgreSQL {server}",
        f"pgvector {vector}",
    ]
