"""`memctl backup`: memctl's whole database as one self-checking file, taken while agents keep writing.

Why pg_dump and not `memctl export`: the dump is the database itself (every table, the job log, summary
lineage, vectors of every model, sequences, indexes, the migration record), read by the server's own tool
in one snapshot, and restored by pg_restore into the same or any newer PostgreSQL; the export is memctl's
portable interchange format, which re-admits records through the gate and leaves vectors of models other
than the active one behind. The client programs are the server's own major version or newer
(memctl.backup.pgtools): the embedded server's are the wheel's PostgreSQL 18.

A backup is a tar named memctl-backup-YYYYMMDDTHHMMSSZ.tar holding manifest.json, memctl.dump (pg_dump's
custom format) and SHA256SUMS (the layout, and how it is read back checked: memctl.backup.backup_file).
The manifest holds the time, memctl's, the server's
and pg_dump's versions, the snapshot, the record counts, each table's row count and content checksum,
and the dump's size and sha256.

One snapshot: a REPEATABLE READ, READ ONLY transaction exports its snapshot (pg_export_snapshot), pg_dump
reads with `--snapshot` of it, and the manifest's counts and checksums are computed in the transaction
that holds it, while pg_dump runs. So the manifest describes exactly what the dump holds: every write
committed before `created_at` (the transaction's start) is in it, and no write the snapshot does not
see is, even partly. A table's checksum is the sum of the first 64 bits of md5 of each row's text
(its columns but generated ones, which the server recomputes; settings fixed: UTC, ISO dates), so it
does not depend on the rows' order. The job log's row of the run is written after the snapshot is
taken, so a restored backup never holds a backup that looks still running.

Whole or absent: the dump goes to a private temporary directory in the backup directory, the tar is
written by memctl.files.atomic_write (0600 from the first byte, fsynced, renamed into place, directory
fsynced); a crash leaves a hidden `.memctl-backup-*.tmp`, never a file with a backup's name, and the
next run removes such leftovers once a day old.

Rotation is restic's `forget --keep-daily N --keep-weekly M`: the newest backup of each of the last N
days that have one, and of each of the last M ISO weeks that have one (UTC), are kept, the others
deleted; both 0 keeps everything. Only files named like a backup are considered: the safety backups a
restore writes (memctl-before-restore-*) and those a migration takes first (memctl-before-migrate-*) are never
rotated away.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from psycopg import sql

from memctl import __version__, places
from memctl.errors import DiskFull, MemctlError, no_space
from memctl.records import jobs
from memctl.backup import backup_file

if TYPE_CHECKING:
    from memctl.db.memory import Memory

JOB = "backup"
PREFIX = "memctl-backup-"
SAFETY_PREFIX = "memctl-before-restore-"
MIGRATE_PREFIX = "memctl-before-migrate-"  # taken by `memctl db migrate` (memctl.upgrade.migrating), never rotated
NAME = re.compile(r"^memctl-backup-(\d{8}T\d{6})Z(?:-(\d+))?\.tar$")
STALE_S = 86400  # a leftover temporary file or directory older than this is removed by the next run
NO_SPACE = b"No space left on device"  # strerror(ENOSPC) in a client program's message
LOCK_WAIT = "60s"  # pg_dump waits this long for a table's share lock (a migration may hold it) before failing

SERVER = """
SELECT current_setting('server_version_num')::int AS num, current_setting('server_version') AS version,
       current_database() AS database, current_schema() AS schema
"""
# memctl's tables: every table in its schema but an extension's, with the columns a checksum reads.
TABLES = """
SELECT c.relname AS name, array_agg(a.attname::text ORDER BY a.attnum) AS columns
FROM pg_class c
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                  AND d.deptype = 'e')
GROUP BY c.relname ORDER BY c.relname
"""
MIGRATION = "SELECT max(name) AS name FROM memctl_migrations"
SNAPSHOT = (
    "SELECT pg_export_snapshot() AS id, pg_current_snapshot()::text AS snapshot, now() AS started"
)
# The session settings a row's text depends on, fixed for the checksum wherever it is computed.
SETTINGS = (
    ("TimeZone", "UTC"),
    ("DateStyle", "ISO, YMD"),
    ("IntervalStyle", "postgres"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
)
CANONICAL = sql.SQL("SELECT {}").format(
    sql.SQL(", ").join(
        sql.SQL("set_config({}, {}, true)").format(sql.Literal(k), sql.Literal(v))
        for k, v in SETTINGS
    )
)
ROW_SUM = (
    "coalesce(sum(('x' || left(md5(ROW({row})::text), 16))::bit(64)::bigint::numeric), 0)::text"
)
CHECKSUM = sql.SQL("SELECT count(*) AS rows, " + ROW_SUM + " AS checksum FROM {table} AS t")


@dataclass
class Backup:
    path: Path
    bytes: int
    manifest: dict[str, Any]
    removed: list[str] = field(default_factory=list)

    @property
    def records(self) -> int:
        counts = self.manifest["records"]
        return counts.get("facts", 0) + counts.get("episodes", 0)

    def to_dict(self) -> dict:
        return {
            "file": str(self.path),
            "bytes": self.bytes,
            "created_at": self.manifest["created_at"],
            **self.manifest["records"],
            "sha256": self.manifest["dump"]["sha256"],
            "removed": len(self.removed),
        }


def default_dir(settings) -> Path:
    """[backup] dir, else MEMCTL_HOME/backups."""
    from memctl.db import embedded

    configured = settings.backup.dir if settings is not None else None
    return Path(configured).expanduser() if configured else embedded.memctl_home() / "backups"


def server(conn: Memory) -> dict:
    return conn.one(SERVER)


def tables(conn: Memory) -> dict[str, list[str]]:
    """memctl's tables in its schema, each with the columns its checksum reads."""
    return {row["name"]: list(row["columns"]) for row in conn.execute(TABLES).fetchall()}


def checksum_query(schema: str, table: str, columns: list[str]) -> sql.Composed:
    row = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(c)) for c in columns)
    return CHECKSUM.format(row=row, table=sql.Identifier(schema, table))


def checksums(conn: Memory, schema: str, columns: dict[str, list[str]]) -> dict[str, dict]:
    """Row count and content checksum of each table, in one transaction (the caller's, if one is open)."""
    found = {}
    with conn.transaction():
        conn.execute(CANONICAL)
        for name, cols in sorted(columns.items()):
            row = conn.one(checksum_query(schema, name, cols))
            found[name] = {"rows": int(row["rows"]), "checksum": row["checksum"], "columns": cols}
    return found


def refuse_cluster(conn: Memory, what: str) -> None:
    from memctl.db import cluster

    if cluster.citus_version(conn) is not None:
        raise MemctlError(
            f"{what} of a Citus cluster is not supported: pg_dump reads the coordinator only. "
            "Back up every node with Citus's own procedure (see Citus's documentation on backups)"
        )


def take(
    conn: Memory,
    url: str,
    directory: Path,
    *,
    keep_daily: int = 0,
    keep_weekly: int = 0,
    prefix: str = PREFIX,
    record: bool = True,
) -> Backup:
    """Write a backup of the database `conn` is connected to (at `url`) into `directory`, then rotate.

    `record` writes the run into the job log (outcome, rows = facts + episodes, detail = file and size);
    a restore's safety backup (prefix SAFETY_PREFIX) is not recorded and never rotated.
    """
    from memctl.backup import pgtools

    try:
        refuse_cluster(conn, "a backup")
        info = server(conn)
        tools = pgtools.for_dump(info["num"] // 10000)
        _make_dir(directory)
    except MemctlError as exc:
        if record:
            _record_failure(conn, exc)
        raise
    with pgtools.connection_env(url) as env, _snapshot(url) as (snap, taken):
        with jobs.record(conn, JOB) if record else contextlib.nullcontext(jobs.Job(0, JOB)) as job:
            made = _write(snap, taken, tools, env, info, directory, prefix)
            if prefix == PREFIX:
                made.removed = [p.name for p in rotate(directory, keep_daily, keep_weekly)]
            job.rows = made.records
            job.detail = {"file": str(made.path), "bytes": made.bytes, "removed": made.removed}
    return made


def _record_failure(conn: Memory, exc: MemctlError) -> None:
    """A run refused before it began (no pg_dump, a cluster, a directory it cannot make), in the job log."""
    with contextlib.suppress(MemctlError):
        with jobs.record(conn, JOB):
            raise exc


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise MemctlError(
            f"cannot create the backup directory {directory}: {exc.strerror or exc}"
        ) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise MemctlError(f"cannot write to the backup directory {directory}")


@contextlib.contextmanager
def _snapshot(url: str):
    """A REPEATABLE READ, READ ONLY transaction holding an exported snapshot: (connection, its row)."""
    import psycopg

    from memctl import db

    snap = db.connect(url, autocommit=False)
    try:
        snap.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        snap.read_only = True
        yield snap, snap.execute(SNAPSHOT).fetchone()
    finally:
        with contextlib.suppress(Exception):
            snap.rollback()
        snap.close()


def _write(snap, taken: dict, tools, env: dict, info: dict, directory: Path, prefix: str) -> Backup:
    from memctl import files
    from memctl.backup import pgtools

    schema = info["schema"]
    work = Path(tempfile.mkdtemp(prefix=f".{prefix}", suffix=".tmp", dir=directory))
    try:
        dump = work / backup_file.DUMP
        argv = [
            tools["pg_dump"],
            "-Fc",
            f"--snapshot={taken['id']}",
            "-n",
            sql.Identifier(schema).as_string(snap),
            f"--lock-wait-timeout={LOCK_WAIT}",
            "-f",
            str(dump),
        ]
        proc = _start(argv, env)
        try:  # while pg_dump reads the same snapshot
            sums = checksums(snap, schema, tables(snap))
            migration = _migration(snap, sums)
            _, stderr = proc.communicate()
        except (
            BaseException
        ):  # an error, or SIGINT/SIGTERM (memctl.interrupts): no pg_dump left running
            proc.kill()
            proc.wait()
            raise
        if proc.returncode != 0:
            if NO_SPACE in stderr:
                raise DiskFull.at(directory, "pg_dump could not write the dump")
            raise pgtools.failure("pg_dump", stderr)
        manifest = _manifest(taken, info, tools, sums, migration, dump)
        path = _free_name(directory, prefix, taken["started"])
        try:
            with files.atomic_write(path, text=False) as handle:
                backup_file.write(handle, manifest, dump)
        except OSError as exc:
            if no_space(exc):
                raise DiskFull.at(directory, f"cannot write {path.name}") from None
            raise MemctlError(f"cannot write {path}: {exc.strerror or exc}") from None
        return Backup(path, path.stat().st_size, manifest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _start(argv: list[str], env: dict):
    import subprocess

    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _migration(snap, sums: dict) -> str | None:
    return snap.execute(MIGRATION).fetchone()["name"] if "memctl_migrations" in sums else None


def _manifest(
    taken: dict, info: dict, tools, sums: dict, migration: str | None, dump: Path
) -> dict:
    digest = hashlib.sha256()
    with open(dump, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {
        "format": backup_file.FORMAT,
        "version": backup_file.VERSION,
        "created_at": taken["started"].astimezone(datetime.timezone.utc).isoformat(),
        "snapshot": taken["snapshot"],
        "memctl_version": __version__,
        "server": {
            "version": info["version"],
            "version_num": info["num"],
            "database": info["database"],
            "schema": info["schema"],
        },
        "pg_dump": {"version": tools.version, "major": tools.major},
        "migration": migration,
        "records": {name: sums[name]["rows"] for name in places.MEMORY_TABLES if name in sums},
        "tables": sums,
        "dump": {
            "name": backup_file.DUMP,
            "format": "custom",
            "bytes": dump.stat().st_size,
            "sha256": digest.hexdigest(),
        },
    }


def _free_name(directory: Path, prefix: str, when: datetime.datetime) -> Path:
    stamp = when.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path, n = directory / f"{prefix}{stamp}.tar", 0
    while path.exists():
        n += 1
        path = directory / f"{prefix}{stamp}-{n}.tar"
    return path


# --- rotation -------------------------------------------------------------------------------------


def backups(directory: Path) -> list[tuple[Path, datetime.datetime]]:
    """The backups in DIRECTORY by the time in their names, newest first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            match = NAME.match(entry.name)
            if match and entry.is_file(follow_symlinks=False):
                when = datetime.datetime.strptime(match.group(1), "%Y%m%dT%H%M%S").replace(
                    tzinfo=datetime.timezone.utc
                )
                found.append((Path(entry.path), when, int(match.group(2) or 0)))
    return [(p, w) for p, w, _ in sorted(found, key=lambda b: (b[1], b[2]), reverse=True)]


def kept(
    found: list[tuple[Path, datetime.datetime]], keep_daily: int, keep_weekly: int
) -> set[Path]:
    """restic's forget --keep-daily/--keep-weekly over backups newest first: the newest of each of the last
    `keep_daily` days that have one, and of each of the last `keep_weekly` ISO weeks that have one."""
    keep: set[Path] = set()
    for count, bucket in (
        (keep_daily, lambda t: t.date()),
        (keep_weekly, lambda t: t.isocalendar()[:2]),
    ):
        last, n = None, 0
        for path, when in found:
            if n >= count:
                break
            if bucket(when) != last:
                keep.add(path)
                last, n = bucket(when), n + 1
    return keep


def rotate(directory: Path, keep_daily: int, keep_weekly: int) -> list[Path]:
    """Delete the backups the policy does not keep (none when both are 0) and stale temporary leftovers."""
    _clean_leftovers(directory)
    if keep_daily == 0 and keep_weekly == 0:
        return []
    found = backups(directory)
    keep = kept(found, keep_daily, keep_weekly)
    removed = []
    for path, _ in found:
        if path not in keep:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            removed.append(path)
    if removed:
        from memctl import files

        files.fsync_dir(directory)
    return removed


def _clean_leftovers(directory: Path) -> None:
    """Temporary files and directories of runs that crashed (hidden, named *.tmp), once a day old."""
    limit = time.time() - STALE_S
    for entry in os.scandir(directory):
        name = entry.name
        if not (
            name.startswith((f".{PREFIX}", f".{SAFETY_PREFIX}", f".{MIGRATE_PREFIX}"))
            and name.endswith(".tmp")
        ):
            continue
        with contextlib.suppress(OSError):
            if entry.stat(follow_symlinks=False).st_mtime < limit:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
