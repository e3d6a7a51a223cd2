"""What the server offers memctl: PostgreSQL and pgvector versions, and who may create the extension.

memctl runs as a role that owns its database and nothing more. The one step such
a role usually cannot take is `CREATE EXTENSION vector`: pgvector's control file
is not `trusted`, so a superuser creates it once per database (or once in
template1, which databases created later copy). `preflight` checks this before
`db migrate` changes anything and, when the role cannot go on, says exactly what a
superuser must run instead of PostgreSQL's bare "permission denied".

Versions: PostgreSQL 15 to 18 (measured: 18.6 embedded, Debian's 15.20);
memctl's SQL uses nothing newer than PostgreSQL 15. pgvector 0.8.0 or newer:
search sets `hnsw.iterative_scan` (added in 0.8.0); without iterative scan a
filtered vector search returns too few rows (measured at 100k rows, a filter to
10% of rows: 4 of 10 requested rows on average). `db migrate` refuses an older
pgvector; `version_warnings` reports it for `status`.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING

from memctl.errors import MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

MIN_SERVER = 15
MAX_SERVER = 18
MIN_PGVECTOR = (0, 8, 0)
EXTENSION = "vector"

SERVER = "SELECT current_setting('server_version_num')::int AS num, current_setting('server_version') AS text"
INSTALLED = "SELECT extversion FROM pg_extension WHERE extname = %s"
AVAILABLE = """
SELECT a.default_version, v.superuser, v.trusted
FROM pg_available_extensions a
LEFT JOIN pg_available_extension_versions v ON v.name = a.name AND v.version = a.default_version
WHERE a.name = %s
"""
RIGHTS = """
SELECT current_user AS role, current_database() AS database,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS superuser,
       has_database_privilege(current_database(), 'CREATE') AS database_create,
       current_schema() AS schema,
       current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE') AS schema_create
"""


class ServerRefused(MemctlError):
    """The server cannot hold memctl's schema as it is: too old, or a step only a superuser can take."""


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """'0.8.6' -> (0, 8, 6); '0.8.0-dev' -> (0, 8, 0); None for None or text without a number."""
    if not text:
        return None
    match = re.match(r"\d+(?:\.\d+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def _text(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


def _one(conn: Memory, query: str, params=None) -> dict | None:
    from psycopg.rows import dict_row

    return conn.cursor(row_factory=dict_row).execute(query, params).fetchone()


def server_version(conn: Memory) -> tuple[int, str]:
    """(server_version_num, server_version): (180006, '18.6')."""
    row = _one(conn, SERVER)
    assert row is not None
    return row["num"], row["text"]


def pgvector_version(conn: Memory) -> tuple[int, ...] | None:
    """The version of the vector extension created in this database, or None when it is not created."""
    row = _one(conn, INSTALLED, (EXTENSION,))
    return parse_version(row["extversion"]) if row else None


def available_pgvector(conn: Memory) -> dict | None:
    """What the server could create: {'version', 'superuser', 'trusted'}, or None when pgvector is not installed."""
    row = _one(conn, AVAILABLE, (EXTENSION,))
    if row is None:
        return None
    return {
        "version": parse_version(row["default_version"]),
        "superuser": row["superuser"],
        "trusted": row["trusted"],
    }


def rights(conn: Memory) -> dict:
    """This role and database: superuser?, CREATE on the database, CREATE on the current schema."""
    row = _one(conn, RIGHTS)
    assert row is not None
    return row


# ---------------------------------------------------------------------- decisions (pure)


def server_problem(version_num: int, text: str) -> str | None:
    """Why memctl refuses this PostgreSQL, or None."""
    if version_num // 10000 < MIN_SERVER:
        return (
            f"PostgreSQL {text} is too old: memctl needs PostgreSQL {MIN_SERVER} or newer "
            f"(supported: {MIN_SERVER} to {MAX_SERVER}); upgrade the server, or leave --database-url "
            "unset to use the embedded PostgreSQL 18"
        )
    return None


def server_warning(version_num: int, text: str) -> str | None:
    if version_num // 10000 > MAX_SERVER:
        return (
            f"PostgreSQL {text} is newer than the versions memctl supports ({MIN_SERVER} to "
            f"{MAX_SERVER}): not tested"
        )
    return None


def pgvector_problem(version: tuple[int, ...] | None) -> str | None:
    """Why this pgvector is not enough for memctl, or None (also None for 'not created': see preflight)."""
    if version is None or version >= MIN_PGVECTOR:
        return None
    return (
        f"pgvector {_text(version)} is older than {_text(MIN_PGVECTOR)}: it has no iterative index scan "
        "(hnsw.iterative_scan), which memctl's search sets, and without it a filtered vector search returns "
        "too few rows (measured: 4 of 10 at a filter to 10% of rows)"
    )


def upgrade_path(database: str, created: bool, available: tuple[int, ...] | None = None) -> str:
    """How to reach MIN_PGVECTOR: install a newer pgvector unless `available` already is, then update."""
    if created and available is not None and available >= MIN_PGVECTOR:
        return (
            f"the server already has pgvector {_text(available)}: as a superuser connected to database "
            f'"{database}", run ALTER EXTENSION vector UPDATE;'
        )
    steps = (
        f"install pgvector {_text(MIN_PGVECTOR)} or newer on the server (the distribution's package, e.g. "
        "postgresql-NN-pgvector, or from source: make && make install with PG_CONFIG set to that server's "
        "pg_config), restart sessions"
    )
    if created:
        return f'{steps}, then as a superuser connected to database "{database}": ALTER EXTENSION vector UPDATE;'
    return steps


def missing_extension(r: dict, available: dict | None) -> str | None:
    """What must happen before memctl can create its schema when `vector` is not created; None if memctl may."""
    database, role = r["database"], r["role"]
    if available is None:
        return (
            f"pgvector is not installed on this server: install pgvector {_text(MIN_PGVECTOR)} or newer "
            "(the distribution's package, e.g. postgresql-NN-pgvector; Debian 12 has none: build it from source "
            "with make && make install, PG_CONFIG set to the server's pg_config), then as a superuser run, "
            f'connected to database "{database}":\n'
            f"    CREATE EXTENSION vector;\n"
            f"and run memctl db migrate again"
        )
    problem = pgvector_problem(available["version"])
    if problem:
        return f"{problem}; {upgrade_path(database, created=False)}"
    may_create = r["superuser"] or (available["trusted"] and r["database_create"])
    if may_create:
        return None
    return (
        f'the pgvector extension is not created in database "{database}", and role "{role}" may not create '
        "it (pgvector needs a superuser). Ask a superuser to run, connected to that database "
        f"(psql -d {shlex.quote(database)}):\n"
        f"    CREATE EXTENSION vector;\n"
        "(or once in template1, so databases created later have it: psql -d template1 -c 'CREATE EXTENSION "
        "vector;'), then run memctl db migrate again"
    )


def schema_problem(r: dict) -> str | None:
    if r["schema_create"]:
        return None
    where = f'schema "{r["schema"]}"' if r["schema"] else "any schema on its search_path"
    return (
        f'role "{r["role"]}" may not create tables in {where} of database "{r["database"]}": memctl\'s role '
        f'should own its database (as a superuser: ALTER DATABASE "{r["database"]}" OWNER TO "{r["role"]}"; '
        f"on PostgreSQL 15+ the owner may create in schema public), or be granted CREATE on the schema"
    )


# ---------------------------------------------------------------------- checks against a connection


def preflight(conn: Memory, *, schema_changes: bool) -> list[str]:
    """Refuse (ServerRefused) what `db migrate` cannot fix itself; returns warnings to show once.

    `schema_changes`: migrations are pending, so the role must be able to create tables.
    """
    num, text = server_version(conn)
    problem = server_problem(num, text)
    if problem:
        raise ServerRefused(problem)
    installed = pgvector_version(conn)
    r = rights(conn)
    if installed is None:
        problem = missing_extension(r, available_pgvector(conn))
    else:
        problem = pgvector_problem(installed)
        if problem:
            available = (available_pgvector(conn) or {}).get("version")
            problem = f"{problem}; {upgrade_path(r['database'], created=True, available=available)}"
    if problem:
        raise ServerRefused(problem)
    if schema_changes:
        problem = schema_problem(r)
        if problem:
            raise ServerRefused(problem)
    return [w for w in (server_warning(num, text),) if w]


# ALTER EXTENSION ... UPDATE is allowed to the extension's owner (or a superuser); pgvector is not trusted, so
# on an operator's server it is usually the superuser's.
MAY_UPDATE = """
SELECT pg_has_role(e.extowner, 'USAGE') OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS may
FROM pg_extension e WHERE e.extname = %s
"""
UPDATE = "ALTER EXTENSION vector UPDATE"


def pgvector_behind(conn: Memory) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(created, available) when the server has a newer pgvector than the one created here; else None."""
    installed = pgvector_version(conn)
    available = (available_pgvector(conn) or {}).get("version")
    if installed is None or available is None or available <= installed:
        return None
    return installed, available


def behind_message(found: tuple[tuple[int, ...], tuple[int, ...]], database: str) -> str:
    installed, available = found
    return (
        f"pgvector {_text(installed)} is created in this database, and the server has {_text(available)}: "
        f"memctl db migrate updates it where its role may (the extension's owner); else a superuser runs, "
        f'connected to database "{database}": ALTER EXTENSION vector UPDATE;'
    )


def update_pgvector(conn: Memory) -> str | None:
    """ALTER EXTENSION vector UPDATE where this role may; what happened, in a line (None: nothing to do)."""
    found = pgvector_behind(conn)
    if found is None:
        return None
    database = rights(conn)["database"]
    if not (_one(conn, MAY_UPDATE, (EXTENSION,)) or {}).get("may"):
        return behind_message(found, database)
    conn.execute(UPDATE)
    now = pgvector_version(conn)
    assert now is not None  # just updated
    return f'pgvector updated in database "{database}": {_text(found[0])} -> {_text(now)}'


def version_warnings(conn: Memory) -> list[str]:
    """For `status`: the server or pgvector version memctl does not support or was not measured on."""
    num, text = server_version(conn)
    found = [w for w in (server_problem(num, text), server_warning(num, text)) if w]
    installed = pgvector_version(conn)
    if installed is None:
        found.append(
            "the pgvector extension is not created in this database: run memctl db migrate"
        )
    else:
        problem = pgvector_problem(installed)
        if problem:
            available = (available_pgvector(conn) or {}).get("version")
            found.append(
                f"{problem}; {upgrade_path(rights(conn)['database'], created=True, available=available)}"
            )
        else:
            behind = pgvector_behind(conn)
            if behind is not None:
                found.append(behind_message(behind, rights(conn)["database"]))
    return found
