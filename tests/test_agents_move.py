"""Agents survive a move: the registry travels in a backup, the roles do not (they are the server's), so a restore,
an import or an upgrade onto another server makes every registered agent's role, memberships and grants again
(memctl.db.wall.ensure), or prints the statements and reports failure; the restore drill (`backup verify`) says
what a restore there would have to make; `status` and `metrics` warn of an agent without a working role; and a
database migrated from before sql/0023 with agents registered gets the whole wall.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from memctl import config, db
from memctl.db import migrate, wall
from memctl.records import agents, episodes
from tests.fix_mcp import as_agent
from tests.installed import memctl_exe


def _name() -> str:
    return f"m{uuid.uuid4().hex[:8]}"


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [memctl_exe(), *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_a_backup_restored_into_a_fresh_home_serves_alices_token(
    agents_db_url, memctl_env, memctl_bin, tmp_path, http_server
):
    """The disaster a backup is for: a new machine (a fresh embedded server, whose cluster has none of the roles).
    The drill there names what a restore must make; the restore makes it; alice's token is served."""
    memctl_env["MEMCTL_DATABASE_URL"] = agents_db_url
    alice = _name()
    assert (
        memctl_bin(
            "agent",
            "add",
            alice,
            "--login",
            "--login-file",
            str(tmp_path / "a.url"),
            env=memctl_env,
        ).exit_code
        == 0
    )
    token = memctl_bin("agent", "token", alice, env=memctl_env).stdout.strip()
    backups = tmp_path / "backups"
    try:
        with db.connect(agents_db_url) as conn:
            episodes.add(
                conn.use_settings(config.load()),
                "the osprey backup job failed on disk space",
                agent=alice,
            )
        taken = memctl_bin("backup", "--to", str(backups), env=memctl_env)
        assert taken.exit_code == 0, taken.stderr
    finally:
        memctl_bin(
            "agent", "revoke", alice, env=memctl_env
        )  # the role is gone from this server too
    [path] = sorted(backups.glob("memctl-*.tar"))
    home = Path(tempfile.mkdtemp(prefix="memctl-test-move-"))
    fresh = {**os.environ, **memctl_env, "MEMCTL_HOME": str(home), "MEMCTL_DATABASE_URL": ""}
    try:
        assert _run(fresh, "db", "start").returncode == 0
        url = _run(fresh, "db", "url").stdout.strip()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CREATE DATABASE drill")
        drill = _run(
            {**fresh, "MEMCTL_SCRATCH_URL": make_conninfo(url, dbname="drill")},
            "backup",
            "verify",
            str(path),
        )
        assert drill.returncode == 0, drill.stderr
        assert f"agent {alice!r}: its role does not exist on that server" in drill.stderr
        assert "`memctl restore` makes it" in drill.stderr
        restored = _run(fresh, "restore", str(path), "--yes", "-f", "json")
        assert restored.returncode == 0, restored.stderr
        assert json.loads(restored.stdout)["agent_roles_made"] == [agents.role_name_for(alice)]
        assert "had a login" in restored.stderr
        status = _run(fresh, "status", "-f", "json")
        assert not [w for w in json.loads(status.stdout)["warnings"] if "agent" in w]
        log = tmp_path / "fresh.log"
        with http_server(fresh, log) as served:

            async def scenario():
                async with as_agent(served, token) as client:
                    found = await client.ok("search", query="osprey backup", mode="text")
                    assert [r["agent"] for r in found["results"]] == [alice]
                    assert (await client.ok("remember", content="served on the new machine"))[
                        "stored"
                    ]

            anyio.run(scenario)
        assert "Traceback" not in log.read_text()
    finally:
        _run(fresh, "db", "stop")
        shutil.rmtree(home, ignore_errors=True)
        with psycopg.connect(
            agents_db_url, autocommit=True
        ) as conn:  # roles are the servers'; the fresh one is gone
            conn.execute(
                sql.SQL("DROP ROLE IF EXISTS {}").format(
                    sql.Identifier(agents.role_name_for(alice))
                )
            )


def test_status_and_metrics_warn_of_an_agent_without_a_role_until_it_is_made_again(
    agents_db_url, memctl_env, memctl_bin
):
    memctl_env["MEMCTL_DATABASE_URL"] = agents_db_url
    name = _name()
    role = agents.role_name_for(name)
    assert memctl_bin("agent", "add", name, env=memctl_env).exit_code == 0
    try:
        with db.connect(agents_db_url) as conn:
            conn.execute(
                sql.SQL("DROP ROLE {}").format(sql.Identifier(role))
            )  # as a move to another server leaves it
        status = memctl_bin("status", "--check", "-f", "json", env=memctl_env)
        assert status.exit_code == 1
        assert any(
            f"agent {name!r} has no working role ({role}: its role does not exist)" in w
            for w in status.json()["warnings"]
        )
        metrics = memctl_bin("metrics", env=memctl_env)
        assert "memctl_agents_without_role 1.0" in metrics.stdout
        with db.connect(agents_db_url) as conn:
            assert wall.ensure(conn)["made"] == [role]
        assert "memctl_agents_without_role 0.0" in memctl_bin("metrics", env=memctl_env).stdout
    finally:
        memctl_bin("agent", "revoke", name, env=memctl_env)


def test_a_role_that_may_not_make_roles_prints_the_statements_and_reports_failure(
    plain_owner_db_url, memctl_env, memctl_bin, tmp_path
):
    """A registry holding an agent whose role this server lacks, and an owner without CREATEROLE: the import is
    done but exits 1 with what a DBA runs; after a restore the same (wall.after_move)."""
    name = _name()
    role = agents.role_name_for(name)
    with db.connect(plain_owner_db_url) as conn:
        conn.execute(agents.INSERT, (name, role, name, [], False))
        moved = wall.after_move(conn, strict=False)
    assert f"CREATE ROLE {role}" in moved["unserved"].replace('"', "") and moved["made"] == []
    memctl_env["MEMCTL_DATABASE_URL"] = plain_owner_db_url
    export = tmp_path / "empty.jsonl"
    assert memctl_bin("export", "--out", str(export), env=memctl_env).exit_code == 0
    imported = memctl_bin("import", str(export), env=memctl_env)
    assert (
        imported.exit_code == 1
        and "the import is done, but agents are not served" in imported.stderr
    )
    assert "GRANT memctl_agents" in imported.stderr.replace('"', "")


def test_a_database_migrated_from_before_the_wall_gets_it_whole(
    pg_server, pg_role, createrole_server
):
    """Schema 0022 with an agent registered as memctl then did it (table-level write grants, groups assumable),
    migrated: the groups see nothing, writes are granted by column, the definer functions are pinned."""
    server = pg_server if pg_role.superuser else (createrole_server or [None])[0]
    if server is None:
        pytest.skip(
            "needs a role that may create roles (a superuser test role, or MEMCTL_TEST_CREATEROLE_URL)"
        )
    name, dbname = _name(), f"memctl_m_{uuid.uuid4().hex[:10]}"
    role = agents.role_name_for(name)
    old = Path(tempfile.mkdtemp(prefix="memctl-sql-"))
    for path in sorted(migrate.sql_dir().glob("*.sql")):
        if path.name < "0023":
            shutil.copy(path, old / path.name)
    with psycopg.connect(make_conninfo(server, dbname="template1"), autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    url = make_conninfo(server, dbname=dbname)
    try:
        if pg_role.superuser:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        with db.connect(url) as conn:
            migrate.apply(conn, old)
            for statement in wall.role_sql(
                role, False, conn.info.user, 150000
            ):  # 0022's way: plain memberships
                conn.execute(statement)
            conn.execute(
                "INSERT INTO agents (name, role_name, writes_namespace) VALUES (%s, %s, %s)",
                (name, role, name),
            )
            conn.execute("GRANT SELECT ON episodes, facts TO memctl_agents")
            conn.execute("GRANT INSERT, UPDATE ON episodes, facts TO memctl_agents_write")
            conn.execute(
                "INSERT INTO episodes (agent, content, content_hash, importance) "
                "VALUES (%s, 'written before the wall', '\\x00', 5)",
                (name,),
            )
            migrate.apply(conn)
            agents.grant(conn)  # what every agent server does at its start
            table_level = conn.execute("""
                SELECT count(*) AS n FROM pg_class c, aclexplode(c.relacl) x JOIN pg_roles r ON r.oid = x.grantee
                WHERE c.relname IN ('episodes', 'facts') AND r.rolname = 'memctl_agents_write'
                  AND x.privilege_type IN ('INSERT', 'UPDATE')""").fetchone()["n"]
            assert table_level == 0
            for group in wall.GROUPS:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(group)))
                seen = (
                    conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"]
                    if group == wall.READERS
                    else 0
                )
                conn.execute("RESET ROLE")
                assert seen == 0, group
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            assert conn.execute("SELECT content FROM episodes").fetchall() == [
                {"content": "written before the wall"}
            ]
            conn.execute("RESET ROLE")
            pinned = conn.execute(
                "SELECT proconfig FROM pg_proc WHERE proname = 'memctl_agent_of'"
            ).fetchone()
            assert pinned["proconfig"][0].endswith("pg_temp")
    finally:
        shutil.rmtree(old, ignore_errors=True)
        with psycopg.connect(make_conninfo(server, dbname="template1"), autocommit=True) as admin:
            from tests.conftest import drop_database

            drop_database(admin, dbname)
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
