"""Agents on the operator's own PostgreSQL, where memctl's owner is not a superuser (docs/agents.md).

Two owners: one with CREATEROLE, which makes agents' roles itself, and one without, which is told
exactly what to ask for and gets `--print-sql` for a DBA. CI step 3 runs these on Debian's PostgreSQL
15 as `memctl` (no CREATEROLE) and `memctl_dba` (CREATEROLE; tests/ci/own-postgres.sh); on the
embedded server the superuser test role makes both roles.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memctl import config, db
from memctl.records import agents, episodes


def _name() -> str:
    return f"t{uuid.uuid4().hex[:8]}"  # roles are the server's, not the database's: no clash across tests


def _seen_by(url: str, agent: str) -> set[str]:
    with db.connect(url) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(agents.role_name_for(agent))))
        return {r["agent"] for r in conn.execute("SELECT agent FROM episodes")}


def _seed(url: str, *names: str) -> None:
    with db.connect(url) as conn:
        for name in names:
            episodes.add(
                conn.use_settings(config.load()), f"{name} rotated the nginx logs", agent=name
            )


def _attributes(url: str) -> tuple:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user"
        ).fetchone()


def test_an_owner_with_createrole_makes_agents_roles_itself(createrole_db_url, cli, memctl_env):
    assert _attributes(createrole_db_url) == (False, True)
    env = {"MEMCTL_DATABASE_URL": createrole_db_url}
    alice, bob = _name(), _name()
    for name in (alice, bob):
        added = cli("agent", "add", name, "-f", "json", env=env)
        assert added.exit_code == 0, added.stderr
        # what only a superuser may revoke is said to stay open, with its statement (docs/agents.md)
        assert (
            "left open" in added.stderr
            and "REVOKE EXECUTE ON FUNCTION pg_catalog.lo_creat" in added.stderr
        )
    _seed(createrole_db_url, alice, bob)
    assert _seen_by(createrole_db_url, alice) == {alice}
    assert _seen_by(createrole_db_url, bob) == {bob}
    revoked = cli("agent", "revoke", alice, env=env)
    assert revoked.exit_code == 0 and "dropped role" in revoked.stderr
    cli("agent", "revoke", bob, env=env)
    with psycopg.connect(createrole_db_url) as conn:
        assert (
            conn.execute(agents.ROLE_EXISTS, (agents.role_name_for(alice),)).fetchone()[0] is False
        )


def test_an_owner_without_createrole_is_told_the_grant_and_a_dba_runs_print_sql(
    plain_owner_db_url, createrole_server, cli, memctl_env
):
    if createrole_server is None:
        pytest.skip(
            "needs a DBA: a login role with CREATEROLE (MEMCTL_TEST_CREATEROLE_URL, or a superuser test role)"
        )
    url = plain_owner_db_url
    owner = conninfo_to_dict(url).get("user") or _owner(url)
    assert _attributes(url) == (False, False)
    env = {"MEMCTL_DATABASE_URL": url}
    carol, dave = _name(), _name()
    refused = cli("agent", "add", carol, env=env)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert (
        f"ALTER ROLE {owner} CREATEROLE" in refused.stderr
        and f"agent add {carol} --print-sql" in refused.stderr
    )
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM agents").fetchone()[0] == 0
        assert (
            conn.execute(agents.ROLE_EXISTS, (agents.role_name_for(carol),)).fetchone()[0] is False
        )

    dba_url = make_conninfo(createrole_server[0], dbname=conninfo_to_dict(url)["dbname"])
    with psycopg.connect(dba_url, autocommit=True) as dba:
        for name in (carol, dave):
            printed = cli("agent", "add", name, "--print-sql", env=env)
            assert printed.exit_code == 0 and f"TO {owner}" in printed.stdout.replace('"', "")
            dba.execute(printed.stdout)  # what the DBA runs, as printed
        for name in (carol, dave):
            added = cli("agent", "add", name, env=env)
            assert added.exit_code == 0, added.stderr
        _seed(url, carol, dave)
        assert _seen_by(url, carol) == {carol}
        assert _seen_by(url, dave) == {dave}
        revoked = cli("agent", "revoke", carol, env=env)
        assert (
            revoked.exit_code == 0
            and f"a DBA runs DROP ROLE {agents.role_name_for(carol)}" in revoked.stderr
        )
        assert _seen_by(url, carol) == set()  # unregistered: its role, still there, sees nothing
        cli("agent", "revoke", dave, env=env)
        for name in (carol, dave):
            dba.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(agents.role_name_for(name))))


def test_a_role_a_dba_made_by_hand_without_its_group_is_named(
    plain_owner_db_url, createrole_server, cli, memctl_env
):
    if createrole_server is None:
        pytest.skip(
            "needs a DBA: a login role with CREATEROLE (MEMCTL_TEST_CREATEROLE_URL, or a superuser test role)"
        )
    url = plain_owner_db_url
    owner = conninfo_to_dict(url).get("user") or _owner(url)
    erin = _name()
    role = agents.role_name_for(erin)
    dba_url = make_conninfo(createrole_server[0], dbname=conninfo_to_dict(url)["dbname"])
    with psycopg.connect(dba_url, autocommit=True) as dba:
        dba.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        dba.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(owner)))
        try:
            refused = cli("agent", "add", erin, env={"MEMCTL_DATABASE_URL": url})
            assert refused.exit_code == 1
            assert f"GRANT {agents.READERS}, {agents.WRITERS} TO {role}" in refused.stderr
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT count(*) FROM agents").fetchone()[0] == 0
        finally:
            dba.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _owner(url: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT current_user").fetchone()[0]
