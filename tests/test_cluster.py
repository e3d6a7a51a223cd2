"""memctl on a Citus cluster: `db distribute` and what runs there.

Needs a running cluster: MEMCTL_TEST_CITUS_URL names its coordinator (tests/ci/citus.sh starts one
and prints the URL); skipped otherwise. Each test starts from a database without memctl's tables.
The refusal on a server without Citus runs on the ordinary test server.
"""

from __future__ import annotations

import json
import os

import psycopg
import pytest
from psycopg import sql

from memctl import cluster, db, migrate

CITUS_URL = os.environ.get("MEMCTL_TEST_CITUS_URL")
needs_cluster = pytest.mark.skipif(not CITUS_URL, reason="needs a Citus cluster: set MEMCTL_TEST_CITUS_URL to its "
                                                         "coordinator (bash tests/ci/citus.sh prints one)")


def test_db_distribute_refuses_a_server_without_citus(cli):
    refused = cli("db", "distribute")
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "not a Citus database: the extension citus is not created here" in refused.stderr


def test_distribute_refuses_a_server_without_citus(conn):
    with pytest.raises(cluster.NotCitus, match="extension citus is not created"):
        cluster.distribute(conn)
    assert cluster.adopt(conn, "chunks") is False  # one server: nothing to adopt into


SETTINGS = "SELECT DISTINCT current_setting('hnsw.ef_search', true) AS ef, " \
           "current_setting('hnsw.iterative_scan', true) AS scan FROM {} WHERE {}"


def test_scan_settings_apply_on_one_server(conn):
    with conn.transaction():
        cluster.set_scan(conn, 7)
        rows = conn.execute(sql.SQL(SETTINGS).format(sql.SQL("(VALUES (1)) v(x)"), sql.SQL("true"))).fetchall()
    assert rows == [{"ef": "7", "scan": "relaxed_order"}]


def _drop_memctl_tables(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')")]
        if tables:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                sql.SQL(", ").join(map(sql.Identifier, tables))))


@pytest.fixture
def citus(monkeypatch, tmp_path):
    _drop_memctl_tables(CITUS_URL)
    for key, value in {"MEMCTL_DATABASE_URL": CITUS_URL, "MEMCTL_CONFIG": str(tmp_path / "config.toml"),
                       "MEMCTL_EMBEDDER": "hash", "MEMCTL_EMBED_MODEL": "hash-embed"}.items():
        monkeypatch.setenv(key, value)
    yield CITUS_URL
    _drop_memctl_tables(CITUS_URL)


def _cli(*args: str):
    from typer.testing import CliRunner

    from memctl.cli import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result


def _tables(conn) -> dict[str, dict]:
    rows = conn.execute("SELECT table_name::text AS name, citus_table_type AS type, distribution_column AS col, "
                        "colocation_id FROM citus_tables").fetchall()
    return {r["name"]: r for r in rows}


@needs_cluster
def test_distribute_places_every_table_and_keeps_the_data(citus):
    _cli("db", "migrate")
    ids = [int(_cli("episode", "add", f"disk full on db0{i}, rotated logs", "--agent", f"agent{i}").stdout)
           for i in range(4)]
    _cli("embed")
    first = [cluster.Placement(**row) for row in json.loads(_cli("db", "distribute", "-f", "json").stdout)]
    assert {p.action for p in first if p.type != "coordinator"} == {"done"}
    with db.connect(citus) as conn:
        assert {p.table for p in first if p.type == "coordinator"} == {"facts", "fact_history", "jobs"}
        again = cluster.distribute(conn)
        assert [(p.table, p.action) for p in again] == [
            (p.table, "kept" if p.type == "coordinator" else "already") for p in first]
        tables = _tables(conn)
        vectors = conn.execute("SELECT table_name FROM embedding_models WHERE state = 'active'").fetchone()
        for name in ("episodes", "chunks", vectors["table_name"], "embed_queue", "episode_access"):
            assert tables[name]["type"] == "distributed" and tables[name]["col"] == "agent", name
            assert tables[name]["colocation_id"] == tables["episodes"]["colocation_id"], name
        for name in ("embedding_models", "memctl_migrations", "blocked_sources"):
            assert tables[name]["type"] == "reference", name
        for name in ("episodes", "chunks", "embedding_models"):  # the coordinator's shells hold no rows
            assert conn.execute("SELECT pg_relation_size(%s) AS n", (name,)).fetchone()["n"] == 0, name
        assert conn.execute("SELECT count(*) AS n FROM embedding_models").fetchone()["n"] == 1
        migrate.ensure_current(conn, auto=False)
    # vector search (the hash embedder: the same text is the nearest vector), routed and fanned out
    text = "disk full on db02, rotated logs"
    routed = _cli("episode", "search", text, "--mode", "vector", "--agent", "agent2", "-f", "json").stdout
    assert [h["id"] for h in json.loads(routed)] == [ids[2]]
    fanned = _cli("episode", "search", text, "--mode", "vector", "-k", "4", "-f", "json").stdout
    assert sorted(h["id"] for h in json.loads(fanned)) == sorted(ids)
    assert json.loads(fanned)[0]["id"] == ids[2]
    with db.connect(citus) as conn:  # both searches counted their hits (an INSERT ... SELECT on the shards)
        counts = {r["episode_id"]: r["access_count"] for r in conn.execute("SELECT * FROM episode_access")}
    assert counts == {ids[0]: 1, ids[1]: 1, ids[2]: 2, ids[3]: 1}
    # what memctl writes after distributing lands on the shards too
    later = int(_cli("episode", "add", "disk full on db09", "--agent", "agent9").stdout)
    with db.connect(citus) as conn:
        assert conn.execute("SELECT agent FROM episodes WHERE id = %s", (later,)).fetchone()["agent"] == "agent9"
        assert conn.execute("SELECT pg_relation_size('episodes') AS n").fetchone()["n"] == 0


@needs_cluster
def test_a_vector_query_filtered_by_agent_is_routed_to_one_shard(citus):
    _cli("db", "migrate")
    for agent in ("ops", "dev", "qa"):
        _cli("episode", "add", f"certificate expired for {agent}", "--agent", agent)
    _cli("embed")
    with db.connect(citus) as conn:
        cluster.distribute(conn)
        table = sql.Identifier(conn.execute(
            "SELECT table_name FROM embedding_models WHERE state = 'active'").fetchone()["table_name"])
        query = sql.SQL("EXPLAIN SELECT chunk_id FROM {} v WHERE {} ORDER BY v.embedding <=> "
                        "(SELECT embedding FROM {} LIMIT 1) LIMIT 5")
        routed = "\n".join(r["QUERY PLAN"] for r in conn.execute(
            query.format(table, sql.SQL("agent = 'ops'"), table)))
        assert "Task Count: 1\n" in routed, routed
        fanned = "\n".join(r["QUERY PLAN"] for r in conn.execute(query.format(table, sql.SQL("true"), table)))
        assert "Task Count: 1\n" not in fanned, fanned


@needs_cluster
def test_scan_settings_reach_the_shards(citus):
    _cli("db", "migrate")
    for agent in ("ops", "dev", "qa"):
        _cli("episode", "add", f"certificate expired for {agent}", "--agent", agent)
    with db.connect(citus) as conn:
        cluster.distribute(conn)
        for where in ("agent = 'ops'", "true"):  # routed to one shard, fanned out to all
            query = sql.SQL(SETTINGS).format(sql.Identifier("episodes"), sql.SQL(where))
            with conn.transaction():
                conn.execute("SELECT set_config('hnsw.ef_search', '7', true)")
                assert conn.execute(query).fetchall() != [{"ef": "7", "scan": "relaxed_order"}]  # not forwarded
            with conn.transaction():
                cluster.set_scan(conn, 7)
                assert conn.execute(query).fetchall() == [{"ef": "7", "scan": "relaxed_order"}], where


@needs_cluster
def test_node_sizes_add_up_to_the_cluster_totals(citus):
    _cli("db", "migrate")
    for i in range(40):
        _cli("episode", "add", f"disk full on db{i:02d}, rotated logs " + "x" * 400, "--agent", f"agent{i % 7}")
    _cli("embed")
    with db.connect(citus) as conn:
        cluster.distribute(conn)
        rows = cluster.node_sizes(conn)
        nodes = {r["node"] for r in rows if r["table"] == "episodes"}
        assert len(nodes) == 2, rows  # the shards are on the two workers
        for table in ("episodes", "chunks"):
            assert sum(r["bytes"] for r in rows if r["table"] == table) == cluster.total_size(conn, table)
            assert sum(r["shards"] for r in rows if r["table"] == table) == 32  # citus.shard_count's default
        assert conn.execute("SELECT pg_total_relation_size('episodes') AS n").fetchone()["n"] < \
            cluster.total_size(conn, "episodes")  # the coordinator's shell is not the data


@needs_cluster
def test_adopt_distributes_a_model_table_made_after_distribute(citus, monkeypatch):
    _cli("db", "migrate")
    _cli("episode", "add", "disk full on db01", "--agent", "ops")
    _cli("embed")
    with db.connect(citus) as conn:
        cluster.distribute(conn)
    monkeypatch.setenv("MEMCTL_EMBED_MODEL", "hash-embed-2")
    _cli("reembed", "start")  # creates the new model's vector table as a plain table: reembed does not adopt it yet
    with db.connect(citus) as conn:
        new = conn.execute("SELECT table_name FROM embedding_models WHERE state = 'backfill'").fetchone()["table_name"]
        assert cluster.adopt(conn, new)
        tables = _tables(conn)
        assert tables[new]["type"] == "distributed" and tables[new]["col"] == "agent"
        assert tables[new]["colocation_id"] == tables["episodes"]["colocation_id"]
        assert {p.action for p in cluster.distribute(conn)} <= {"already", "kept"}
