"""The agents' wall: the PostgreSQL roles that carry agents' rights, and what the server lets those roles do.

An agent registered in memctl's registry (memctl.records.agents) has a role of its own, a member of two
group roles that carry its grants: READERS (SELECT on the memory tables; membership is what makes a role
an agent's) and WRITERS (INSERT and UPDATE by column; a --read-only agent is not a member). Row-level
security (sql/0019, sql/0023) keeps it to its rows. This module makes and checks what lives outside the
tables: the roles and memberships (cluster-wide, so a restore onto another server must make them again:
ensure()), the grants (pg_restore --no-acl drops them: grant()), and the server's defaults that would
let an agent's own SQL past its rows or against others (harden(): TEMP, CREATE, large objects, advisory
locks, assuming a group). What a role may not change here is returned as a Gap: what stays open, and
the statement a DBA runs. docs/agents.md "Threat model" says what an agent's role may still do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from memctl.errors import MemctlError

if TYPE_CHECKING:
    from memctl.db.memory import Memory

READERS = "memctl_agents"
WRITERS = "memctl_agents_write"
GROUPS = (READERS, WRITERS)
SET_OPTION_VERSION = 160000  # GRANT ... WITH SET FALSE: a membership for grants only, not assumable


class AgentsUnsupported(MemctlError):
    """Agents under row-level security are not offered here (Citus; a role without CREATEROLE)."""


ME = "SELECT current_user AS me, current_setting('server_version_num')::int AS version"
ROLE_EXISTS = "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) AS yes"
CAN_CREATE_ROLES = (
    "SELECT rolcreaterole OR rolsuper AS yes FROM pg_roles WHERE rolname = current_user"
)
IS_MEMBER = "SELECT pg_has_role(%s, %s, 'MEMBER') AS yes"
GRANT_ALL = "SELECT memctl_grant_all() AS done"
ANY_AGENT = "SELECT EXISTS (SELECT 1 FROM agents) AS yes"
# Each registered agent's role as the server has it: missing, outside a group it needs, or not assumable by us.
ROLES = """
SELECT a.name, a.role_name AS role, a.read_only, to_jsonb(a)->>'login_at' IS NOT NULL AS had_login,
       r.oid IS NULL AS missing,
       r.oid IS NOT NULL AND (g.oid IS NULL OR NOT pg_has_role(r.oid, g.oid, 'MEMBER')) AS no_readers,
       r.oid IS NOT NULL AND NOT a.read_only AND (w.oid IS NULL OR NOT pg_has_role(r.oid, w.oid, 'MEMBER'))
           AS no_writers,
       r.oid IS NOT NULL AND NOT pg_has_role(current_user, r.oid, 'MEMBER') AS not_ours
FROM agents a LEFT JOIN pg_roles r ON r.rolname = a.role_name
LEFT JOIN pg_roles g ON g.rolname = 'memctl_agents' LEFT JOIN pg_roles w ON w.rolname = 'memctl_agents_write'
ORDER BY a.name
"""


def _yes(conn: Memory, query, params=()) -> bool:
    return bool(conn.one(query, params)["yes"])


def _me(conn: Memory) -> tuple[str, int]:
    row = conn.one(ME)
    return row["me"], row["version"]


# ---------------------------------------------------------------------------
# Roles


def role_sql(agent_role: str, read_only: bool, owner: str, version: int) -> list[sql.Composed]:
    """What a role with CREATEROLE runs for an agent: the groups, the agent's role (NOLOGIN), its memberships
    (on PostgreSQL 16+ WITH SET FALSE: inherited, never assumable), and the owner's membership in it."""
    groups = [READERS] + ([] if read_only else [WRITERS])
    statements = []
    for group in (READERS, WRITERS, agent_role):
        statements.append(
            sql.SQL(
                "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
                "CREATE ROLE {role} NOLOGIN; END IF; END $$"
            ).format(name=sql.Literal(group), role=sql.Identifier(group))
        )
    options = sql.SQL(" WITH INHERIT TRUE, SET FALSE" if version >= SET_OPTION_VERSION else "")
    statements.append(
        sql.SQL("GRANT {} TO {}{}").format(
            sql.SQL(", ").join(map(sql.Identifier, groups)), sql.Identifier(agent_role), options
        )
    )
    if read_only:  # a role once read-write, registered again read-only
        statements.append(
            sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(WRITERS), sql.Identifier(agent_role))
        )
    statements.append(
        sql.SQL("GRANT {} TO {}").format(sql.Identifier(agent_role), sql.Identifier(owner))
    )
    return statements


def statements_for(conn: Memory, agent_role: str, read_only: bool) -> list[sql.Composed]:
    owner, version = _me(conn)
    return role_sql(agent_role, read_only, owner, version)


def make_roles(conn: Memory, name: str, role: str, read_only: bool) -> None:
    """Make the agent's role and memberships, unless a DBA made the role (_check_roles says what is missing)."""
    owner, version = _me(conn)
    if not _yes(conn, CAN_CREATE_ROLES):
        if not _yes(conn, ROLE_EXISTS, (role,)):
            raise AgentsUnsupported(
                f"the role {owner} may not create roles: a superuser runs `ALTER ROLE {owner} CREATEROLE`, or a DBA "
                f"runs what `memctl agent add {name} --print-sql` prints, then `memctl agent add {name}` again"
            )
        return
    for statement in role_sql(role, read_only, owner, version):
        try:
            with conn.transaction():
                conn.execute(statement)
        except (
            psycopg.errors.InsufficientPrivilege
        ) as e:  # PostgreSQL 16+: groups another role made
            raise AgentsUnsupported(
                f"the role {owner} may not grant the agents' roles ({e.diag.message_primary}): a superuser runs "
                f"`GRANT {READERS}, {WRITERS} TO {owner} WITH ADMIN OPTION`, or a DBA runs what "
                f"`memctl agent add {name} --print-sql` prints"
            ) from None


def check_roles(conn: Memory, name: str, role: str, read_only: bool) -> None:
    """The owner can assume the role, and the role is in the groups that carry its grants: else what a DBA
    runs (a role made by hand rather than by --print-sql)."""
    owner, _ = _me(conn)
    missing = [
        group
        for group in (READERS,) + (() if read_only else (WRITERS,))
        if not _yes(conn, IS_MEMBER, (role, group))
    ]
    if missing:
        raise AgentsUnsupported(
            f"the role {role} is not in {', '.join(missing)}: a DBA runs `GRANT "
            f"{', '.join(missing)} TO {role}` (`memctl agent add {name} --print-sql` prints "
            "every statement)"
        )
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            raise _Rollback
    except _Rollback:
        return
    except psycopg.Error:
        raise AgentsUnsupported(
            f"the role {owner} cannot SET ROLE {role}: a DBA runs `GRANT {role} TO {owner}` "
            f"(`memctl agent add {name} --print-sql` prints every statement)"
        ) from None


class _Rollback(Exception):
    pass


# ---------------------------------------------------------------------------
# Grants and the server's defaults


def grant(conn: Memory) -> None:
    """Every grant the agents' groups have (sql/0023 memctl_grant_all: the memory tables, by column for writes;
    the functions policies call; nothing of memctl's for PUBLIC), then harden(). Run by `agent add`, at every
    agent server's start, when a model's vector table is made, and by ensure(). Nothing is granted until a
    group exists (no agent was ever registered on this server)."""
    conn.execute(GRANT_ALL)
    if _yes(conn, ANY_AGENT):
        harden(conn)


@dataclass
class Gap:
    """A default of the server an agent's role keeps, because this role may not change it."""

    what: str
    needs: str  # who may close it
    statement: str  # what they run

    def __str__(self) -> str:
        return f"{self.what} (needs {self.needs}: {self.statement})"


@dataclass
class _Measure:
    what: str
    needs: str
    open_sql: str  # true while the default stands
    close: sql.Composable  # what closes it


_LO_CREATE = (
    "lo_creat(integer)",
    "lo_create(oid)",
    "lo_from_bytea(oid, bytea)",
    "lo_import(text)",
    "lo_import(text, oid)",
)
_ADVISORY = tuple(
    f"{name}({args})"
    for name in (
        "pg_advisory_lock",
        "pg_advisory_lock_shared",
        "pg_advisory_xact_lock",
        "pg_advisory_xact_lock_shared",
        "pg_try_advisory_lock",
        "pg_try_advisory_lock_shared",
        "pg_try_advisory_xact_lock",
        "pg_try_advisory_xact_lock_shared",
    )
    for args in ("bigint", "integer, integer")
)


def _functions_open(names: tuple[str, ...]) -> str:
    return " OR ".join(
        f"has_function_privilege('public', 'pg_catalog.{n}', 'EXECUTE')" for n in names
    )


def _revoke_functions(names: tuple[str, ...]) -> sql.Composable:
    return sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(
        sql.SQL(", ").join(sql.SQL("pg_catalog.") + sql.SQL(n) for n in names)
    )


def _measures(conn: Memory) -> list[_Measure]:
    db = sql.Identifier(conn.info.dbname)
    schema = sql.Identifier(conn.one("SELECT current_schema() AS s")["s"])
    return [
        _Measure(
            "TEMP on this database is PUBLIC's (an agent's session may create temporary tables and functions)",
            "the database's owner",
            "SELECT has_database_privilege('public', current_database(), 'TEMPORARY') AS yes",
            sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(db),
        ),
        _Measure(
            "CREATE on memctl's schema is PUBLIC's",
            "the schema's owner",
            "SELECT has_schema_privilege('public', current_schema(), 'CREATE') AS yes",
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM PUBLIC").format(schema),
        ),
        _Measure(
            "large objects may be created by any role (one the agent owns outlives it unless revoke drops it)",
            "a superuser",
            f"SELECT {_functions_open(_LO_CREATE)} AS yes",
            _revoke_functions(_LO_CREATE),
        ),
        _Measure(
            "advisory locks may be taken by any role (memctl's session locks name their holder instead)",
            "a superuser",
            f"SELECT {_functions_open(_ADVISORY)} AS yes",
            _revoke_functions(_ADVISORY),
        ),
    ]


def _assumable(conn: Memory) -> list[sql.Composed]:
    """On PostgreSQL 16+: the agents' memberships in a group that may still be assumed with SET ROLE, and the
    GRANTs that keep them inherited but not assumable (on 15 a group assumed sees nothing: the policies)."""
    if _me(conn)[1] < SET_OPTION_VERSION:
        return []
    rows = conn.execute("""
        SELECT g.rolname AS grp, r.rolname AS role FROM pg_auth_members m
        JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles r ON r.oid = m.member
        JOIN agents a ON a.role_name = r.rolname
        WHERE g.rolname IN ('memctl_agents', 'memctl_agents_write') AND m.set_option""").fetchall()
    return [
        sql.SQL("GRANT {} TO {} WITH INHERIT TRUE, SET FALSE").format(
            sql.Identifier(row["grp"]), sql.Identifier(row["role"])
        )
        for row in rows
    ]


def harden(conn: Memory) -> list[Gap]:
    """Close what this role may of the defaults an agent's role would use (revoked from PUBLIC: TEMP, CREATE on
    the schema, creating large objects, advisory locks; the groups made unassumable); the rest, as Gaps."""
    gaps = []
    for measure in _measures(conn):
        if not _yes(conn, measure.open_sql):
            continue
        _try(
            conn, measure.close
        )  # a role without the right is refused, or revokes nothing (a warning)
        if _yes(conn, measure.open_sql):
            gaps.append(Gap(measure.what, measure.needs, measure.close.as_string(conn)))
    for statement in _assumable(conn):
        _try(conn, statement)
    return gaps + _assumable_gaps(conn)


def _assumable_gaps(conn: Memory) -> list[Gap]:
    return [
        Gap(
            "an agent may SET ROLE to its group (which sees and writes nothing: the policies)",
            "the role that granted the membership",
            s.as_string(conn),
        )
        for s in _assumable(conn)
    ]


def gaps(conn: Memory) -> list[Gap]:
    """What harden() could not close, without changing anything."""
    return [
        Gap(m.what, m.needs, m.close.as_string(conn))
        for m in _measures(conn)
        if _yes(conn, m.open_sql)
    ] + _assumable_gaps(conn)


# ---------------------------------------------------------------------------
# Every registered agent's role, on this server


def _roles(conn: Memory) -> list[dict]:
    rows = []
    for row in conn.execute(ROLES).fetchall():
        row["problem"] = (
            "its role does not exist"
            if row["missing"]
            else f"its role is not in {READERS}"
            if row["no_readers"]
            else f"its role is not in {WRITERS}"
            if row["no_writers"]
            else "memctl's role may not assume it"
            if row["not_ours"]
            else None
        )
        rows.append(row)
    return rows


def broken(conn: Memory) -> list[dict]:
    """Registered agents without a working role here: {name, role, problem}. A restore or an import onto
    another server brings the registry back but not the roles, which live in the server (ensure())."""
    return [
        {k: row[k] for k in ("name", "role", "problem")} for row in _roles(conn) if row["problem"]
    ]


def ensure(conn: Memory) -> dict:
    """Make every registered agent's role, memberships and grants again where they are missing (after a restore or
    an import onto another server, a `db upgrade`), and harden(). Raises AgentsUnsupported, with the statements a
    DBA runs, when a role is missing and this role may not make it: the agents are not served until then.
    Returns {made: [role...], logins: [agent...] (had a password: `agent login` issues a new one), gaps: [...]}"""
    owner, version = _me(conn)
    todo = [
        (row, role_sql(row["role"], row["read_only"], owner, version))
        for row in _roles(conn)
        if row["problem"]
    ]
    if todo and not _yes(conn, CAN_CREATE_ROLES):
        printed = "".join(s.as_string(conn) + ";\n" for _, statements in todo for s in statements)
        said = ", ".join(f"{row['name']}: {row['problem']}" for row, _ in todo)
        raise AgentsUnsupported(
            f"{len(todo)} registered agent(s) have no working role on this server ({said}) and "
            f"the role {owner} may not create roles: a DBA runs these statements, then memctl "
            f"serves them again:\n{printed}"
        )
    made, logins = [], []
    for row, statements in todo:
        for statement in statements:
            try:
                with conn.transaction():
                    conn.execute(statement)
            except psycopg.errors.InsufficientPrivilege as e:
                raise AgentsUnsupported(
                    f"agent {row['name']!r}: {e.diag.message_primary}; a DBA runs: "
                    f"{statement.as_string(conn)}"
                ) from None
        made.append(row["role"])
        if row["had_login"] and row["missing"]:
            logins.append(row["name"])
    conn.execute(GRANT_ALL)
    gaps_left = harden(conn) if _yes(conn, ANY_AGENT) else []
    return {"made": made, "logins": logins, "gaps": [str(g) for g in gaps_left]}


def after_move(conn: Memory, *, strict: bool) -> dict:
    """ensure() once memory came from elsewhere (a restore, an import, an upgrade), where agents are registered.
    `strict`: a refusal (roles this role may not make) raises; else its message is returned as `unserved`."""
    if not _yes(conn, ANY_AGENT):
        return {"made": [], "logins": [], "gaps": []}
    try:
        return ensure(conn)
    except AgentsUnsupported as exc:
        if strict:
            raise
        return {"made": [], "logins": [], "gaps": [], "unserved": str(exc)}


def unserved(conn: Memory) -> list[dict]:
    """For the restore drill (`backup verify`), on the restored scratch database: each registered agent without a
    working role on that server, and whether this role would make it there (`makes`: a restore does; else a DBA
    must, and the restore would refuse to report success). A backup from before agents: []."""
    if not _yes(conn, "SELECT to_regclass('agents') IS NOT NULL AS yes"):
        return []
    makes = _yes(conn, CAN_CREATE_ROLES)
    return [{**row, "makes": makes} for row in broken(conn)]


def warnings(conn: Memory) -> list[str]:
    """`memctl status`'s warnings: each registered agent without a working role on this server."""
    return [
        f"agent {row['name']!r} has no working role ({row['role']}: {row['problem']}): its calls fail until "
        "`memctl restore`'s step is done again, or a DBA runs what `memctl agent add NAME --print-sql` prints"
        for row in broken(conn)
    ]


# ---------------------------------------------------------------------------
# A login for an agent's own client, and the end of a role


def login(
    conn: Memory,
    role: str,
    verifier: str,
    *,
    connections: int,
    statement_timeout: int,
    idle_timeout: int,
) -> None:
    """Make the agent's role a login role: its password (a SCRAM verifier, so no plain password reaches the server's
    log), a connection limit, and defaults for its sessions' statement and idle-in-transaction timeouts, in ms
    (defaults its client may change: the limit is the server's; retire() ends its sessions)."""
    if not _yes(conn, CAN_CREATE_ROLES):
        owner, _ = _me(conn)
        raise AgentsUnsupported(
            f"the role {owner} may not change roles: a DBA runs `ALTER ROLE {role} LOGIN CONNECTION "
            f"LIMIT {connections}` and sets its password (psql: \\password {role})"
        )
    role_id = sql.Identifier(role)
    with conn.transaction():
        conn.execute(
            sql.SQL("ALTER ROLE {} LOGIN CONNECTION LIMIT {} PASSWORD {}").format(
                role_id, sql.Literal(connections), sql.Literal(verifier)
            )
        )
        for name, value in (
            ("statement_timeout", statement_timeout),
            ("idle_in_transaction_session_timeout", idle_timeout),
        ):
            conn.execute(
                sql.SQL("ALTER ROLE {} SET {} = {}").format(
                    role_id, sql.Identifier(name), sql.Literal(value)
                )
            )


CAN_LOGIN = "SELECT coalesce((SELECT rolcanlogin FROM pg_roles WHERE rolname = %s), false) AS yes"
SESSIONS = "SELECT pid FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()"
TERMINATE = "SELECT pg_terminate_backend(%s) AS done"
OWNED = """
SELECT count(*) FILTER (WHERE d.classid = 'pg_largeobject'::regclass) AS large_objects,
       count(*) FILTER (WHERE d.classid <> 'pg_largeobject'::regclass) AS others
FROM pg_shdepend d JOIN pg_roles r ON r.oid = d.refobjid
WHERE r.rolname = %s AND d.deptype = 'o' AND d.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""
ELSEWHERE = """
SELECT coalesce(array_agg(DISTINCT db.datname ORDER BY db.datname), '{}') AS databases
FROM pg_shdepend d JOIN pg_roles r ON r.oid = d.refobjid JOIN pg_database db ON db.oid = d.dbid
WHERE r.rolname = %s AND d.dbid <> (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def _try(conn: Memory, statement) -> str | None:
    """Run one statement in a savepoint: None, or PostgreSQL's reason it was refused."""
    try:
        with conn.transaction():
            conn.execute(statement)
        return None
    except psycopg.Error as e:
        return e.diag.message_primary or type(e).__name__


def retire(conn: Memory, role: str) -> dict:
    """After an agent is unregistered: no login, its sessions ended, what it owns in this database given to memctl's
    role (a large object it made included) and its privileges dropped, then the role dropped. Where the role
    cannot be dropped (objects in another database, no CREATEROLE), it is left unable to log in and outside the
    groups where this role may do that, and the reason is said. The role, unregistered, reads nothing here either
    way (the policies: a group's member that is no agent registered here sees nothing)."""
    role_id, owner = sql.Identifier(role), sql.Identifier(_me(conn)[0])
    done: dict = {
        "role": role,
        "sessions_ended": 0,
        "large_objects": 0,
        "objects": 0,
        "dropped": False,
        "left": None,
    }
    if not _yes(conn, ROLE_EXISTS, (role,)):
        done["dropped"] = True
        return done
    _try(conn, sql.SQL("ALTER ROLE {} NOLOGIN").format(role_id))
    for row in conn.execute(SESSIONS, (role,)).fetchall():
        if conn.one(TERMINATE, (row["pid"],))["done"]:
            done["sessions_ended"] += 1
    owned = conn.one(OWNED, (role,))
    done["large_objects"], done["objects"] = owned["large_objects"], owned["others"]
    refused = _try(conn, sql.SQL("REASSIGN OWNED BY {} TO {}").format(role_id, owner))
    refused = refused or _try(conn, sql.SQL("DROP OWNED BY {}").format(role_id))
    refused = refused or _try(conn, sql.SQL("DROP ROLE {}").format(role_id))
    if refused is None:
        done["dropped"] = True
        return done
    elsewhere = conn.one(ELSEWHERE, (role,))["databases"]
    for group in GROUPS:
        _try(conn, sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(group), role_id))
    done["left"] = (
        f"it still owns objects in {', '.join(elsewhere)}: there, REASSIGN OWNED BY {role} TO ...; DROP "
        f"OWNED BY {role}; then DROP ROLE {role}"
        if elsewhere
        else f"{refused}: a DBA runs DROP ROLE {role}"
    )
    if _yes(conn, CAN_LOGIN, (role,)):
        done["left"] += f" (it may still log in: ALTER ROLE {role} NOLOGIN first)"
    return done
