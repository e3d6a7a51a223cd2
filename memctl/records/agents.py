"""Agents as principals: the registry, each agent's PostgreSQL role, its bearer token (docs/agents.md).

An agent registered here has a role of its own, named by role_name_for(): memctl's servers connect as
the owner and assume it with SET ROLE for the agent's statements (Memory.as_agent); with `agent add --login`
(login()) its own client may also log in as it, to read its memory with SQL. Row-level security
(sql/0019_agents.sql, sql/0023_agent_wall.sql) keeps that role to the agent's own episodes and namespace
and the namespaces it may read; the roles, their grants and what the server lets them do are
memctl.db.wall's (two group roles carry the grants, so a table created later is granted once for every
agent).

A token is shown once, when issued, and stored only as its sha256: a token is 32 random bytes, so a
plain hash cannot be reversed by guessing, and a look-up by hash needs no per-token salt.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import re
import secrets
import urllib.parse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, overload

import psycopg

from memctl.db import wall
from memctl.errors import NotFound, UsageError
from memctl.write import values

if TYPE_CHECKING:
    from memctl.db.memory import Memory

READERS, WRITERS = wall.READERS, wall.WRITERS
AgentsUnsupported = wall.AgentsUnsupported
ROLE_PREFIX = "memctl_agent_"
MAX_ROLE = 63  # PostgreSQL's NAMEDATALEN - 1, in bytes
TOKEN_PREFIX = "mctk_"
SCRAM_ITERATIONS = 4096  # PostgreSQL's own default (scram_iterations)


@dataclass
class Agent:
    name: str
    role: str
    namespace: str
    shared: list[str] = field(default_factory=list)
    read_only: bool = False
    created_at: datetime.datetime | None = None
    token_issued_at: datetime.datetime | None = None
    login_at: datetime.datetime | None = None

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "role": self.role,
            "namespace": self.namespace,
            "shared": list(self.shared),
            "read_only": self.read_only,
            "created_at": self.created_at,
            "token": self.token_issued_at is not None,
            "token_issued_at": self.token_issued_at,
            "login": self.login_at is not None,
            "login_at": self.login_at,
        }


COLUMNS = (
    "name, role_name AS role, writes_namespace AS namespace, reads_namespaces AS shared, read_only, created_at, "
    "token_issued_at, login_at"
)
ALL = f"SELECT {COLUMNS} FROM agents ORDER BY name"
ONE = f"SELECT {COLUMNS} FROM agents WHERE name = %s"
BY_TOKEN = f"SELECT {COLUMNS} FROM agents WHERE token_sha256 = %s"
INSERT = """
INSERT INTO agents (name, role_name, writes_namespace, reads_namespaces, read_only) VALUES (%s, %s, %s, %s, %s)
"""
SET_TOKEN = (
    "UPDATE agents SET token_sha256 = %s, token_issued_at = now() WHERE name = %s RETURNING name"
)
SET_LOGIN = "UPDATE agents SET login_at = now() WHERE name = %s"
DELETE = "DELETE FROM agents WHERE name = %s RETURNING role_name"
ROLE_EXISTS = "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = %s) AS yes"
CAN_CREATE_ROLES = (
    "SELECT rolcreaterole OR rolsuper AS yes FROM pg_roles WHERE rolname = current_user"
)
IS_CITUS = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') AS yes"


def role_name_for(name: str) -> str:
    """memctl_agent_NAME for a name of lowercase letters, digits and _ that fits in 63 bytes; otherwise
    memctl_agent_ + those characters of it (at most 40) + _ + the first 8 hex digits of its sha256."""
    if re.fullmatch(r"[a-z0-9_]+", name) and len(ROLE_PREFIX) + len(name) <= MAX_ROLE:
        return ROLE_PREFIX + name
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")[:40]
    return f"{ROLE_PREFIX}{slug}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "replace")).digest()


@overload
def _agent(row: dict) -> Agent: ...
@overload
def _agent(row: dict | None) -> Agent | None: ...
def _agent(row: dict | None) -> Agent | None:
    return None if row is None else Agent(**{**row, "shared": list(row["shared"])})


def _yes(conn: Memory, query: str, params=()) -> bool:
    return bool(conn.one(query, params)["yes"])


def refuse_citus(conn: Memory) -> None:
    if _yes(conn, IS_CITUS):
        raise AgentsUnsupported(
            "agents are not offered on Citus: row-level security is not set up on distributed "
            "tables (docs/agents.md); `memctl mcp --agent` keeps its SQL scope there"
        )


# ---------------------------------------------------------------------------
# Roles (memctl.db.wall)


def print_sql(conn: Memory, name: str, *, read_only: bool = False) -> str:
    """The statements `agent add --print-sql` prints for a DBA: run them as a role with CREATEROLE, then
    `memctl agent add` as the owner registers the agent on the roles they made."""
    name = _checked(name, "NAME")
    owner = conn.one("SELECT current_user AS me")["me"]
    head = (
        f"-- agent {name!r}: run as a superuser, or a role with CREATEROLE (on PostgreSQL 16+ one that made\n"
        f"-- {READERS} and {WRITERS}, or holds them WITH ADMIN OPTION); then, as {owner}:\n"
        f"--   memctl agent add {name} [--namespace NS] [--shared-namespace NS]...\n"
    )
    return head + "".join(
        s.as_string(conn) + ";\n" for s in wall.statements_for(conn, role_name_for(name), read_only)
    )


def grant(conn: Memory) -> None:
    """The agents' groups' grants on every memory table there is now (memctl.db.wall.grant)."""
    wall.grant(conn)


def open_gaps(conn: Memory) -> list[str]:
    """What of the server's defaults an agent's role keeps because memctl's role may not revoke it, each with the
    statement a DBA runs (memctl.db.wall.gaps; docs/agents.md "Threat model")."""
    return [str(gap) for gap in wall.gaps(conn)]


# ---------------------------------------------------------------------------
# The registry


def _checked(name: str, what: str) -> str:
    return values.name(name, what)


def add(
    conn: Memory,
    name: str,
    *,
    namespace: str | None = None,
    shared: list[str] | None = None,
    read_only: bool = False,
) -> Agent:
    """Register an agent: its role (made unless a DBA made it), grants, and its row. No token yet."""
    name = _checked(name, "NAME")
    namespace = _checked(namespace, "--namespace") if namespace is not None else name
    reads = list(
        dict.fromkeys(_checked(ns, "--shared-namespace") for ns in shared or () if ns != namespace)
    )
    refuse_citus(conn)
    if show(conn, name, missing_ok=True) is not None:
        raise UsageError(
            f"agent {name!r} is registered already: `memctl agent revoke {name}` first to change it"
        )
    role = role_name_for(name)
    with conn.transaction():
        wall.make_roles(conn, name, role, read_only)
        wall.check_roles(conn, name, role, read_only)
        conn.execute(INSERT, (name, role, namespace, reads, read_only))
        grant(conn)
    return show(conn, name)


def list_agents(conn: Memory) -> list[Agent]:
    return [_agent(row) for row in conn.execute(ALL).fetchall()]


@overload
def show(conn: Memory, name: str, *, missing_ok: Literal[False] = False) -> Agent: ...
@overload
def show(conn: Memory, name: str, *, missing_ok: bool) -> Agent | None: ...
def show(conn: Memory, name: str, *, missing_ok: bool = False) -> Agent | None:
    found = _agent(conn.execute(ONE, (name,)).fetchone())
    if found is None and not missing_ok:
        raise NotFound(f"no agent {name!r}: `memctl agent add {name}` registers it")
    return found


def namespaces_for(conn: Memory, agent: str | None) -> tuple[str, tuple[str, ...]]:
    """The facts' namespaces a registered agent's MCP server reads (its own, then shared ones); 'default' for an
    unregistered agent or none (the operator's commands' default, as before agents were registered)."""
    found = show(conn, agent, missing_ok=True) if agent is not None else None
    return (
        (found.namespace, tuple(found.shared))
        if found is not None
        else (values.DEFAULT_NAMESPACE, ())
    )


def issue_token(conn: Memory, name: str) -> str:
    """A new bearer token for the agent, replacing any earlier one (which stops working at once)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    if conn.execute(SET_TOKEN, (hash_token(token), name)).fetchone() is None:
        raise NotFound(f"no agent {name!r}: `memctl agent add {name}` registers it")
    return token


def by_token(conn: Memory, token: str) -> Agent | None:
    """The agent a bearer token belongs to, or None (unknown, rotated or revoked)."""
    if not token or len(token) > 200 or not token.isascii():
        return None
    return _agent(conn.execute(BY_TOKEN, (hash_token(token),)).fetchone())


def scram_verifier(password: str, iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for a password (RFC 5802, as libpq's PQencryptPasswordConn
    makes it): ALTER ROLE ... PASSWORD gets this, so the password itself never reaches the server or its log."""
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored = hashlib.sha256(hmac.new(salted, b"Client Key", "sha256").digest()).digest()
    server = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored)}:{b64(server)}"


def login(conn: Memory, name: str) -> str:
    """Make the agent's role a login role with a new generated password (any earlier one stops working), a
    connection limit and its sessions' timeouts ([agents] login_*): the URL its client connects with, password
    included (the caller keeps it in a 0600 file). Its own sessions read its memory and write nothing: its writes
    go through memctl's MCP server, and so through the gate (docs/agents.md "Direct SQL")."""
    from psycopg.conninfo import conninfo_to_dict

    from memctl.config import parse_duration

    settings, agent = conn.settings, show(conn, name)
    password = secrets.token_urlsafe(24)
    ms = lambda duration: min(int(parse_duration(duration) * 1000), 2**31 - 1)  # noqa: E731  (PostgreSQL: int ms)
    wall.login(
        conn,
        agent.role,
        scram_verifier(password),
        connections=settings.agents.login_connections,
        statement_timeout=ms(settings.agents.login_statement_timeout),
        idle_timeout=ms(settings.agents.login_idle_timeout),
    )
    conn.execute(SET_LOGIN, (name,))
    given = conninfo_to_dict(conn.info.dsn)
    host, port, dbname = conn.info.host, conn.info.port, conn.info.dbname
    quote = lambda text: urllib.parse.quote(str(text), safe="")  # noqa: E731
    if host.startswith("/"):  # a Unix socket's directory
        where, query = f"/{quote(dbname)}", {"host": host, "port": port}
    else:
        where, query = (
            f"{quote(host) if ':' not in host else '[' + host + ']'}:{port}/{quote(dbname)}",
            {},
        )
    if given.get("sslmode"):
        query["sslmode"] = given["sslmode"]
    tail = ("?" + urllib.parse.urlencode(query)) if query else ""
    return f"postgresql://{quote(agent.role)}:{quote(password)}@{where}{tail}"


def revoke(conn: Memory, name: str) -> dict:
    """Unregister an agent: its row and token go (its servers refuse it from their next call), then its role
    is retired (memctl.db.wall.retire: no login, its sessions ended, what it owns here taken over, the role
    dropped). The agent's memory stays (the operator's: `purge`, `episode delete`)."""
    with conn.transaction():
        row = conn.execute(DELETE, (name,)).fetchone()
        if row is None:
            raise NotFound(f"no agent {name!r}")
    return {"name": name, **wall.retire(conn, row["role_name"])}
