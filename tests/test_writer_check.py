"""The writer check (tests/conftest.py, docs/testing.md): every test database refuses a write to a memory table
whose statement does not carry memctl's writer marker, however the statement is spelled.

tests/test_gate.py reads the library's source for INSERT and COPY statements; a spelling it cannot read (a
concatenation, a quoted or schema-qualified name, an identifier composed with psycopg.sql, MERGE, UPDATE) is
caught here at run time, by the same trigger every other test's database carries: a test that reaches such a
write fails with the statement quoted.
"""

from __future__ import annotations

import datetime

import psycopg
import pytest
from psycopg import sql

from memctl import places
from memctl.write import store
from memctl.write.values import WRITER
from tests.conftest import WRITER_REFUSED

TABLE = "facts"
ROW = "(namespace, key, value, version) VALUES ('default', 'db.password', 'hunter2', 1)"


def _spellings(schema: str) -> dict[str, object]:
    table = TABLE
    return {
        "concatenated": "INSERT INTO " + "facts " + ROW,
        "quoted": 'INSERT INTO "facts" ' + ROW,
        "merge": (
            "MERGE INTO facts f USING (SELECT 'default' AS ns, 'db.password' AS k) s "
            "ON f.namespace = s.ns AND f.key = s.k "
            "WHEN NOT MATCHED THEN INSERT (namespace, key, value, version) VALUES (s.ns, s.k, 'hunter2', 1)"
        ),
        "f-string": f"INSERT INTO {table} {ROW}",
        "psycopg.sql": sql.SQL("INSERT INTO {} " + ROW).format(sql.Identifier(table)),
        "schema-qualified": f"INSERT INTO {schema} . facts {ROW}",
        "update": "UPDATE facts SET value = 'hunter2'",
        "truncate": "TRUNCATE facts",
        "lower case": "insert into facts " + ROW.lower().replace("'db.password'", "'x'"),
    }


def _schema(conn) -> str:
    return conn.execute("SELECT current_schema() AS s").fetchone()["s"]


def _refused(conn, write) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        with conn.transaction():
            write()
    assert caught.value.sqlstate == WRITER_REFUSED, caught.value
    assert "without the writer marker" in str(caught.value)
    return caught.value


def _a_fact(conn) -> None:
    """One fact written by the store (the writer check lets it through): an UPDATE then has a row to change."""
    from memctl import config, redact
    from memctl.write import gate

    admit = gate.Gate(conn, config.load(), redact.Redactor("off"))
    fact = admit.fact("default", "db.host", "10.0.0.9", None)
    with admit.writing():
        store.put_fact(conn, fact, 1)


@pytest.mark.parametrize("spelling", list(_spellings("public")))
def test_every_spelling_of_a_write_around_the_store_is_refused(conn, memctl_env, spelling):
    _a_fact(conn)
    statement = _spellings(_schema(conn))[spelling]
    error = _refused(conn, lambda: conn.execute(statement))
    assert "facts" in str(error)
    assert (
        conn.execute(
            "SELECT count(*) AS n FROM facts WHERE value = 'hunter2' OR key = 'x'"
        ).fetchone()["n"]
        == 0
    )
    assert conn.execute("SELECT value FROM facts").fetchone()["value"] == "10.0.0.9"


def test_a_copy_around_the_store_is_refused(conn):
    def copy():
        with (
            conn.cursor() as cur,
            cur.copy("COPY facts (namespace, key, value, version) FROM STDIN") as into,
        ):
            into.write_row(("default", "db.password", "hunter2", 1))

    _refused(conn, copy)
    assert conn.execute("SELECT count(*) AS n FROM facts").fetchone()["n"] == 0


def test_a_side_door_in_a_module_of_its_own_is_refused(conn, tmp_path, monkeypatch):
    """A scratch module, as a new library path would be: its write fails the test that reaches it."""
    (tmp_path / "side_door.py").write_text(
        "from psycopg import sql\n\n"
        "def remember(conn, text):\n"
        "    conn.execute(sql.SQL('INSERT INTO {} (agent, kind, content, content_hash) VALUES (%s, %s, %s, %s)')\n"
        "                 .format(sql.Identifier('episodes')), ('default', 'observation', text, b'x'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import side_door

    _refused(
        conn, lambda: side_door.remember(conn, "token ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt")
    )
    assert conn.execute("SELECT count(*) AS n FROM episodes").fetchone()["n"] == 0


def test_every_memory_table_carries_the_check(conn):
    rows = conn.execute(
        "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        "WHERE t.tgname = 'memctl_test_writer'"
    ).fetchall()
    assert {r["relname"] for r in rows} == set(places.MEMORY_TABLES)


def test_the_marker_is_what_lets_a_write_through(conn):
    """The check is the marker, not the table: the same statement with it passes (so a statement outside the store
    must not carry it: tests/test_gate.py checks where the marker appears)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    conn.execute(
        WRITER + "INSERT INTO blocked_sources (source, reason, blocked_at) VALUES ('s', NULL, %s)",
        (now,),
    )
    assert conn.execute("SELECT count(*) AS n FROM blocked_sources").fetchone()["n"] == 1
    _refused(conn, lambda: conn.execute("INSERT INTO blocked_sources (source) VALUES ('t')"))
