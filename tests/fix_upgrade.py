"""Fixtures of the upgrade tests: memories made by earlier memctl (tests/data/upgrade, built by its build.py)
restored into fresh databases; what a migration must keep of them (every row) and make of them (the schema a fresh
database gets). Loaded through pytest_plugins (tests/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.conftest import drop_database

DATA = Path(__file__).parent / "data" / "upgrade"
VECTORS = "vectors_"  # a model's vector table: vectors_<id>_<model>_<dims>


def fixture_records() -> list[dict]:
    """Each fixture's record (COMMIT.json), oldest first, with its dump's path."""
    found = []
    for path in DATA.glob("*.json"):
        record = json.loads(path.read_text(encoding="utf-8"))
        found.append({**record, "name": path.stem, "dump": path.with_suffix(".dump")})
    return sorted(found, key=lambda r: r["date"])


@pytest.fixture
def restored(pg_server, tmp_path):
    """restored(record) -> the URL of a fresh database holding that fixture's memory, restored as memctl's own
    restore does it (pg_restore's script through psql in one transaction, owners and grants left out)."""
    from psycopg.conninfo import make_conninfo

    from memctl.backup import pgtools

    made = []

    def restore(record: dict) -> str:
        name = f"memctl_u_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        url = make_conninfo(pg_server, dbname=name)
        with psycopg.connect(url, autocommit=True) as conn:
            major = conn.info.server_version // 10000
        tools = pgtools.for_restore(major, 18)
        listing = pgtools.listing(tools, record["dump"], tmp_path / f"{name}.list")
        with pgtools.connection_env(url) as env:
            pgtools.restore_script(
                tools,
                record["dump"],
                listing,
                env,
                server_major=major,
                before="CREATE EXTENSION IF NOT EXISTS vector;",
                after="SELECT 1;",
            )
        return url

    yield restore
    with psycopg.connect(pg_server, autocommit=True) as admin:
        for name in made:
            drop_database(admin, name)


def table_rows(
    conn,
    columns: dict[str, list[str]] | None = None,
    instead: dict[tuple[str, str], sql.Composable] | None = None,
) -> dict[str, Counter]:
    """Every row of every table of memctl's schema as text (times in UTC, floats whole), counted; `columns`: only
    these tables and columns (what an earlier schema had), else every stored column of every table; `instead`:
    an expression read in place of a (table, column)."""
    from memctl.backup import backup

    columns = columns or backup.tables(conn)
    instead = instead or {}
    found = {}
    with conn.transaction():
        conn.execute(backup.CANONICAL)
        for table, names in columns.items():
            row = sql.SQL(", ").join(instead.get((table, c), sql.Identifier(c)) for c in names)
            query = sql.SQL("SELECT ROW({})::text AS r FROM {}").format(row, sql.Identifier(table))
            found[table] = Counter(r["r"] for r in conn.execute(query).fetchall())
    return found


SHAPE = {
    "column": """
        SELECT c.relname AS t, a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END || ' ' || a.attgenerated::text || ' '
               || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS d
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') AND a.attnum > 0
          AND NOT a.attisdropped""",
    "index": """SELECT tablename AS t, indexdef AS d FROM pg_indexes WHERE schemaname = current_schema()""",
    "constraint": """
        SELECT c.relname AS t, k.conname || ' ' || pg_get_constraintdef(k.oid) AS d
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid WHERE c.relnamespace = current_schema()::regnamespace""",
    "trigger": """
        SELECT c.relname AS t, pg_get_triggerdef(g.oid) AS d FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
        WHERE c.relnamespace = current_schema()::regnamespace AND NOT g.tgisinternal
          AND g.tgname NOT LIKE 'memctl\\_test\\_%'""",
    "policy": """
        SELECT tablename AS t, policyname || ' ' || cmd || ' ' || coalesce(qual, '') || ' ' || coalesce(with_check, '')
               AS d FROM pg_policies WHERE schemaname = current_schema()""",
    "security": """
        SELECT relname AS t, relrowsecurity::text AS d FROM pg_class
        WHERE relnamespace = current_schema()::regnamespace AND relkind IN ('r', 'p')""",
    "function": """
        SELECT p.proname AS t, md5(p.prosrc) || ' ' || p.prosecdef::text || ' ' || p.provolatile::text || ' '
               || coalesce(array_to_string(p.proconfig, ','), '') AS d
        FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace AND p.proname NOT LIKE 'memctl\\_test\\_%'
          AND NOT EXISTS (SELECT FROM pg_depend e WHERE e.objid = p.oid AND e.deptype = 'e')""",
}


def schema_shape(conn) -> dict[str, set]:
    """What the schema is made of, each kind a set of (table, definition): a model's vector table named V, its
    own name replaced by V in every definition, so two memories' vector tables of the same shape compare equal."""
    import re

    shape = {}
    for kind, query in SHAPE.items():
        found = set()
        for row in conn.execute(query).fetchall():
            table, text = row["t"], row["d"]
            if table.startswith(VECTORS):
                text = text.replace(table, "V")
                table = "V"
            found.add((table, re.sub(r"vectors_\d+_[a-z0-9_]+?_\d+", "V", text)))
        shape[kind] = found
    return shape
