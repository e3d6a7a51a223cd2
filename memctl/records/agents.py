"""Agents as principals: the registry, each agent's PostgreSQL role, its bearer token (docs/agents.md).

An agent registered here has a role of its own, NOLOGIN, named by role_name_for(): memctl's servers
connect as the owner and assume it with SET ROLE for the agent's statements (assume()). Row-level
security (sql/0019_agents.sql) keeps that role to the agent's own episodes and namespace and the
namespaces it may read; grants give every agent's role what memctl's agent tools use and nothing on
the registry, the job log or the migrations. Two group roles carry the grants, so a table created
later (a model's vector table) is granted once for every agent: memctl_agents (read; membership is
what makes a role an agent's) and memctl_agents_write (write; a --read-only agent is not a member).

A token is shown once, when issued, and stored only as its sha256: a token is 32 random bytes, so a
plain hash cannot be reversed by guessing, and a look-up by hash needs no per-token salt.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import secrets
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from memctl.errors import MemctlError, NotFound, UsageError
from memctl.write import values

READERS = "memctl_agents"
WRITERS = "memctl_agents_write"
ROLE_PREFIX = "memctl_agent_"
MAX_ROLE = 63  # PostgreSQL's NAMEDATALEN - 1, in bytes
TOKEN_PREFIX = "mctk_"
READ_TABLES = ("embedding_models", "blocked_sources")  # what the write gate and search look up


class AgentsUnsupported(MemctlError):
    """Agents under row-level security are not offered here (Citus; a role without CREATEROLE)."""


@dataclass
class Agent:
    name: str
    role: str
    namespace: str
    shared: list[str] = field(default_factory=list)
    read_only: bool = False
    created_at: datetime.datetime | None = None
    token_issued_at: datetime.datetime | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "role": self.role, "namespace": self.namespace, "shared": list(self.shared),
                "read_only": self.read_only, "created_at": self.created_at, "token": self.token_issued_at is not None,
                "token_issued_at": self.token_issued_at}


COLUMNS = ("name, role_name AS role, writes_namespace AS namespace, reads_namespaces AS shared, read_only, created_at, "
           "token_issued_at")
ALL = f"SELECT {COLUMNS} FROM agents ORDER BY name"
ONE = f"SELECT {COLUMNS} FROM agents WHERE name = %s"
BY_TOKEN = f"SELECT {COLUMNS} FROM agents WHERE token_sha256 = %s"
INSERT = """
INSERT INTO agents (name, role_name, writes_namespace, reads_namespaces, read_only) VALUES (%s, %s, %s, %s, %s)
"""
SET_TOKEN = "UPDATE agents SET token_sha256 = %s, token_issued_at = now() WHERE name = %s RETURNING name"
DELETE = "DELETE FROM agents WHERE name = %s RETURNING role_name"
ROLE_EXISTS = "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) AS yes"
CAN_CREATE_ROLES = "SELECT rolcreaterole OR rolsuper AS yes FROM pg_roles WHERE rolname = current_user"
IS_CITUS = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') AS yes"
# Every memory table: a table of this schema with an agent or a namespace column (the registry aside). The
# operator's tables have neither and are granted to no agent: jobs, memctl_migrations, erasures (the erasure
# ledger's ids and digests).
MEMORY_TABLES = """
SELECT c.relname AS name FROM pg_class c
WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND c.relname <> 'agents'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname IN ('agent', 'namespace')
              AND NOT a.attisdropped)
ORDER BY 1
"""
# The sequences behind those tables' identity columns (inserts draw from them).
SEQUENCES = """
SELECT s.relname AS name FROM pg_depend d
JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_class t ON t.oid = d.refobjid
WHERE d.deptype IN ('a', 'i') AND t.relnamespace = current_schema()::regnamespace AND t.relname = ANY(%s)
"""
SCHEMA_USAGE = "SELECT has_schema_privilege(%s, current_schema(), 'USAGE') AS yes"
IS_MEMBER = "SELECT pg_has_role(%s, %s, 'USAGE') AS yes"


def role_name_for(name: str) -> str:
    """memctl_agent_NAME for a name of lowercase letters, digits and _ that fits in 63 bytes; otherwise
    memctl_agent_ + those characters of it (at most 40) + _ + the first 8 hex digits of its sha256."""
    if re.fullmatch(r"[a-z0-9_]+", name) and len(ROLE_PREFIX) + len(name) <= MAX_ROLE:
        return ROLE_PREFIX + name
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")[:40]
    return f"{ROLE_PREFIX}{slug}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


def _agent(row: dict | None) -> Agent | None:
    return None if row is None else Agent(**{**row, "shared": list(row["shared"])})


def _yes(conn, query: str, params=()) -> bool:
    return bool(conn.execute(query, params).fetchone()["yes"])


def refuse_citus(conn) -> None:
    if _yes(conn, IS_CITUS):
        raise AgentsUnsupported("agents are not offered on Citus: row-level security is not set up on distributed "
                                "tables (docs/agents.md); `memctl mcp --agent` keeps its SQL scope there")


# ---------------------------------------------------------------------------
# Roles and grants


def role_sql(agent_role: str, read_only: bool, owner: str) -> list[sql.Composed]:
    """What a role with CREATEROLE runs for an agent: the groups, the agent's role, memberships."""
    groups = [READERS] + ([] if read_only else [WRITERS])
    statements = []
    for group in (READERS, WRITERS, agent_role):
        statements.append(sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {name}) THEN "
            "CREATE ROLE {role} NOLOGIN; END IF; END $$").format(name=sql.Literal(group), role=sql.Identifier(group)))
    statements.append(sql.SQL("GRANT {} TO {}").format(sql.SQL(", ").join(map(sql.Identifier, groups)),
                                                       sql.Identifier(agent_role)))
    if read_only:  # a role once read-write, registered again read-only
        statements.append(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(WRITERS), sql.Identifier(agent_role)))
    statements.append(sql.SQL("GRANT {} TO {}").format(sql.Identifier(agent_role), sql.Identifier(owner)))
    return statements


def print_sql(conn, name: str, *, read_only: bool = False) -> str:
    """The statements `agent add --print-sql` prints for a DBA: run them as a role with CREATEROLE, then
    `memctl agent add` as the owner registers the agent on the roles they made."""
    name = _checked(name, "NAME")
    owner = conn.execute("SELECT current_user AS me").fetchone()["me"]
    head = (f"-- agent {name!r}: run as a superuser, or a role with CREATEROLE (on PostgreSQL 16+ one that made\n"
            f"-- {READERS} and {WRITERS}, or holds them WITH ADMIN OPTION); then, as {owner}:\n"
            f"--   memctl agent add {name} [--namespace NS] [--shared-namespace NS]...\n")
    return head + "".join(s.as_string(conn) + ";\n" for s in role_sql(role_name_for(name), read_only, owner))


def grant(conn) -> None:
    """Give the agents' groups what memctl's agent tools use, on every memory table there is now.

    Run by `agent add`, at every agent server's start, and when a model's vector table is created
    (memctl.embedding.models.register), so a table added later is granted too. Does nothing until a
    group exists (no agent was ever registered on this server)."""
    if not _yes(conn, ROLE_EXISTS, (READERS,)):
        return
    readers, writers = sql.Identifier(READERS), sql.Identifier(WRITERS)
    has_writers = _yes(conn, ROLE_EXISTS, (WRITERS,))
    if not _yes(conn, SCHEMA_USAGE, (READERS,)):
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(conn.execute("SELECT current_schema() AS s").fetchone()["s"]), readers))
    tables = [row["name"] for row in conn.execute(MEMORY_TABLES)]
    for table in tables:
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(table), readers))
        if has_writers:
            conn.execute(sql.SQL("GRANT INSERT, UPDATE ON {} TO {}").format(sql.Identifier(table), writers))
    for table in READ_TABLES:
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(table), readers))
    conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION memctl_agent_matches(tsquery) TO {}").format(readers))
    if has_writers:
        for row in conn.execute(SEQUENCES, (tables,)).fetchall():
            conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE {} TO {}").format(sql.Identifier(row["name"]), writers))


def _make_roles(conn, name: str, role: str, read_only: bool) -> None:
    owner = conn.execute("SELECT current_user AS me").fetchone()["me"]
    if not _yes(conn, CAN_CREATE_ROLES):
        if not _yes(conn, ROLE_EXISTS, (role,)):
            raise AgentsUnsupported(
                f"the role {owner} may not create roles: a superuser runs `ALTER ROLE {owner} CREATEROLE`, or a DBA "
                f"runs what `memctl agent add {name} --print-sql` prints, then `memctl agent add {name}` again")
        return  # made by a DBA: _check_roles() says if a membership is missing
    for statement in role_sql(role, read_only, owner):
        try:
            with conn.transaction():
                conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege as e:  # PostgreSQL 16+: groups another role made
            raise AgentsUnsupported(
                f"the role {owner} may not grant the agents' roles ({e.diag.message_primary}): a superuser runs "
                f"`GRANT {READERS}, {WRITERS} TO {owner} WITH ADMIN OPTION`, or a DBA runs what "
                f"`memctl agent add {name} --print-sql` prints") from None


def _check_roles(conn, name: str, role: str, read_only: bool) -> None:
    """The owner can assume the role, and the role is in the groups that carry its grants: else what a DBA
    runs (a role made by hand rather than by --print-sql)."""
    owner = conn.execute("SELECT current_user AS me").fetchone()["me"]
    missing = [group for group in (READERS,) + (() if read_only else (WRITERS,))
               if not _yes(conn, IS_MEMBER, (role, group))]
    if missing:
        raise AgentsUnsupported(f"the role {role} is not in {', '.join(missing)}: a DBA runs `GRANT "
                                f"{', '.join(missing)} TO {role}` (`memctl agent add {name} --print-sql` prints "
                                "every statement)")
    try:
        with conn.transaction():
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
            raise _Rollback
    except _Rollback:
        return
    except psycopg.Error:
        raise AgentsUnsupported(f"the role {owner} cannot SET ROLE {role}: a DBA runs `GRANT {role} TO {owner}` "
                                f"(`memctl agent add {name} --print-sql` prints every statement)") from None


class _Rollback(Exception):
    pass


# ---------------------------------------------------------------------------
# The registry


def _checked(name: str, what: str) -> str:
    return values.name(name, what)


def add(conn, name: str, *, namespace: str | None = None, shared: list[str] | None = None,
        read_only: bool = False) -> Agent:
    """Register an agent: its role (made unless a DBA made it), grants, and its row. No token yet."""
    name = _checked(name, "NAME")
    namespace = _checked(namespace, "--namespace") if namespace is not None else name
    reads = list(dict.fromkeys(_checked(ns, "--shared-namespace") for ns in shared or () if ns != namespace))
    refuse_citus(conn)
    if show(conn, name, missing_ok=True) is not None:
        raise UsageError(f"agent {name!r} is registered already: `memctl agent revoke {name}` first to change it")
    role = role_name_for(name)
    with conn.transaction():
        _make_roles(conn, name, role, read_only)
        _check_roles(conn, name, role, read_only)
        conn.execute(INSERT, (name, role, namespace, reads, read_only))
        grant(conn)
    return show(conn, name)


def list_agents(conn) -> list[Agent]:
    return [_agent(row) for row in conn.execute(ALL).fetchall()]


def show(conn, name: str, *, missing_ok: bool = False) -> Agent | None:
    found = _agent(conn.execute(ONE, (name,)).fetchone())
    if found is None and not missing_ok:
        raise NotFound(f"no agent {name!r}: `memctl agent add {name}` registers it")
    return found


def namespaces_for(conn, agent: str | None) -> tuple[str, tuple[str, ...]]:
    """The facts' namespaces a registered agent's MCP server reads (its own, then shared ones); 'default' for an
    unregistered agent or none (the operator's commands' default, as before agents were registered)."""
    found = show(conn, agent, missing_ok=True) if agent is not None else None
    return (found.namespace, tuple(found.shared)) if found is not None else (values.DEFAULT_NAMESPACE, ())


def issue_token(conn, name: str) -> str:
    """A new bearer token for the agent, replacing any earlier one (which stops working at once)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    if conn.execute(SET_TOKEN, (hash_token(token), name)).fetchone() is None:
        raise NotFound(f"no agent {name!r}: `memctl agent add {name}` registers it")
    return token


def by_token(conn, token: str) -> Agent | None:
    """The agent a bearer token belongs to, or None (unknown, rotated or revoked)."""
    if not token or len(token) > 200 or not token.isascii():
        return None
    return _agent(conn.execute(BY_TOKEN, (hash_token(token),)).fetchone())


def revoke(conn, name: str) -> dict:
    """Unregister an agent: its row and token go (its servers refuse it from their next call), then its role
    is dropped. The agent's memory stays (the operator's: `purge`, `episode delete`)."""
    with conn.transaction():
        row = conn.execute(DELETE, (name,)).fetchone()
        if row is None:
            raise NotFound(f"no agent {name!r}")
    role = row["role_name"]
    dropped = True
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    except Exception:  # no CREATEROLE: the role, NOLOGIN and now no agent here, sees nothing; a DBA drops it
        dropped = False
    return {"name": name, "role": role, "role_dropped": dropped}


def assume(conn, agent: Agent | str) -> None:
    """Run the connection's next statements in the agent's role (an Agent or its role's name; until reset()).

    The connection remembers it (assumed()): search then finds words through memctl_agent_matches
    (sql/0022), the text index's way in under row-level security."""
    role = agent if isinstance(agent, str) else agent.role
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    conn.memctl_role = role


def reset(conn) -> None:
    conn.execute("RESET ROLE")
    conn.memctl_role = None


def assumed(conn) -> bool:
    """Whether assume() put the connection in an agent's role. Only the way words are found depends on it:
    a connection put in a role otherwise (psql's SET ROLE) is still kept to its rows, by the policies."""
    return getattr(conn, "memctl_role", None) is not None
