"""Every earlier memory comes through whole (DESIGN.md decision 15): a memory made by memctl at each schema state main
has had (tests/data/upgrade, built from those commits by its build.py) is restored into a fresh database and migrated
with today's code. Every row that was there is there with the same values (times and vectors included), nothing is
queued again for embedding, what its searches found is found, the schema is the one a fresh database gets (so the
fix-ups of edited migrations make what the released files make), and a second migrate changes nothing."""

from __future__ import annotations

import pytest

from memctl import config, db
from memctl import places
from memctl.db import migrate
from memctl.upgrade import migrating
from memctl.write import erased
from tests.conftest import fresh_database
from tests.fix_upgrade import fixture_records, schema_shape, table_rows

RECORDS = fixture_records()
EDITED = {"0002_episodes.sql", "0019_agents.sql", "0022_agent_text_matches.sql"}


def test_there_is_a_fixture_for_every_schema_state():
    """The fixtures cover each state build.py declares, and every released migration's every content."""
    from tests.data.upgrade import build

    assert [r["name"] for r in RECORDS] == [commit for commit, _ in build.COMMITS]
    assert {r["sql"][-1] for r in RECORDS} >= {"0022_agent_text_matches.sql", "0002_episodes.sql"}


def _migrated(url: str, record: dict):
    """(rows before, rows after, the migrations applied) of the fixture's memory."""
    with db.connect(url) as conn:
        before_columns = {t: cols for t, cols in _columns(conn).items()}
        lineage = "source_hash" in before_columns.get("summary_sources", [])
        before = table_rows(conn, before_columns, _keyed() if lineage else None)
        applied = migrating.apply(conn)
        after = table_rows(conn, before_columns)
    return before, after, applied


def _keyed() -> dict:
    """Summary lineage's plain sha256 of each source as sql/0024 leaves it: keyed under the erasure key."""
    from psycopg import sql

    ipad, opad = places.pads(erased.load_key())
    keyed = (
        places.lineage_sql("source_hash")
        .replace("%(opad)s", "{opad}")
        .replace("%(ipad)s", "{ipad}")
    )
    return {
        ("summary_sources", "source_hash"): sql.SQL(keyed).format(
            ipad=sql.Literal(ipad), opad=sql.Literal(opad)
        )
    }


def _columns(conn) -> dict[str, list[str]]:
    from memctl.backup import backup

    found = backup.tables(conn)
    # the record of each migration keeps its name and time; a fix-up rewrites an edited file's checksum
    found["memctl_migrations"] = ["name", "applied_at"]
    return found


def _fresh_with_models(pg_server, models: list[dict]):
    """A fresh migrated database with vector tables of the same models (hash vectors of the same size)."""
    from memctl.embedding import models as models_mod
    from memctl.embedding.embedders import HashEmbedder

    context = fresh_database(pg_server)
    url = context.__enter__()
    with db.connect(url) as conn:
        for m in models:
            models_mod.register(
                conn, HashEmbedder(m["model"], m["dims"]), state=m["state"], storage=m["storage"]
            )
    return context, url


@pytest.mark.parametrize("record", RECORDS, ids=[r["name"] for r in RECORDS])
def test_an_earlier_memory_migrates_whole(record, restored, pg_server):
    url = restored(record)
    before, after, applied = _migrated(url, record)
    assert applied, "the fixture's schema is older than today's"
    for table, rows in before.items():
        if table == "memctl_migrations":  # the new ones besides
            assert after[table] >= rows, f"{record['name']}: a migration's record changed"
        else:
            assert after[table] == rows, f"{record['name']}: {table} differs after the migration"
    assert sum(len(r) for r in before.values()) >= sum(record["rows"].values()) - record[
        "rows"
    ].get("memctl_migrations", 0)
    with db.connect(url) as conn:
        assert conn.execute("SELECT count(*) AS n FROM embed_queue").fetchone()["n"] == 0, (
            "queued again for embedding"
        )
        models = conn.execute(
            "SELECT model, dims, storage, state FROM embedding_models ORDER BY id"
        ).fetchall()
        shape = schema_shape(conn)
        fixed = {
            r["name"]
            for r in conn.execute("SELECT name FROM memctl_migrations WHERE fixed_from IS NOT NULL")
        }
        assert migrate.apply(conn) == [], "a second migrate ran something"
        again = table_rows(conn)
    with db.connect(url) as conn:
        assert table_rows(conn) == again
    context, fresh = _fresh_with_models(pg_server, models)
    try:
        with db.connect(fresh) as conn:
            expected = schema_shape(conn)
    finally:
        context.__exit__(None, None, None)
    for kind in expected:
        assert shape[kind] == expected[kind], (
            f"{record['name']}: {kind}s differ from a fresh database's: "
            f"only migrated {shape[kind] - expected[kind]}, "
            f"only fresh {expected[kind] - shape[kind]}"
        )
    assert fixed <= EDITED


@pytest.mark.parametrize(
    "record", [r for r in RECORDS if r.get("searches")], ids=lambda r: r["name"]
)
def test_what_an_earlier_memctl_found_is_found(record, restored):
    """Each search its memctl ran (vector, text and hybrid where it had modes) finds today every episode it found,
    in that mode (a vector or a text index lost in the migration would hide them), without falling back to words,
    the fixture's model embedding today's query as the test server embedded theirs. Ranks are not compared: how
    relevance, recency and importance are weighed has changed since."""
    from memctl.embedding.embedders import HashEmbedder
    from memctl.reading import query as query_mod, search as search_mod

    url = restored(record)
    settings = config.load(None, environ={})
    with db.connect(url) as conn:
        migrating.apply(conn)
        db.register_vector(conn)
        active = conn.execute(
            "SELECT model, dims FROM embedding_models WHERE state = 'active'"
        ).fetchone()
        embedder = HashEmbedder(active["model"], active["dims"]) if active else None
        for search in record["searches"]:
            q = query_mod.Query(search["query"], k=10, mode=search["mode"])
            outcome = search_mod.search(conn.use_settings(settings), q, embedder=embedder)
            found = [hit.id for hit in outcome.hits]
            assert outcome.warning is None and set(search["ids"]) <= set(found), (
                f"{search}: today {found}"
            )
