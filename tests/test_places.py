"""Every place that holds memory text is declared once (memctl.places, DESIGN 14), held against the catalog; and a
digest of memory text that outlives its text is keyed, in the database, in exports and after sql/0024."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from memctl import db, places
from memctl.write import erased
from memctl.write.values import WRITER
from tests.fix_places import TEXT_TYPES


def undeclared(conn, places_of) -> list[str]:
    """Columns of a type that can hold text or a digest, of any table of memctl's schema, that memctl.places does
    not declare; and declared columns the catalog does not have."""
    vectors = {
        r["table_name"] for r in conn.execute("SELECT table_name FROM embedding_models").fetchall()
    }
    declared = {(t.name, c.name) for t in places.TABLES for c in t.columns}
    found = set()
    for col in places_of(conn).columns():
        table = "vectors" if col["table"] in vectors else col["table"]
        if col["type"] in TEXT_TYPES:
            found.add((table, col["column"]))
    declared |= {("vectors", c.name) for c in places.VECTORS.columns}
    return sorted(f"{t}.{c} undeclared" for t, c in found - declared) + sorted(
        f"{t}.{c} declared, not in the catalog"
        for t, c in declared - found
        if t != "vectors" or vectors
    )


def test_every_column_that_can_hold_memory_text_is_declared(cli, conn, places_of):
    assert cli("episode", "add", "a vector table for the model").exit_code == 0
    assert cli("embed").exit_code == 0  # the model's vector table exists now
    assert undeclared(conn, places_of) == []


def test_a_new_table_or_column_fails_until_it_is_declared(conn, places_of):
    conn.execute("CREATE TABLE agent_notes (agent text, body text)")
    conn.execute("ALTER TABLE episodes ADD COLUMN extra jsonb")
    conn.execute("ALTER TABLE jobs DROP COLUMN error")
    assert undeclared(conn, places_of) == [
        "agent_notes.agent undeclared",
        "agent_notes.body undeclared",
        "episodes.extra undeclared",
        "jobs.error declared, not in the catalog",
    ]


def test_the_declared_agent_tables_are_the_catalogs(cli, conn, places_of):
    """places.AGENT_TABLES (what the agents' wall keeps a role to, and where a migration looks for memory) is what the
    catalog says: every table with an agent or a namespace column, each model's vector table aside; the gate's
    MEMORY_TABLES are tables of the schema. A new table with such a column breaks the agreement until declared."""
    assert cli("episode", "add", "a vector table for the model").exit_code == 0
    assert cli("embed").exit_code == 0
    vectors = {
        r["table_name"] for r in conn.execute("SELECT table_name FROM embedding_models").fetchall()
    }
    catalog = set(places_of(conn).agent_tables())
    assert vectors and vectors <= catalog
    assert catalog - vectors == set(places.AGENT_TABLES)
    tables = {c["table"] for c in places_of(conn).columns()}
    assert set(places.MEMORY_TABLES) <= tables and set(places.AGENT_TABLES) <= tables
    conn.execute("CREATE TABLE agent_notes (agent text, body text)")
    assert set(places_of(conn).agent_tables()) - vectors - set(places.AGENT_TABLES) == {
        "agent_notes"
    }


def test_the_readers_read_the_declaration():
    from memctl.backup import erasure
    from memctl.records import redact_scan

    for table in places.TABLES:  # every text an erasure or verify tests is scanned for secrets too
        texts = {
            c.name for c in table.columns if c.rule in (places.WHOLE, places.VALUE, places.QUOTE)
        }
        assert texts <= set(table.scanned), table.name
        assert set(table.scanned) <= {c.name for c in table.columns}, table.name
    assert set(redact_scan.SOURCES) == {t.name for t in places.TABLES if t.scanned}
    tested = {
        (t.name, c.name) for rule in (places.WHOLE, places.QUOTE) for t, c in places.places(rule)
    }
    assert len(erasure._place_queries()) == len(tested) >= 5
    plain = {
        (t.name, c.name)
        for t in places.TABLES
        for c in t.columns
        if c.rule == places.ROW and "sha256" in c.why
    }
    assert plain == {
        ("episodes", "content_hash"),
        ("episodes", "norm_hash"),
        ("episodes", "record_key"),
        ("chunks", "content_hash"),
    }


def test_an_export_keeps_no_plain_digest_of_a_text(cli, conn, ollama_env, ollama, tmp_path):
    from pathlib import Path

    Path(ollama_env["MEMCTL_CONFIG"]).write_text(
        '[retention]\nraw = "30d"\n[summarize]\nmodel = "llama3.2:3b"\n'
    )
    texts = [f"Worker {i} restarted after error E{i}." for i in range(3)]
    rows = [
        {"content": t, "kind": "raw", "created_at": f"2020-01-0{i + 1}T09:00:00Z"}
        for i, t in enumerate(texts)
    ]
    assert (
        cli("episode", "import", "-", input="".join(json.dumps(r) + "\n" for r in rows)).exit_code
        == 0
    )
    assert cli("summarize").exit_code == 0
    out = cli("export")
    assert out.exit_code == 0
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    key = erased.load_key(create=False)
    assert lines[0]["digest_key"] == places.key_id(key)
    lineage = [r for r in lines if r["type"] == "summary_source"]
    assert len(lineage) == 3
    plain = {hashlib.sha256(t.encode()).hexdigest() for t in texts}
    assert not any(d in out.stdout for d in plain)
    assert {r["source_hash"] for r in lineage} == {
        places.lineage_digest(key, hashlib.sha256(t.encode()).digest()).hex() for t in texts
    }

    # An export written before lineage was keyed (plain digests, no digest_key): rekeyed on the way in.
    old = [dict(r) for r in lines]
    del old[0]["digest_key"]
    for r in old:
        if r["type"] == "summary_source":
            r["source_hash"] = hashlib.sha256(
                next(
                    t
                    for t in texts
                    if places.lineage_digest(key, hashlib.sha256(t.encode()).digest()).hex()
                    == r["source_hash"]
                ).encode()
            ).hexdigest()
    conn.execute("DELETE FROM episodes")  # memory lost, not erased
    done = cli("import", "-", "-f", "json", input="".join(json.dumps(r) + "\n" for r in old))
    assert done.exit_code == 0 and done.json()[0]["summary_sources"] == 3, done.stderr
    stored = {
        bytes(r["source_hash"]).hex()
        for r in conn.execute("SELECT source_hash FROM summary_sources")
    }
    assert stored == {r["source_hash"] for r in lineage}


def _older(tmp_path):
    from memctl.db import migrate

    older = tmp_path / "sql"
    older.mkdir()
    for m in migrate.read_files():
        if m.name < "0024":
            shutil.copy(m.path, older / m.name)
    return older


LINEAGE = [
    WRITER + "INSERT INTO episodes (agent, content, content_hash, importance) VALUES "
    "('default', 'a source', sha256('a source'::bytea), 5), ('default', 'the summary', sha256('x'::bytea), 5)",
    WRITER
    + "INSERT INTO summary_sources (agent, summary_id, source_id, source_created_at, source_hash) "
    "SELECT 'default', max(id), min(id), now(), sha256('a source'::bytea) FROM episodes",
]


def test_sql_0024_rekeys_plain_lineage_digests_and_refuses_without_the_key(
    empty_db_url, tmp_path, cli, memctl_env
):
    import psycopg

    from memctl.db import migrate

    with db.connect(empty_db_url) as conn:
        migrate.apply(conn, _older(tmp_path))
        for statement in LINEAGE:
            conn.execute(statement)
        with pytest.raises(psycopg.errors.RaiseException, match="run memctl db migrate"):
            migrate.apply(conn)
        assert (
            bytes(conn.execute("SELECT source_hash FROM summary_sources").fetchone()["source_hash"])
            == hashlib.sha256(b"a source").digest()
        )  # nothing changed
    out = cli("db", "migrate", env={"MEMCTL_DATABASE_URL": empty_db_url})
    assert out.exit_code == 0, out.stderr
    key = erased.load_key(create=False)
    with db.connect(empty_db_url) as conn:
        stored = bytes(
            conn.execute("SELECT source_hash FROM summary_sources").fetchone()["source_hash"]
        )
        assert stored == places.lineage_digest(key, hashlib.sha256(b"a source").digest())
        assert conn.execute("SELECT count(*) AS n FROM summary_sources").fetchone()["n"] == 1


def test_the_key_is_given_to_migrations_only_while_they_run(conn):
    key = os.urandom(32)
    with places.key_for_migrations(conn, key):
        assert (
            conn.execute("SELECT current_setting('memctl.digest_ipad') AS p").fetchone()["p"]
            == places.pads(key)[0].hex()
        )
    assert (
        conn.execute("SELECT current_setting('memctl.digest_ipad', true) AS p").fetchone()["p"]
        == ""
    )
