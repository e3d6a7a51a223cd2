"""An agent's own SQL client (`memctl agent add --login`, `agent login`), and what `agent revoke` leaves of it.

The login's URL is in a 0600 file; its sessions read the agent's rows and write nothing (writes go through
memctl's MCP server, and so through the gate); the role has a connection limit and default timeouts.
`agent revoke` ends its sessions, takes over what it owns here (a large object it made) and drops it, so no
role is left able to read; the wall's session locks are never waited for when an agent's session holds them.
"""

from __future__ import annotations

import stat
import threading
import uuid

import psycopg
import pytest
from psycopg import sql

from memctl import config, db
from memctl.db import migrate
from memctl.records import agents, episodes
from memctl.write.values import WRITER


def _name() -> str:
    return f"l{uuid.uuid4().hex[:8]}"


@pytest.fixture
def owner_env(agents_db_url, memctl_env):
    memctl_env["MEMCTL_DATABASE_URL"] = agents_db_url
    return memctl_env


def _password_matters(url: str) -> bool:
    """Whether the server asks this role for its password (the embedded server trusts its socket's users)."""
    wrong = psycopg.conninfo.make_conninfo(url, password="not-the-password")
    try:
        psycopg.connect(wrong).close()
        return False
    except psycopg.OperationalError:
        return True


def test_a_login_reads_its_agents_rows_writes_nothing_and_is_bounded(
    owner_env, agents_db_url, memctl_bin, tmp_path
):
    name, other = _name(), _name()
    path = tmp_path / "login.url"
    added = memctl_bin(
        "agent", "add", name, "--login", "--login-file", str(path), "-f", "json", env=owner_env
    )
    assert added.exit_code == 0, added.stderr
    assert added.json()["login"] is True and str(path) in added.stderr
    assert memctl_bin("agent", "add", other, env=owner_env).exit_code == 0
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        url = path.read_text().strip()
        assert url.startswith("postgresql://") and url not in added.stderr + added.stdout
        with db.connect(agents_db_url) as conn:
            mine = episodes.add(
                conn.use_settings(config.load()), "the login's own note", agent=name
            )
            episodes.add(conn.use_settings(config.load()), "another agent's note", agent=other)
            role = conn.execute(
                "SELECT rolcanlogin, rolconnlimit, rolconfig FROM pg_roles WHERE rolname = %s",
                (agents.role_name_for(name),),
            ).fetchone()
        settings = config.Settings()
        assert role["rolcanlogin"] and role["rolconnlimit"] == settings.agents.login_connections
        assert {"statement_timeout=30000", "idle_in_transaction_session_timeout=60000"} <= set(
            role["rolconfig"]
        )
        with psycopg.connect(url, autocommit=True) as client:
            assert client.execute("SELECT id, content FROM episodes").fetchall() == [
                (mine, "the login's own note")
            ]
            # declaring today's schema passes the schema guard (sql/0025): what refuses is the agent's wall
            client.execute("SELECT set_config(%s, %s, false)", (migrate.SETTING, migrate.newest()))
            with pytest.raises(
                psycopg.errors.InsufficientPrivilege
            ):  # its own rows too: writes go through the gate
                client.execute(
                    WRITER + "INSERT INTO episodes (agent, content, content_hash, importance) "
                    "VALUES (%s, 'direct', '\\x00', 5)",
                    (name,),
                )  # marked: the policy refuses it
        printed = memctl_bin("agent", "login", name, "--login-file", "-", env=owner_env)
        assert printed.exit_code == 0 and printed.stdout.startswith("postgresql://")
        if _password_matters(url):  # the earlier password stops working
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(url).close()
            psycopg.connect(printed.stdout.strip()).close()
    finally:
        for agent in (name, other):
            memctl_bin("agent", "revoke", agent, env=owner_env)


def test_revoke_ends_the_logins_sessions_takes_over_its_large_object_and_leaves_no_role_reading(
    owner_env, agents_db_url, memctl_bin, tmp_path
):
    name = _name()
    role = agents.role_name_for(name)
    path = tmp_path / "login.url"
    assert (
        memctl_bin(
            "agent", "add", name, "--login", "--login-file", str(path), env=owner_env
        ).exit_code
        == 0
    )
    with db.connect(agents_db_url) as conn:
        episodes.add(
            conn.use_settings(config.load()), "what the revoked agent could read", agent=name
        )
    session = psycopg.connect(path.read_text().strip(), autocommit=True)
    try:
        try:  # bob makes a large object himself where the server lets him; else the owner gives him one
            session.execute("SELECT lo_from_bytea(0, 'kept by the agent')")
        except psycopg.errors.InsufficientPrivilege:
            with db.connect(agents_db_url) as conn:
                oid = conn.execute("SELECT lo_from_bytea(0, 'kept by the agent') AS o").fetchone()[
                    "o"
                ]
                conn.execute(
                    sql.SQL("ALTER LARGE OBJECT {} OWNER TO {}").format(
                        sql.Literal(oid), sql.Identifier(role)
                    )
                )
        revoked = memctl_bin("agent", "revoke", name, env=owner_env)
        assert revoked.exit_code == 0, revoked.stderr
        assert "1 large object" in revoked.stderr and "ended 1 of its sessions" in revoked.stderr
        assert f"dropped role {role}" in revoked.stderr
        with pytest.raises(psycopg.OperationalError):  # its session was ended
            session.execute("SELECT 1")
    finally:
        session.close()
    with db.connect(agents_db_url) as conn:
        assert not conn.execute(agents.ROLE_EXISTS, (role,)).fetchone()["yes"]
        assert (
            conn.execute(
                "SELECT count(*) AS n FROM pg_largeobject_metadata lo JOIN pg_roles r ON r.oid = lo.lomowner "
                "WHERE r.rolname = current_user"
            ).fetchone()["n"]
            >= 1
        )  # taken over, not lost
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(path.read_text().strip()).close()


def test_memctls_session_locks_are_never_waited_for_when_an_agents_session_holds_them(
    owner_env, agents_db_url, memctl_bin, tmp_path
):
    """An agent's session holding the migration's advisory key: where memctl's role may revoke advisory locks from
    PUBLIC (a superuser) the agent cannot take it; elsewhere `migrate` refuses at once, naming the holder's role."""
    name = _name()
    path = tmp_path / "login.url"
    assert (
        memctl_bin(
            "agent", "add", name, "--login", "--login-file", str(path), env=owner_env
        ).exit_code
        == 0
    )
    try:
        with psycopg.connect(path.read_text().strip(), autocommit=True) as session:
            try:
                session.execute("SELECT pg_advisory_lock(%s)", (migrate.LOCK_KEY,))
                held = True
            except psycopg.errors.InsufficientPrivilege:
                held = False
            outcome: dict = {}

            def run():
                with db.connect(agents_db_url) as conn:
                    try:
                        migrate.apply(conn)
                        outcome["ok"] = True
                    except Exception as exc:  # noqa: BLE001 - the test reads what it raised
                        outcome["error"] = str(exc)

            worker = threading.Thread(target=run, daemon=True)
            worker.start()
            worker.join(60)
            assert not worker.is_alive(), "migrate waited for an agent's session"
        if held:
            assert (
                agents.role_name_for(name) in outcome["error"]
                and "not memctl's" in outcome["error"]
            )
        else:
            assert outcome == {"ok": True}
            with db.connect(agents_db_url) as conn:
                assert not conn.execute(
                    "SELECT has_function_privilege('public', 'pg_advisory_lock(bigint)', 'EXECUTE') "
                    "AS yes"
                ).fetchone()["yes"]
    finally:
        memctl_bin("agent", "revoke", name, env=owner_env)
