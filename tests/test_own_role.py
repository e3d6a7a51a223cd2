"""memctl as a role that owns its database and nothing more: no superuser, no pg_read_all_stats, no pg_toast.

On a test server where the tests are superuser (the embedded one), each test creates a role
memctl_owner_<random> (LOGIN PASSWORD, no other attribute, member of no role) and a database it owns from
template0, and creates the vector extension in it as a DBA would where the test needs it. memctl then
runs against that database as that role, through a URL carrying the password. The embedded server trusts
local connections (initdb --auth=trust), so there the password is not checked; what a role may do does
not depend on how it authenticated (measured too on PostgreSQL 15.20 with scram-sha-256).

On a MEMCTL_TEST_DATABASE_URL whose role is no superuser (the CI job), that role is the unprivileged one:
each test creates its own database (CREATEDB, which the suite needs anyway) from template1, which has
the extension there, or from template0 for the tests of a database without it. The tests that must
create a role or the extension skip, saying so.
"""

from __future__ import annotations

import ast
import json
import os
import re
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from memctl.db import preflight
from tests.conftest import drop_database

OLD = "2020-01-01T00:00:00+00:00"
NEEDS_SUPERUSER = (
    "needs a superuser to {}; MEMCTL_TEST_DATABASE_URL's role is not one (pg_roles.rolsuper)"
)


@dataclass
class Owner:
    role: str
    database: str
    url: str  # as the role, with its password: never printed
    password: str | None
    admin_url: str | None  # as a superuser in the role's database; None when the tests have none
    dedicated: bool  # a role made for this test (else the test server's own unprivileged role)


@pytest.fixture
def server_admin(pg_server):
    """(connection as the tests' role, is it a superuser?)"""
    with psycopg.connect(pg_server, autocommit=True, row_factory=dict_row) as conn:
        yield (
            conn,
            conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[
                "rolsuper"
            ],
        )


@pytest.fixture
def admin(server_admin):
    conn, superuser = server_admin
    if not superuser:
        pytest.skip(NEEDS_SUPERUSER.format("create a second role"))
    return conn


def _owner(server_admin, pg_server, *, vector: bool):
    admin, superuser = server_admin
    suffix = uuid.uuid4().hex[:10]
    database = f"memctl_own_{suffix}"
    if not superuser:
        in_template1 = (
            psycopg.connect(make_conninfo(pg_server, dbname="template1"), autocommit=True)
            .execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'")
            .fetchone()[0]
        )
        if vector and not in_template1:
            pytest.skip(
                NEEDS_SUPERUSER.format("create the vector extension, which template1 does not have")
            )
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(database), sql.Identifier("template1" if vector else "template0")
            )
        )
        try:
            role = admin.execute("SELECT current_user AS r").fetchone()["r"]
            yield Owner(
                role, database, make_conninfo(pg_server, dbname=database), None, None, False
            )
        finally:
            drop_database(admin, database)
        return
    role, password = f"memctl_owner_{suffix}", secrets.token_urlsafe(18)
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    try:
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0").format(
                sql.Identifier(database), sql.Identifier(role)
            )
        )
        owner = Owner(
            role,
            database,
            make_conninfo(pg_server, dbname=database, user=role, password=password),
            password,
            make_conninfo(pg_server, dbname=database),
            True,
        )
        if vector:
            create_extension(owner)
        yield owner
    finally:
        drop_database(admin, database)
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


@pytest.fixture
def owner(server_admin, pg_server):
    """A database without the vector extension, owned by an unprivileged role."""
    yield from _owner(server_admin, pg_server, vector=False)


@pytest.fixture
def vector_owner(server_admin, pg_server):
    """A database with the vector extension (created by a superuser), owned by an unprivileged role."""
    yield from _owner(server_admin, pg_server, vector=True)


def create_extension(owner: Owner) -> None:
    with psycopg.connect(owner.admin_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")


@pytest.fixture
def run(request, tmp_path, monkeypatch):
    """memctl in-process as the test's owner (vector_owner or owner): run("fact", "get", "k") -> Outcome."""
    owner = request.getfixturevalue(
        "vector_owner" if "vector_owner" in request.fixturenames else "owner"
    )
    from memctl.cli import app
    from tests.conftest import Outcome, memctl_runner

    config = tmp_path / "config.toml"
    config.write_text('[embedding]\ndimensions = 768\n\n[retention]\nraw = "30d"\n')
    for key, value in {
        "MEMCTL_DATABASE_URL": owner.url,
        "MEMCTL_CONFIG": str(config),
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }.items():
        monkeypatch.setenv(key, value)
    runner = memctl_runner()

    def invoke(*args: str, input: str | None = None) -> Outcome:
        result = runner.invoke(app, list(args), input=input, catch_exceptions=False)
        outcome = Outcome(result.exit_code, result.stdout, result.stderr)
        assert owner.password is None or owner.password not in outcome.stdout + outcome.stderr
        return outcome

    return invoke


def ok(outcome):
    assert outcome.exit_code == 0, outcome.stderr
    return outcome


def test_the_role_is_unprivileged(server_admin, owner):
    admin, _ = server_admin
    row = admin.execute(
        """SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
        (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid) AS memberships,
        pg_has_role(r.oid, 'pg_read_all_stats', 'USAGE') OR pg_has_role(r.oid, 'pg_read_all_data', 'USAGE')
            AS reads_all
        FROM pg_roles r WHERE r.rolname = %s""",
        (owner.role,),
    ).fetchone()
    if owner.dedicated:
        assert row == {
            "rolsuper": False,
            "rolcreaterole": False,
            "rolcreatedb": False,
            "rolreplication": False,
            "rolbypassrls": False,
            "memberships": 0,
            "reads_all": False,
        }
    else:  # the CI job's role: CREATEDB for the suite's databases, nothing else that matters here
        assert (row["rolsuper"], row["rolreplication"], row["rolbypassrls"], row["reads_all"]) == (
            False,
        ) * 4
    with psycopg.connect(owner.url, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # what `memctl size` used to run
            conn.execute("SELECT count(*) FROM pg_toast.pg_toast_1255")  # pg_proc's TOAST table
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="create extension"):
            conn.execute("CREATE EXTENSION vector")


def test_every_command_works_as_the_database_owner(vector_owner, run):
    refused = run("fact", "get", "db.host")
    assert refused.exit_code == 1 and "schema is behind: run memctl db migrate" in refused.stderr
    assert "Traceback" not in refused.stderr

    migrated = ok(run("db", "migrate", "-f", "json"))
    assert {m["status"] for m in migrated.json()} == {"applied"} and len(migrated.json()) >= 5
    assert "schema is up to date" in ok(run("db", "migrate")).stderr

    ok(run("fact", "set", "db.host", "10.8.0.4:5432"))
    assert ok(run("fact", "get", "db.host")).stdout.strip() == "10.8.0.4:5432"
    disk = int(
        ok(
            run("episode", "add", "deploy failed: disk full on db7, rotating the logs fixed it")
        ).stdout
    )
    ok(run("episode", "add", "the kafka consumer lag alarm on host14 was a false positive"))
    ok(
        run(
            "episode",
            "add",
            "old raw note about a printer jam",
            "--kind",
            "raw",
            "--created-at",
            OLD,
        )
    )
    long_text = " ".join(f"word{i}" for i in range(1500))  # a chunked, TOASTed episode
    ok(
        run(
            "episode",
            "import",
            "-",
            input=json.dumps({"content": long_text, "kind": "summary"}) + "\n",
        )
    )
    ok(run("embed"))

    hits = ok(run("episode", "search", "disk full on db7", "-f", "json")).json()
    assert hits[0]["id"] == disk
    recalled = ok(run("recall", "the deploy failed with disk full: which db host?"))
    assert "10.8.0.4:5432" in recalled.stdout and "disk full" in recalled.stdout

    report = ok(run("size", "--format", "json")).json()
    rels = report["relations"]
    toast = [r for r in rels if r["kind"] == "toast"]
    assert toast and all(r["rows_source"] == "estimate" and "pg_toast" in r["note"] for r in toast)
    tables = [r for r in rels if r["kind"] in ("table", "vectors")]
    assert all(r["rows_source"] == "exact" for r in tables)
    by_name = {r["relation"]: r for r in rels}
    assert by_name["public.episodes"]["rows"] == 4 and by_name["public.facts"]["rows"] == 1
    [model] = report["models"]
    assert (model["dims"], model["rows_source"]) == (768, "exact") and model["rows"] >= 5
    vector_toast = next(r for r in toast if r["parent"] == model["relation"])
    assert vector_toast["toast_bytes"] == 0 and vector_toast["total_bytes"] > 0

    # What size suggests before a large index build; for a role the test does not drop, only in this database.
    scope = sql.SQL("" if vector_owner.dedicated else "IN DATABASE {}").format(
        sql.Identifier(vector_owner.database)
    )
    with psycopg.connect(vector_owner.url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE CURRENT_USER {} SET maintenance_work_mem = '96MB'").format(scope)
        )
    [model] = ok(run("size", "--section", "models", "-f", "json")).json()
    assert model["maintenance_work_mem"] == 96 * 2**20

    status = ok(run("status", "-f", "json")).json()
    assert (status["episodes"], status["pending"]) == (4, 0)

    planned = ok(run("prune", "-f", "json")).json()
    assert [(p["kind"], p["rows"]) for p in planned] == [("raw", 1)]
    ok(run("prune", "--yes", "--vacuum"))
    assert ok(run("status", "-f", "json")).json()["episodes"] == 3
    assert "printer" not in ok(run("episode", "list", "-f", "json")).stdout

    ok(run("fact", "set", "db.host", "10.8.0.5:5432"))
    ok(run("fact", "stale", "db.host"))
    ok(run("fact", "delete", "db.host", "--erase"))  # runs VACUUM, which the owner may
    assert run("fact", "get", "db.host").exit_code == 4
    ok(run("episode", "add", "a noisy bot says hello", "--source", "noisy-bot"))
    ok(run("purge", "--source", "noisy-bot", "--yes"))
    ok(run("source", "block", "noisy-bot"))
    assert run("episode", "add", "hello again", "--source", "noisy-bot").exit_code == 1
    assert {"embed", "prune", "purge"} <= {j["job"] for j in ok(run("jobs", "-f", "json")).json()}
    ok(run("embed", "timing", "--sample", "3"))


def test_a_full_model_change_as_the_database_owner(vector_owner, run, monkeypatch):
    ok(run("db", "migrate"))
    for i in range(12):
        ok(
            run(
                "episode", "add", f"incident {i}: host{i} ran out of disk and the logs were rotated"
            )
        )
    ok(run("embed"))
    ok(run("reembed", "start", "--model", "nomic-embed-text"))
    ok(run("reembed", "run"))
    assert ok(run("reembed", "status", "-f", "json")).json()["state"] == "ready"
    assert (
        ok(run("reembed", "compare", "--sample", "3", "-k", "3", "-f", "json")).json()["queries"]
        == 3
    )
    ok(
        run("reembed", "switch", "--accept-worse")
    )  # templated incidents: the memory's own items cannot judge
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "nomic-embed-text")
    hits = ok(
        run("episode", "search", "host7 ran out of disk", "--mode", "vector", "-f", "json")
    ).json()
    assert "host7" in hits[0]["content"]
    dropped = ok(run("reembed", "drop-old", "-f", "json")).json()
    assert len(dropped) == 1 and dropped[0]["bytes_returned"] > 0


def test_migrate_without_the_extension_says_what_a_superuser_must_run(owner, run):
    refused = run("db", "migrate")
    assert refused.exit_code == 1
    assert "CREATE EXTENSION vector;" in refused.stderr
    assert (
        f'database "{owner.database}"' in refused.stderr
        and f'role "{owner.role}"' in refused.stderr
    )
    assert "template1" in refused.stderr and "superuser" in refused.stderr
    assert "permission denied" not in refused.stderr and "Traceback" not in refused.stderr
    with psycopg.connect(owner.url, autocommit=True) as conn:  # refused before changing anything
        assert conn.execute("SELECT to_regclass('memctl_migrations')").fetchone()[0] is None
    if owner.admin_url is None:
        return  # no superuser to do what the message says
    create_extension(owner)  # what the message says; then migrate goes through
    ok(run("db", "migrate"))
    assert (
        run("fact", "get", "absent").exit_code == 4
    )  # migrated: a missing fact, not a missing schema


def test_migrate_as_a_role_that_does_not_own_the_database(
    admin, vector_owner, pg_server, run, monkeypatch
):
    """CONNECT but not owner: on PostgreSQL 15+ it may not create tables in public, and is told so."""
    owner = vector_owner
    other = f"memctl_guest_{uuid.uuid4().hex[:10]}"
    password = secrets.token_urlsafe(18)
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(other), sql.Literal(password)
        )
    )
    try:
        monkeypatch.setenv(
            "MEMCTL_DATABASE_URL",
            make_conninfo(pg_server, dbname=owner.database, user=other, password=password),
        )
        refused = run("db", "migrate")
        assert refused.exit_code == 1 and "Traceback" not in refused.stderr
        assert f'role "{other}" may not create tables in schema "public"' in refused.stderr
        assert f'ALTER DATABASE "{owner.database}" OWNER TO "{other}"' in refused.stderr
    finally:
        admin.execute(
            sql.SQL("DROP OWNED BY {}").format(sql.Identifier(other))
        )  # none expected; be sure
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(other)))


# ---------------------------------------------------------------------- versions


def test_version_decisions():
    assert preflight.parse_version("0.8.6") == (0, 8, 6) and preflight.parse_version(
        "0.8.0-dev"
    ) == (0, 8, 0)
    assert preflight.parse_version(None) is None and preflight.parse_version("x") is None
    assert (
        preflight.pgvector_problem((0, 8, 0)) is None
        and preflight.pgvector_problem((0, 8, 6)) is None
    )
    assert preflight.pgvector_problem((1, 0)) is None and preflight.pgvector_problem(None) is None
    for old in ((0, 7, 4), (0, 5, 1), (0, 7)):
        problem = preflight.pgvector_problem(old)
        assert (
            "older than 0.8.0" in problem and "iterative" in problem and "too few rows" in problem
        )
    assert (
        preflight.server_problem(180006, "18.6") is None
        and preflight.server_problem(150000, "15.0") is None
    )
    assert "too old" in preflight.server_problem(140011, "14.11")
    assert "15" in preflight.server_problem(130020, "13.20")
    assert (
        preflight.server_warning(180006, "18.6") is None
        and preflight.server_warning(150004, "15.4") is None
    )
    assert "newer than" in preflight.server_warning(190000, "19devel")


def test_dba_messages_name_the_steps():
    rights = {
        "role": "memctl",
        "database": "memctl",
        "superuser": False,
        "database_create": True,
        "schema": "public",
        "schema_create": True,
    }
    absent = preflight.missing_extension(rights, None)
    assert (
        "not installed on this server" in absent
        and "0.8.0" in absent
        and "CREATE EXTENSION vector;" in absent
    )
    old = preflight.missing_extension(
        rights, {"version": (0, 7, 4), "superuser": True, "trusted": False}
    )
    assert "0.7.4 is older than 0.8.0" in old and "make install" in old
    fine = {"version": (0, 8, 6), "superuser": True, "trusted": False}
    assert "CREATE EXTENSION vector;" in preflight.missing_extension(rights, fine)
    assert preflight.missing_extension({**rights, "superuser": True}, fine) is None
    trusted = {**fine, "trusted": True}  # a trusted extension: CREATE on the database is enough
    assert preflight.missing_extension(rights, trusted) is None
    assert preflight.missing_extension({**rights, "database_create": False}, trusted) is not None
    assert preflight.schema_problem(rights) is None
    created_old = preflight.upgrade_path("memctl", created=True, available=(0, 8, 6))
    assert (
        "already has pgvector 0.8.6" in created_old
        and "ALTER EXTENSION vector UPDATE;" in created_old
    )
    both = preflight.upgrade_path("memctl", created=True, available=(0, 7, 4))
    assert "install pgvector 0.8.0 or newer" in both and "ALTER EXTENSION vector UPDATE;" in both
    assert "ALTER EXTENSION" not in preflight.upgrade_path("memctl", created=False)
    assert "search_path" in preflight.schema_problem(
        {**rights, "schema": None, "schema_create": False}
    )


def test_versions_read_from_the_server(conn, pg_server):
    """The test server (embedded: PostgreSQL 18.6, pgvector 0.8.6; the CI job: 15): nothing to warn about."""
    num, text = preflight.server_version(conn)
    assert num // 10000 >= preflight.MIN_SERVER and text.split(".")[0] == str(num // 10000)
    installed = preflight.pgvector_version(conn)
    assert installed >= preflight.MIN_PGVECTOR
    assert preflight.available_pgvector(conn)["version"] >= installed
    assert preflight.version_warnings(conn) == []
    assert preflight.preflight(conn, schema_changes=False) == []
    if not os.environ.get("MEMCTL_TEST_DATABASE_URL"):
        assert (num // 100, installed) == (1800, (0, 8, 6))  # what embedded.py and DESIGN.md say


def test_preflight_on_a_database_without_the_extension(owner):
    with psycopg.connect(owner.url, autocommit=True) as bare:
        assert preflight.pgvector_version(bare) is None
        assert preflight.version_warnings(bare) == [
            "the pgvector extension is not created in this database: run memctl db migrate"
        ]
        rights = preflight.rights(bare)
        assert (rights["role"], rights["superuser"], rights["database_create"]) == (
            owner.role,
            False,
            True,
        )
        with pytest.raises(preflight.ServerRefused, match="CREATE EXTENSION vector;"):
            preflight.preflight(bare, schema_changes=True)


def test_sql_uses_nothing_newer_than_postgresql_15():
    """memctl's SQL must run on 15-18: no syntax or views PostgreSQL 16+ added."""
    newer = (
        "ANY_VALUE",
        "SYSTEM_USER",
        "JSON_TABLE",
        "JSON_EXISTS",
        "JSON_QUERY",
        "JSON_VALUE",
        "JSON_SERIALIZE",
        "JSON_OBJECTAGG",
        "JSON_ARRAYAGG",
        "IS JSON",
        "PG_STAT_IO",
        "PG_STAT_CHECKPOINTER",
        "MERGE_ACTION",
        "RANDOM_NORMAL",
        "PG_INPUT_IS_VALID",
        "ARRAY_SAMPLE",
        "ARRAY_SHUFFLE",
        "RETURNING OLD",
        "RETURNING NEW",
        "UUIDV7",
        "PG_STAT_GET_BACKEND_IO",
        "WITHOUT OVERLAPS",
    )
    root = Path(__file__).parent.parent
    texts = {p: p.read_text().upper() for p in root.glob("sql/**/*.sql")}
    for path in root.glob(
        "memctl/**/*.py"
    ):  # string constants (SQL among them), not names nor docstrings
        tree = ast.parse(path.read_text())
        docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        texts[path] = "\n".join(
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        ).upper()
    assert len(texts) > 30 and any("CREATE TABLE" in t for t in texts.values())
    found = [
        (p.name, word)
        for p, text in texts.items()
        for word in newer
        if re.search(rf"\b{word}", text)
    ]
    assert found == []
