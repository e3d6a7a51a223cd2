"""An older memctl cannot write into a newer memory, and the database enforces it (sql/0025_schema_guard.sql).

The memctl already installed on a VPS never learns a newer schema's rules, so the schema refuses it: a session that
does not declare the current schema (every memctl before 0.2.0 declares none) is refused INSERT, UPDATE, DELETE,
COPY and TRUNCATE on every table of memctl's schema but the migration record and the access log; its reads go on.
memctl itself refuses a schema holding a migration it does not know (exit 1, naming both versions), except for
commands that only read, which warn. And a real earlier memctl's `episode add`, run against a migrated memory,
exits non-zero and stores nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from memctl import __version__, db
from memctl.db import migrate
from memctl.write.values import WRITER

EXEMPT = {"memctl_migrations", "episode_access"}
GUARD = migrate.GUARD_SQLSTATE
TABLES = """
SELECT c.relname AS name, (SELECT a.attname FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0
                           AND NOT a.attisdropped AND a.attgenerated = '' AND a.attidentity = '' ORDER BY a.attnum
                           LIMIT 1) AS col
FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' ORDER BY 1
"""
OPERATIONS = {  # each touches no row: a statement-level guard fires all the same
    "INSERT": "INSERT INTO {t} ({c}) SELECT {c} FROM {t} WHERE false",
    "UPDATE": "UPDATE {t} SET {c} = {c} WHERE false",
    "DELETE": "DELETE FROM {t} WHERE false",
    "TRUNCATE": "TRUNCATE {t} CASCADE",
    "COPY": "COPY {t} FROM STDIN",
}
NO_COLUMN = {
    "INSERT": "INSERT INTO {t} SELECT WHERE false"
}  # a table of no column (a lock table): no UPDATE to try


def _possible(table: dict) -> list[str]:
    return [op for op in OPERATIONS if table["col"] is not None or op not in ("UPDATE",)]


def _tables(conn) -> list[dict]:
    return conn.execute(TABLES).fetchall()


def _attempt(conn, operation: str, table: dict) -> str | None:
    """The SQLSTATE that refused OPERATION on TABLE (rolled back either way), or None when it passed."""
    if table["col"] is None:
        text = NO_COLUMN.get(operation, OPERATIONS[operation])
        statement = sql.SQL(WRITER + text).format(t=sql.Identifier(table["name"]))
    else:
        statement = sql.SQL(WRITER + OPERATIONS[operation]).format(
            t=sql.Identifier(table["name"]), c=sql.Identifier(table["col"])
        )
    try:
        with conn.transaction(force_rollback=True):
            if operation == "COPY":
                with conn.cursor().copy(statement):
                    pass
            else:
                conn.execute(statement)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


@pytest.fixture
def memory(db_url):
    """A migrated database with a model's vector table (made after the migration, as memctl makes one)."""
    from memctl.embedding import models
    from memctl.embedding.embedders import HashEmbedder

    with db.connect(db_url) as conn:
        models.register(conn, HashEmbedder("guard-test", 8), state="active")
    return db_url


@pytest.mark.parametrize("declared", [None, "0022_agent_text_matches.sql"], ids=["none", "older"])
def test_a_session_older_than_the_schema_is_refused_every_write_and_reads_on(memory, declared):
    options = {} if declared is None else {"options": f"-c {migrate.SETTING}={declared}"}
    with psycopg.connect(
        memory, autocommit=True, row_factory=psycopg.rows.dict_row, **options
    ) as old:
        tables = _tables(old)
        assert any(t["name"].startswith("vectors_") for t in tables)
        refused = {(op, t["name"]): _attempt(old, op, t) for t in tables for op in _possible(t)}
        for t in tables:
            old.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t["name"])))
    guarded = {(op, name) for (op, name), state in refused.items() if state == GUARD}
    assert guarded == {
        (op, t["name"]) for t in tables for op in _possible(t) if t["name"] not in EXEMPT
    }


def test_a_session_of_this_memctl_passes_the_guard(memory):
    with db.connect(memory) as conn:  # declares this memctl's schema
        passed = {
            (op, t["name"]): _attempt(conn, op, t) for t in _tables(conn) for op in _possible(t)
        }
    assert {key: state for key, state in passed.items() if state == GUARD} == {}


def test_an_agents_role_passes_the_guard_when_memctl_writes_as_it(agents_db_url):
    """Agents' roles may not read the migration record: the guard reads it as its owner (SECURITY DEFINER)."""
    from memctl.records import agents

    with db.connect(agents_db_url) as conn:
        if not conn.execute(agents.CAN_CREATE_ROLES).fetchone()["yes"]:
            pytest.skip("needs CREATEROLE to make an agent's role")
        agent = agents.add(conn, f"guard_{os.getpid()}")
        insert = (
            WRITER + "INSERT INTO facts (namespace, key, value, version) VALUES (%s, 'k', 'v', 1)"
        )
        try:
            conn.as_agent(agent.role)
            conn.execute(insert, (agent.namespace,))
            conn.as_owner()
            with psycopg.connect(agents_db_url, autocommit=True) as old:
                old.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(agent.role)))
                with pytest.raises(psycopg.Error) as refused:
                    old.execute(insert, (agent.namespace,))
        finally:
            conn.as_owner()
            agents.revoke(conn, agent.name)
    assert refused.value.sqlstate == GUARD


def _ahead(url: str) -> None:
    """The memory as a newer memctl leaves it: a migration this one does not know, applied with its version."""
    with db.connect(url) as conn:
        conn.execute(
            "INSERT INTO memctl_migrations (name, checksum, memctl_version) VALUES (%s, 'x', '9.9.9')",
            ("9000_from_the_future.sql",),
        )


def test_this_memctl_refuses_a_newer_schema_for_writing_and_reads_with_a_warning(cli, db_url):
    assert cli("fact", "set", "k", "v").exit_code == 0
    _ahead(db_url)
    refused = cli("fact", "set", "k", "w")
    assert refused.exit_code == 1
    for needle in (
        "9000_from_the_future.sql",
        "9.9.9",
        f"memctl {__version__}",
        migrate.newest(),
        "upgrade memctl",
    ):
        assert needle in refused.stderr
    read = cli("fact", "get", "k")
    assert read.exit_code == 0 and read.stdout.strip() == "v" and "upgrade memctl" in read.stderr
    migrated = cli("db", "migrate")
    assert (
        migrated.exit_code == 1
        and "upgrade memctl" in migrated.stderr
        and "up to date" not in migrated.stderr
    )
    listed = cli("db", "migrate", "--list", "-f", "json").json()
    assert {"name": "9000_from_the_future.sql", "status": "unknown"}.items() <= listed[-1].items()


OLD_COMMIT = "3ef5ae8"  # main before 0.2.0: the last memctl without the guard


@pytest.fixture
def old_memctl(tmp_path):
    """An earlier memctl of main, from this checkout's git history (its files, run with this Python)."""
    checkout = Path(__file__).resolve().parents[1]
    if (
        shutil.which("git") is None
        or subprocess.run(
            ["git", "-C", str(checkout), "cat-file", "-e", OLD_COMMIT], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip(
            f"needs this checkout's git history (commit {OLD_COMMIT}) to run an earlier memctl"
        )
    tree = tmp_path / "old"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(checkout), "archive", OLD_COMMIT, "memctl", "sql"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)

    def run(*args: str, env: dict) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "memctl", *args],
            cwd=tree,
            capture_output=True,
            text=True,
            env={**os.environ, **env, "PYTHONPATH": str(tree)},
            timeout=120,
        )

    return run


def test_an_earlier_memctl_cannot_write_into_a_migrated_memory(old_memctl, memctl_env, cli, db_url):
    assert cli("fact", "set", "db.host", "10.0.0.1").exit_code == 0
    added = old_memctl(
        "episode", "add", "written by the old memctl", "--source", "old", env=memctl_env
    )
    assert added.returncode != 0 and "upgrade memctl" in added.stderr
    fact = old_memctl("fact", "set", "db.host", "10.0.0.9", env=memctl_env)
    assert fact.returncode != 0
    read = old_memctl("fact", "get", "db.host", env=memctl_env)
    assert read.returncode == 0 and read.stdout.strip() == "10.0.0.1"
    with db.connect(db_url) as conn:
        assert (
            conn.execute("SELECT count(*) AS n FROM episodes WHERE source = 'old'").fetchone()["n"]
            == 0
        )
        assert (
            conn.execute("SELECT value FROM facts WHERE key = 'db.host'").fetchone()["value"]
            == "10.0.0.1"
        )
