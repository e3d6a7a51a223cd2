"""Fixtures of the agents' wall (docs/agents.md "Threat model"): two registered agents with login roles in a
database of their own, and sessions whose user is one of them, as an agent's own SQL client would have; and
`can_create_roles`, which skips, saying why, where the test's database owner may not make agents' roles.

Loaded through pytest_plugins (tests/conftest.py). Roles are the server's: names carry a random suffix so
runs and lanes sharing a server never meet, and are revoked (dropped) at the end.
"""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memctl import config, db
from memctl.records import agents, episodes, facts


@dataclass
class Wall:
    """The database (the owner's URL), its two agents, what alice holds that bob must never see."""

    url: str
    alice: agents.Agent
    bob: agents.Agent
    logins: dict[str, str]  # agent name -> its login URL (agents.login)
    admin: str | None  # a superuser's URL to this database (SET SESSION AUTHORIZATION), or None
    marks: tuple[
        str, ...
    ]  # strings only alice's rows hold: her text, her fact's value, her namespace
    alice_ids: set[int] = field(default_factory=set)
    bob_counts: dict[str, int] = field(default_factory=dict)  # table -> bob's own rows

    @contextlib.contextmanager
    def session(self, mode: str, agent: agents.Agent):
        """A connection whose session user is `agent`'s role (not autocommit: one transaction, held)."""
        if mode == "login":
            conn = psycopg.connect(self.logins[agent.name])
        else:
            if self.admin is None:
                pytest.skip(
                    "SET SESSION AUTHORIZATION needs a superuser; the test role is not one (the login "
                    "role's sessions are tried on this server)"
                )
            conn = psycopg.connect(self.admin)
            conn.execute(sql.SQL("SET SESSION AUTHORIZATION {}").format(sql.Identifier(agent.role)))
        try:
            assert conn.execute("SELECT session_user").fetchone()[0] == agent.role
            yield conn
        finally:
            conn.rollback()
            conn.close()

    def owner(self):
        return db.connect(self.url, vector=True)


def _may_create_roles(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]


@contextlib.contextmanager
def _database(server_url: str, template: str):
    name = f"memctl_w_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(make_conninfo(server_url, dbname="template1"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    try:
        yield make_conninfo(server_url, dbname=name)
    finally:
        from tests.conftest import drop_database

        with psycopg.connect(
            make_conninfo(server_url, dbname="template1"), autocommit=True
        ) as conn:
            drop_database(conn, name)


@pytest.fixture
def can_create_roles(pg_role, conn):
    """Skips, saying why, where the owner of this test's database (`conn`) may not make agents' roles."""
    if not conn.execute(agents.CAN_CREATE_ROLES).fetchone()["yes"]:
        pytest.skip(
            f"needs CREATEROLE to make agents' roles; the test role {pg_role.name!r} lacks it "
            "(pg_roles.rolcreaterole is false)"
        )


@pytest.fixture(scope="module")
def wall(pg_server, pg_role, createrole_server) -> Wall:
    """alice and bob, each with a login; alice's episodes, facts and history seeded, bob's too. The owner is the
    test role where it may make roles, else CI's CREATEROLE role (memctl_dba on PostgreSQL 15)."""
    from tests.conftest import TEMPLATE

    if _may_create_roles(pg_server):
        server, template = pg_server, TEMPLATE
    elif createrole_server is not None:
        server, template = createrole_server
    else:
        pytest.skip(
            "needs a role that may create roles (a superuser test role, or MEMCTL_TEST_CREATEROLE_URL)"
        )
    suffix = uuid.uuid4().hex[:8]
    with _database(server, template) as url:
        made = _seed(url, suffix)
        admin = (
            make_conninfo(pg_server, dbname=conninfo_to_dict(url)["dbname"])
            if pg_role.superuser
            else None
        )
        made.admin = admin
        try:
            yield made
        finally:
            with db.connect(url) as conn:
                for agent in (made.alice, made.bob):
                    agents.revoke(conn, agent.name)


def _seed(url: str, suffix: str) -> Wall:
    settings = config.Settings()
    with db.connect(url) as conn:
        # the attacks meet the database's own defences, not the tests' writer check (which refuses unmarked writes first)
        conn.execute("DROP FUNCTION IF EXISTS memctl_test_writer_check() CASCADE")
        alice = agents.add(conn, f"alice_{suffix}", namespace=f"ns_alice_{suffix}")
        bob = agents.add(conn, f"bob_{suffix}", namespace=f"ns_bob_{suffix}")
        marks = (f"heron{suffix}", f"alicevalue{suffix}", alice.namespace)
        ids = {
            episodes.add(
                conn.use_settings(settings),
                f"alice saw the heron{suffix} at dawn",
                agent=alice.name,
            ),
            episodes.add(
                conn.use_settings(settings),
                f"alice heron{suffix} again, kestrel{suffix}",
                agent=alice.name,
            ),
        }
        episodes.add(conn.use_settings(settings), f"bob saw a kestrel{suffix}", agent=bob.name)
        for value in ("first", f"alicevalue{suffix}"):
            facts.set_fact(conn, "db.password.hint", value, namespace=alice.namespace)
        facts.set_fact(conn, "db.host", "10.9.9.9", namespace=bob.namespace)
        conn.execute("ANALYZE")  # statistics for pg_stats to hold (and hide)
        logins = {agent.name: agents.login(conn, agent.name) for agent in (alice, bob)}
        counts = {
            table: conn.execute(
                sql.SQL("SELECT count(*) AS n FROM {} WHERE {} = %s").format(
                    sql.Identifier(table), sql.Identifier(column)
                ),
                (value,),
            ).fetchone()["n"]
            for table, column, value in (
                ("episodes", "agent", bob.name),
                ("chunks", "agent", bob.name),
                ("facts", "namespace", bob.namespace),
                ("fact_history", "namespace", bob.namespace),
            )
        }
    return Wall(url, alice, bob, logins, None, marks, ids, counts)
