"""`memctl backup verify` and `memctl restore`: a backup (memctl.backup.backup) back into a database, checked.

Both first check the dump's size and sha256 against the manifest, then run pg_restore's script through
psql in one transaction (memctl.backup.pgtools.restore_script), as runbooks/restore-database.md does by
hand: objects owned by the restoring role (--no-owner), the `vector` extension left as it is or created
if missing, memctl's schema made if missing.

Verify restores into a scratch database it creates (CREATE DATABASE: the role needs CREATEDB) or into an
empty database the operator names (--scratch-url), recomputes every table's row count and checksum and
compares them with the manifest, and drops the scratch database.

Restore first writes a safety backup of what is there now into the backup directory (named
memctl-before-restore-*, which rotation never deletes), then, in one transaction: drops memctl's tables,
runs the dump, and compares every table's row count and checksum with the manifest, raising (so
everything rolls back) on any difference. Afterwards the schema is brought up to date (memctl.db.migrate)
and the restore is written into the job log.
"""

from __future__ import annotations

import tempfile
import time
import uuid
import datetime
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from psycopg import sql

from memctl.errors import InvalidInput, MemctlError, SchemaAhead
from memctl.records import jobs
from memctl.backup import backup as backup_mod, backup_file

if TYPE_CHECKING:
    from memctl.db.memory import Memory

JOB = "restore"
SCRATCH_PREFIX = "memctl_verify_"
LOCK_TIMEOUT = (
    "30s"  # how long the restore waits for writers' locks on memctl's tables before giving up
)
DROP_WAIT_S = 30

# Before the dump's script, in its transaction: memctl's tables and functions dropped (a restore; never an
# extension's), its schema made if missing, `vector` created if missing (it needs a superuser on an
# operator's server, where it must already be there).
DROP_TABLES = """
DO $memctl$ DECLARE r record; BEGIN
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c
           WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
             AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                             AND d.deptype = 'e')
  LOOP EXECUTE format('DROP TABLE IF EXISTS %s CASCADE', r.rel); END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS fn FROM pg_proc p  -- memctl's functions (sql/0019), in the dump too
           WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind IN ('f', 'p')
             AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e')
  LOOP EXECUTE format('DROP ROUTINE IF EXISTS %s CASCADE', r.fn); END LOOP;
END $memctl$;
"""
PREPARE = sql.SQL("""
SET LOCAL lock_timeout = {lock_timeout};
SET LOCAL client_min_messages = warning;
{drop}
DO $memctl$ BEGIN
  IF to_regnamespace({schema_name}) IS NULL THEN EXECUTE format('CREATE SCHEMA %I', {schema_name}); END IF;
END $memctl$;
CREATE EXTENSION IF NOT EXISTS vector;
""")
# After the dump's script, in its transaction: each table as the manifest describes it, or an exception.
CHECK = sql.SQL("""
DO $memctl$ DECLARE found_rows bigint; found_sum text; BEGIN
  PERFORM {settings};
  {tables}
END $memctl$;
""")
CHECK_TABLE = sql.SQL(
    "SELECT count(*), "
    + backup_mod.ROW_SUM
    + """ INTO found_rows, found_sum FROM {table} AS t;
  IF found_rows <> {rows} OR found_sum <> {checksum} THEN
    RAISE EXCEPTION 'restored table % differs from the backup manifest: % rows, % expected', {name}, found_rows, {rows};
  END IF;
"""
)
NOTHING = "SELECT 1"  # verify checks after the transaction, in Python, to report every table
CREATE_DATABASE = sql.SQL("CREATE DATABASE {}")
DROP_DATABASE = sql.SQL("DROP DATABASE IF EXISTS {}")


@dataclass
class TableCheck:
    table: str
    rows_expected: int | None
    rows_found: int | None
    checksum_ok: bool

    @property
    def ok(self) -> bool:
        return self.checksum_ok and self.rows_expected == self.rows_found

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "rows_expected": self.rows_expected,
            "rows_found": self.rows_found,
            "checksum": "ok" if self.checksum_ok else "DIFFERS",
            "ok": self.ok,
        }


@dataclass
class Verification:
    file: Path
    manifest: dict
    tables: list[TableCheck] = field(default_factory=list)
    inspected: Any = None  # what verify's `inspect` found in the scratch database
    agents: list[dict] = field(
        default_factory=list
    )  # registered agents whose roles that server lacks (wall.unserved)

    @property
    def tables_ok(self) -> bool:
        return all(t.ok for t in self.tables)

    @property
    def ok(self) -> bool:
        return self.tables_ok and all(a["makes"] for a in self.agents)

    @property
    def failed(self) -> list[str]:
        return [t.table for t in self.tables if not t.ok]


@dataclass
class Restored:
    file: Path
    manifest: dict
    safety: Path | None
    migrations: list[str]
    reapplied: list[dict] = field(
        default_factory=list
    )  # erasures newer than the backup (memctl.backup.erasure)
    agents: dict = field(
        default_factory=dict
    )  # registered agents' roles made here (memctl.db.wall.after_move)

    def to_dict(self) -> dict:
        return {
            "file": str(self.file),
            "created_at": self.manifest["created_at"],
            **self.manifest["records"],
            "safety_backup": str(self.safety) if self.safety else None,
            "migrations_applied": len(self.migrations),
            "erasures_reapplied": self.reapplied,
            "agent_roles_made": self.agents.get("made", []),
        }


def verify(
    conn: Memory,
    url: str,
    path: str | Path,
    *,
    scratch_url: str | None = None,
    inspect: Callable[[Any], Any] | None = None,
) -> Verification:
    """Restore the backup into a scratch database and compare every table with the manifest; `inspect`, given
    a connection to the scratch database, looks at it before it is dropped (its result: .inspected)."""
    from memctl import db
    from memctl.backup import pgtools

    path = Path(path)
    manifest = backup_file.read_manifest(path)
    schema = manifest["server"]["schema"]
    with tempfile.TemporaryDirectory(prefix="memctl-verify.") as work:
        dump = backup_file.extract_dump(path, manifest, Path(work))
        with _scratch(conn, url, scratch_url) as target:
            with db.connect(target) as scratch:
                major = backup_mod.server(scratch)["num"] // 10000
                prepare = _prepare(schema, drop=False).as_string(scratch)
            tools = pgtools.for_restore(major, manifest["pg_dump"]["major"])
            listing = pgtools.listing(tools, dump, Path(work) / "restore.list")
            with pgtools.connection_env(target) as env:
                pgtools.restore_script(
                    tools, dump, listing, env, server_major=major, before=prepare, after=NOTHING
                )
            with db.connect(target) as scratch:
                checked = Verification(
                    path,
                    manifest,
                    _compare(scratch, schema, manifest["tables"]),
                    agents=_unserved(scratch),
                )
                if inspect is not None:
                    checked.inspected = inspect(scratch)
                return checked


def _unserved(scratch) -> list[dict]:
    """The drill's look at agents: each registered one whose role is missing or unusable on the scratch database's
    server, and whether a restore there makes it (memctl.db.wall.unserved)."""
    from memctl.db import wall

    return wall.unserved(scratch)


def verify_backup(
    conn: Memory, url: str, path: str | Path, *, scratch_url: str | None = None
) -> dict:
    """`memctl erasure verify --backup`: the erasure ledger's test (memctl.backup.erasure.find_matches) on a
    backup restored into a scratch database."""
    from memctl.records import erasures
    from memctl.backup import erasure

    entries = erasures.sync(conn)
    key = erasures.load_key(create=False)
    checked = verify(
        conn,
        url,
        path,
        scratch_url=scratch_url,
        inspect=lambda scratch: erasure.find_matches(scratch, entries, key),
    )
    matches, untestable = checked.inspected
    created = datetime.datetime.fromisoformat(checked.manifest["created_at"])
    return {
        "entries": len(entries),
        "matches": matches,
        "untestable": len(untestable),
        "newer_than_backup": [e.summary() for e in entries if e.erased_at > created],
        "backup_created_at": checked.manifest["created_at"],
        "tables_ok": checked.ok,
    }


def _compare(conn: Memory, schema: str, expected: dict[str, dict]) -> list[TableCheck]:
    present = backup_mod.tables(conn)
    found = backup_mod.checksums(
        conn, schema, {name: t["columns"] for name, t in expected.items() if name in present}
    )
    checks = []
    for name in sorted(set(expected) | set(present)):
        want, got = expected.get(name), found.get(name)
        checks.append(
            TableCheck(
                name,
                want["rows"] if want else None,
                got["rows"] if got else None,
                bool(want and got and want["checksum"] == got["checksum"]),
            )
        )
    return checks


class _scratch:
    """The scratch database's URL: one made here and dropped at the end, or the operator's (must be empty)."""

    def __init__(self, conn: Memory, url: str, given: str | None):
        self.conn, self.url, self.given = conn, url, given
        self.name: str | None = None

    def __enter__(self) -> str:
        import psycopg
        from psycopg.conninfo import make_conninfo

        from memctl import db

        if self.given:
            with db.connect(self.given) as scratch:
                if backup_mod.tables(scratch):
                    raise MemctlError(
                        "--scratch-url names a database that has tables in its schema: verify restores "
                        "into an empty database only"
                    )
            return self.given
        self.name = f"{SCRATCH_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            self.conn.execute(CREATE_DATABASE.format(sql.Identifier(self.name)))
        except psycopg.errors.InsufficientPrivilege:
            self.name = None
            raise MemctlError(
                "backup verify restores into a scratch database, and this role may not CREATE DATABASE: "
                "grant it CREATEDB, or create an empty database it owns (with the vector extension) "
                "and give its URL with --scratch-url"
            ) from None
        return make_conninfo(self.url, dbname=self.name)

    def __exit__(self, *exc) -> None:
        if self.name is not None:
            _drop_database(self.conn, self.name)


def _drop_database(conn: Memory, name: str) -> None:
    """DROP DATABASE, waiting out an autovacuum worker still in it (a plain DROP asks it to leave)."""
    import psycopg

    deadline = time.monotonic() + DROP_WAIT_S
    while True:
        try:
            conn.execute(DROP_DATABASE.format(sql.Identifier(name)))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise MemctlError(
                    f"could not drop the scratch database {name}: still in use; drop it by hand"
                ) from None
            time.sleep(0.2)


def _prepare(schema: str, *, drop: bool) -> sql.Composed:
    return PREPARE.format(
        lock_timeout=sql.Literal(LOCK_TIMEOUT),
        drop=sql.SQL(DROP_TABLES if drop else ""),
        schema_name=sql.Literal(schema),
    )


def _check(schema: str, expected: dict[str, dict]) -> sql.Composed:
    settings = sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, true)").format(sql.Literal(k), sql.Literal(v))
        for k, v in backup_mod.SETTINGS
    )
    tables = sql.SQL("\n  ").join(
        CHECK_TABLE.format(
            row=sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in t["columns"]),
            table=sql.Identifier(schema, name),
            rows=sql.Literal(t["rows"]),
            checksum=sql.Literal(t["checksum"]),
            name=sql.Literal(name),
        )
        for name, t in sorted(expected.items())
    )
    return CHECK.format(settings=settings, tables=tables)


def restore(conn: Memory, url: str, path: str | Path, *, directory: Path) -> Restored:
    """Replace memctl's tables with the backup's, after a safety backup of what is there now into DIRECTORY."""
    from memctl.db import migrate
    from memctl.records import erasures
    from memctl.backup import erasure, pgtools

    path = Path(path)
    manifest = backup_file.read_manifest(path)
    backup_mod.refuse_cluster(conn, "a restore")
    info = backup_mod.server(conn)
    schema, major = manifest["server"]["schema"], info["num"] // 10000
    if schema != info["schema"]:
        raise InvalidInput(
            f"{path} holds memctl's schema {schema!r}, this database's is {info['schema']!r}: "
            "restore it where memctl uses the same schema (search_path)"
        )
    made = manifest.get("migration")
    if made and made not in {m.name for m in migrate.read_files()}:  # before anything is replaced
        raise SchemaAhead(
            f"{path} was taken from a memory whose schema is at {made} (memctl "
            f"{manifest.get('memctl_version', '?')}), which this memctl does not know: restore it with "
            "that memctl or a newer one (pip install -U memctl)"
        )
    with tempfile.TemporaryDirectory(prefix="memctl-restore.") as work:
        dump = backup_file.extract_dump(
            path, manifest, Path(work)
        )  # a damaged backup stops here, nothing changed
        tools = pgtools.for_restore(major, manifest["pg_dump"]["major"])
        listing = pgtools.listing(tools, dump, Path(work) / "restore.list")
        safety = None
        if backup_mod.tables(conn):
            safety = backup_mod.take(
                conn, url, directory, prefix=backup_mod.SAFETY_PREFIX, record=False
            ).path
        # The erasure ledger, read before the table is replaced by the backup's older one: every entry newer than
        # the backup is re-applied in the same transaction, after the check (memctl.backup.erasure).
        ledger = erasures.sync(conn)
        newer = erasure.newer_than(ledger, manifest["created_at"])
        key = erasures.load_key(create=False)
        before = _prepare(schema, drop=True).as_string(conn)
        after = _check(schema, manifest["tables"]).as_string(conn) + erasure.reapply_sql(
            conn, schema, newer, key
        )
        with pgtools.connection_env(url) as env:
            try:
                said = pgtools.restore_script(
                    tools, dump, listing, env, server_major=major, before=before, after=after
                )
            except MemctlError as exc:
                kept = (
                    f"; nothing was changed (safety backup: {safety})"
                    if safety
                    else "; nothing was changed"
                )
                raise MemctlError(f"restore of {path} failed: {exc}{kept}") from None
    from memctl import places

    with places.key_for_migrations(
        conn, erasures.load_key()
    ):  # a backup older than sql/0024: its lineage rekeyed
        applied = migrate.apply(conn)
    erasures.sync(conn, ledger)  # the table holds every entry again
    erasure.after_restore(conn, newer)
    counts = erasure.reapplied_counts(said)
    restored = Restored(
        path,
        manifest,
        safety,
        [m.name for m in applied],
        [
            {
                "erasure": e.id,
                "op": e.op,
                "what": e.target or e.source,
                "erased_at": e.erased_at.isoformat(),
                **counts.get(e.id, {}),
            }
            for e in newer
        ],
    )
    with jobs.record(conn, JOB) as job:
        job.rows = manifest["records"].get("facts", 0) + manifest["records"].get("episodes", 0)
        job.detail = {
            "file": str(path),
            "safety_backup": str(safety) if safety else None,
            "backup_created_at": manifest["created_at"],
            "migrations": restored.migrations,
            "erasures_reapplied": restored.reapplied,
        }
    restored.agents = _agents(conn)
    return restored


def _agents(conn: Memory) -> dict:
    """Every registered agent's role, memberships and grants, made again here: the roles live in the server, not
    in the dump, and pg_restore --no-acl brings no grant back (memctl.db.wall)."""
    from memctl.db import wall

    return wall.after_move(conn, strict=False)
