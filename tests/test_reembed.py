"""memctl reembed: the column swap on per-model tables, against an Ollama-protocol test server.

Models on the test server: "all-minilm" (384) and "nomic-embed-text" (768) are deterministic hash
stand-ins here (tests/ollama_server.py; all-minilm is replaced by a stand-in so these tests do not
load torch). Hash vectors bring texts that share words together, so with them a search can only
be asserted for queries that share words with their answer. `test_paraphrases_are_found_after_the_switch`
uses real meaning (see there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from memctl import db
from memctl.embedding import models
from memctl.reembed import reembed
from tests.conftest import local_embedder_installed
from tests.ollama_server import OllamaTestServer, _hash_fn

TOPICS = ["disk", "certificate", "replica", "backup", "nginx", "redis", "kafka", "dns"]


@pytest.fixture
def server():
    with OllamaTestServer() as running:
        running.add_model("all-minilm", 384, 256, _hash_fn("all-minilm", 384))
        running.add_model("wide-embed", 3000, 2048, _hash_fn("wide-embed", 3000))
        running.add_model("huge-embed", 5000, 2048, _hash_fn("huge-embed", 5000))
        yield running


def load(cli, n: int = 80) -> None:
    lines = [
        json.dumps(
            {
                "content": f"incident {i}: the {TOPICS[i % len(TOPICS)]} alarm on host{i} was resolved "
                f"by the on-call engineer after step {i % 5}"
            }
        )
        for i in range(n)
    ]
    assert cli("episode", "import", "-", input="\n".join(lines) + "\n").exit_code == 0


def counts(conn, model_id: int) -> dict:
    return conn.execute(
        """SELECT (SELECT count(*) FROM embed_queue WHERE model_id = %s) AS pending,
                                  (SELECT count(*) FROM chunks) AS chunks""",
        (model_id,),
    ).fetchone()


def episodes_heap(conn) -> dict:
    return conn.execute("""SELECT pg_relation_size('episodes') AS heap, pg_table_size('episodes') AS table_bytes,
        (SELECT array_agg(ctid::text || '/' || xmin::text ORDER BY id) FROM episodes) AS tuples""").fetchone()


def test_change_from_all_minilm_to_nomic_embed_text(cli, conn, server_env, server, tmp_path):
    load(cli)
    assert cli("embed").exit_code == 0
    original = episodes_heap(conn)

    started = cli("reembed", "start", "--model", "nomic-embed-text", "-f", "json")
    assert started.exit_code == 0, started.stderr
    new = models.by_state(conn, "backfill")
    assert (new.model, new.dims, new.storage) == ("nomic-embed-text", 768, "vector")
    assert started.json()["queued"] == counts(conn, new.id)["chunks"] == 80
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0  # idempotent

    # Part of the backfill; search meanwhile runs on the active model's vectors.
    partial = cli("reembed", "run", "--limit", "30", "--batch-size", "10", "-f", "json")
    assert partial.exit_code == 0, partial.stderr
    assert partial.json()["pending"] == 50 and partial.json()["index"] == "missing"
    status = cli("reembed", "status", "-f", "json").json()
    assert (status["state"], status["done"], status["total"], status["pending"]) == (
        "backfilling",
        30,
        80,
        50,
    )
    assert status["rate"] > 0 and status["eta_s"] > 0
    hits = cli(
        "episode", "search", "kafka alarm on host14", "--mode", "vector", "-f", "json"
    ).json()
    assert (
        hits and hits[0]["id"] == 15
    )  # episode ids start at 1; incident 14 is about kafka on host14

    # A write during the backfill is queued for both models.
    new_id = int(cli("episode", "add", "the kafka consumer lag alarm was a false positive").stdout)
    queued = conn.execute(
        """SELECT array_agg(q.model_id ORDER BY q.model_id) AS m FROM embed_queue q
        JOIN chunks c ON c.agent = q.agent AND c.id = q.chunk_id WHERE c.episode_id = %s""",
        (new_id,),
    ).fetchone()
    assert queued["m"] == sorted([models.active(conn).id, new.id])
    before = episodes_heap(conn)

    refused = cli("reembed", "switch")
    assert (
        refused.exit_code == 1
        and "still queued" in refused.stderr
        and "index is missing" in refused.stderr
    )

    finished = cli("reembed", "run", "--batch-size", "16", "--progress", "-f", "json")
    assert finished.exit_code == 0, finished.stderr
    assert "ETA" in finished.stderr and "building the HNSW index" in finished.stderr
    assert finished.json()["pending"] == 0 and finished.json()["index"] == "built"
    assert cli("embed").exit_code == 0  # the active model's share of the write
    status = cli("reembed", "status", "-f", "json").json()
    assert (status["state"], status["done"], status["total"], status["index"]) == (
        "ready",
        81,
        81,
        "valid",
    )

    compared = cli("reembed", "compare", "--sample", "5", "-k", "5", "-f", "json")
    assert compared.exit_code == 0, compared.stderr
    result = compared.json()
    assert result["queries"] == 5 and len(result["rows"]) == 5
    assert all(0.0 <= r["overlap"] <= 1.0 and len(r["new_top"]) == 5 for r in result["rows"])
    assert result["mean_overlap"] == pytest.approx(
        sum(r["overlap"] for r in result["rows"]) / 5, abs=0.001
    )

    # Templated incidents: known items built from them cannot judge a switch (reembed.quality.JUDGE_FLOOR); the
    # operator's own do.
    assert "cannot judge" in cli("reembed", "switch").stderr
    known = tmp_path / "known.jsonl"
    known.write_text(
        "".join(
            json.dumps(
                {"query": f"{TOPICS[i % len(TOPICS)]} alarm on host{i}", "episodes": [i + 1]}
            )
            + "\n"
            for i in range(0, 80, 8)
        )
    )
    switched = cli("reembed", "switch", "--queries", str(known), "-f", "json")
    assert switched.exit_code == 0, switched.stderr
    assert "MEMCTL_EMBEDDER=ollama MEMCTL_EMBED_MODEL=nomic-embed-text" in switched.stderr
    assert models.active(conn).model == "nomic-embed-text"
    assert [m.state for m in models.all_models(conn)] == ["retired", "active"]

    # A process still configured with the old model follows the database, with one warning line.
    stale = cli("episode", "search", "kafka alarm on host14", "--mode", "vector", "-f", "json")
    assert stale.exit_code == 0, stale.stderr
    assert (
        stale.stderr.count("memctl:") == 1 and "MEMCTL_EMBED_MODEL=nomic-embed-text" in stale.stderr
    )
    assert stale.json()[0]["id"] == 15
    assert server.embed_requests()[-1][1] == "nomic-embed-text"  # embedded by the database's model
    after_env = {"MEMCTL_EMBED_MODEL": "nomic-embed-text"}
    found = cli(
        "episode",
        "search",
        "kafka alarm on host14",
        "--mode",
        "vector",
        "-f",
        "json",
        env=after_env,
    )
    assert found.exit_code == 0, found.stderr
    assert found.json()[0]["id"] == 15 and found.stderr == ""
    assert (
        server.embed_requests()[-1][1] == "nomic-embed-text"
    )  # the query was embedded by the new model

    old = models.by_state(conn, "retired")
    size = conn.execute("SELECT pg_total_relation_size(%s) AS n", (old.table_name,)).fetchone()["n"]
    dropped = cli("reembed", "drop-old", "-f", "json")
    assert dropped.exit_code == 0
    assert dropped.json() == [
        {"model": old.label, "state": "retired", "relation": old.table_name, "bytes_returned": size}
    ]
    assert conn.execute("SELECT to_regclass(%s) AS t", (old.table_name,)).fetchone()["t"] is None
    assert cli("reembed", "status", "-f", "json").json()["state"] == "idle"

    after = episodes_heap(conn)
    assert after == before  # the episodes table was never rewritten
    assert after["tuples"][:80] == original["tuples"]

    # Writes and the embed worker still configured with the old model: the database's model.
    assert cli("episode", "add", "kafka alarm again on host14").exit_code == 0
    worker = cli("embed", "-f", "json")
    assert worker.exit_code == 0, worker.stderr
    assert worker.json()[0]["chunks"] == 1 and "nomic-embed-text" in worker.json()[0]["model"]
    assert server.embed_requests()[-1][1] == "nomic-embed-text" and "reembed start" in worker.stderr


def test_dimensions_hnsw_cannot_index_are_refused(cli, conn, server_env):
    load(cli, 5)
    assert cli("embed").exit_code == 0
    huge = cli("reembed", "start", "--model", "huge-embed")
    assert huge.exit_code == 2
    assert (
        "5000 dimensions" in huge.stderr
        and "not even as halfvec" in huge.stderr
        and "--dims" in huge.stderr
    )
    huge_half = cli("reembed", "start", "--model", "huge-embed", "--halfvec")
    assert huge_half.exit_code == 2 and "even as halfvec" in huge_half.stderr
    wide = cli("reembed", "start", "--model", "wide-embed")
    assert wide.exit_code == 2 and "--halfvec" in wide.stderr
    assert len(models.all_models(conn)) == 1  # nothing was created

    reduced = cli("reembed", "start", "--model", "huge-embed", "--dims", "1024", "-f", "json")
    assert reduced.exit_code == 0, reduced.stderr
    model = models.by_state(conn, "backfill")
    assert (model.dims, model.request_dims, model.storage) == (1024, 1024, "vector")
    assert cli("reembed", "run", "-f", "json").json()["index"] == "built"
    aborted = cli("reembed", "abort", "-f", "json")
    assert aborted.exit_code == 0 and aborted.json()["bytes_returned"] > 0
    assert conn.execute("SELECT to_regclass(%s) AS t", (model.table_name,)).fetchone()["t"] is None

    half = cli("reembed", "start", "--model", "wide-embed", "--halfvec", "-f", "json")
    assert half.exit_code == 0, half.stderr
    assert models.by_state(conn, "backfill").storage == "halfvec"


def test_start_refuses_another_change_and_the_active_model(cli, server_env):
    load(cli, 3)
    assert cli("embed").exit_code == 0
    same = cli("reembed", "start", "--model", "all-minilm")
    assert same.exit_code == 2 and "already the active model" in same.stderr
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0
    other = cli("reembed", "start", "--model", "wide-embed", "--halfvec")
    assert other.exit_code == 1 and "already in progress" in other.stderr
    unknown = cli("reembed", "start", "--model", "no-such-model")
    assert unknown.exit_code == 1 and "not found" in unknown.stderr


def test_switch_needs_a_valid_index_and_run_rebuilds_an_invalid_one(cli, conn, server_env):
    load(cli, 10)
    assert cli("embed").exit_code == 0
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0
    assert cli("reembed", "run").exit_code == 0
    new = models.by_state(conn, "backfill")
    # What a build killed half-way leaves: an invalid index under the expected name.
    conn.execute(f"DROP INDEX {new.index_name}")
    with pytest.raises(Exception):
        conn.execute(
            f"CREATE UNIQUE INDEX CONCURRENTLY {new.index_name} ON {new.table_name} (agent)"
        )
    assert reembed.index_state(conn, new) == "invalid"
    refused = cli("reembed", "switch")
    assert refused.exit_code == 1 and "index is invalid" in refused.stderr
    assert cli("reembed", "status", "-f", "json").json()["state"] == "needs-index"
    rebuilt = cli("reembed", "run", "-f", "json")
    assert rebuilt.json()["index"] == "built" and reembed.index_state(conn, new) == "valid"
    assert (
        conn.execute(
            "SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = %s",
            (new.index_name,),
        ).fetchone()["amname"]
        == "hnsw"
    )
    assert cli("reembed", "switch").exit_code == 0


def test_switch_refuses_while_chunks_failed(cli, conn, server_env):
    load(cli, 4)
    assert cli("embed").exit_code == 0
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0
    new = models.by_state(conn, "backfill")
    conn.execute(
        """WITH moved AS (DELETE FROM embed_queue WHERE model_id = %s AND chunk_id =
                        (SELECT min(chunk_id) FROM embed_queue WHERE model_id = %s) RETURNING agent, chunk_id)
                    INSERT INTO embed_failures (model_id, agent, chunk_id, error) SELECT %s, agent, chunk_id, 'x'
                    FROM moved""",
        (new.id, new.id, new.id),
    )
    assert cli("reembed", "run").exit_code == 0
    refused = cli("reembed", "switch")
    assert refused.exit_code == 1 and "1 chunk(s) refused" in refused.stderr
    assert cli("reembed", "run", "--retry-failed", "-f", "json").json()["failed"] == 0
    assert cli("reembed", "switch").exit_code == 0


def test_index_build_warns_and_passes_on_the_maintenance_work_mem_notice(cli, conn, memctl_env):
    """Hash embedder (the test default): 600 chunks of 384 dims outgrow 1 MB of maintenance_work_mem."""
    lines = "\n".join(json.dumps({"content": f"note {i} about service {i}"}) for i in range(600))
    assert cli("episode", "import", "-", input=lines + "\n").exit_code == 0
    assert cli("embed").exit_code == 0
    assert cli("reembed", "start", "--embedder", "hash", "--model", "hash-two").exit_code == 0
    from memctl.config import load as load_settings

    warnings = []
    with db.connect(memctl_env["MEMCTL_DATABASE_URL"], vector=True) as own:
        own.execute("SET maintenance_work_mem = '1MB'")
        result = reembed.run(
            own.use_settings(load_settings()), batch_size=200, on_warning=warnings.append
        )
    assert result["index"] == "built" and result["warnings"] == warnings
    assert any("more than maintenance_work_mem (1 MiB)" in w for w in warnings)
    assert any(
        w.startswith("PostgreSQL: hnsw graph no longer fits into maintenance_work_mem")
        for w in warnings
    )


def test_run_survives_kill_9_and_resumes_without_double_work(cli, conn, server_env, server):
    n = 120
    load(cli, n)
    assert cli("embed").exit_code == 0
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0
    new = models.by_state(conn, "backfill")
    server.inject("slow", delay_s=0.05)
    proc = subprocess.Popen(
        [sys.executable, "-m", "memctl", "reembed", "run", "--batch-size", "5"],
        env={**os.environ, **server_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            done = reembed._vectors(conn, new)
            if done >= 20 or proc.poll() is not None:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    server.clear()
    done = reembed._vectors(conn, new)
    assert 20 <= done < n
    before = len(server.embed_requests())
    resumed = cli("reembed", "run", "--batch-size", "5", "-f", "json")
    assert resumed.exit_code == 0, resumed.stderr
    assert resumed.json()["chunks"] == n - done and resumed.json()["index"] == "built"
    sent = sum(
        count for _, model, count in server.embed_requests()[before:] if model == "nomic-embed-text"
    )
    assert sent == n - done  # every remaining chunk once; none embedded twice
    assert reembed._vectors(conn, new) == n and counts(conn, new.id)["pending"] == 0


@pytest.mark.local
@pytest.mark.skipif(
    not local_embedder_installed(), reason="needs the real all-MiniLM-L6-v2 (memctl[local])"
)
def test_paraphrases_are_found_after_the_switch(cli, conn, server_env, server):
    """Questions that share no key words with their answers, found by meaning after the switch.

    The new model is registered under the name nomic-embed-text, but its vectors are the real
    all-MiniLM-L6-v2's, zero-padded to 768 dims (the real nomic-embed-text cannot run here):
    the same meaning space in a different table and size. This shows that a switch carries
    meaning-based search over to the new model's table; it says nothing of nomic's own quality.
    The old model stays the word-hash stand-in, which cannot find these paraphrases. The stand-in
    reads nomic's instructions (search_query: / search_document: ) as nomic does, as a task, not as
    words of the text: all-MiniLM gets the text after them.
    """
    import re

    from memctl.embedding.local import LocalEmbedder

    local = LocalEmbedder()
    task = re.compile(r"^search_(query|document): ")
    server.add_model(
        "nomic-embed-text",
        768,
        2048,
        lambda texts: [
            v + [0.0] * 384 for v in local.embed([task.sub("", t) for t in texts]).vectors
        ],
        family="nomic-bert",
    )
    facts = [
        "The primary database ran out of storage because old logs were never rotated.",
        "Customers could not sign in after the TLS certificate expired on the load balancer.",
        "The nightly backup job was moved to 3am so it no longer slows the morning traffic.",
        "Our cloud bill doubled when someone left forty GPU machines running over the weekend.",
    ]
    questions = {
        "Why did the main DB fill its volume?": 1,
        "Why were clients unable to authenticate?": 2,
        "At what time does the archive task start?": 3,
        "Why did we pay so much for compute?": 4,
    }
    assert (
        cli(
            "episode",
            "import",
            "-",
            input="\n".join(json.dumps({"content": f}) for f in facts) + "\n",
        ).exit_code
        == 0
    )
    assert cli("embed").exit_code == 0

    def top(env=None) -> list[int]:
        return [
            cli(
                "episode",
                "search",
                q,
                "--mode",
                "vector",
                "-k",
                "1",
                "--no-track",
                "-f",
                "json",
                env=env,
            ).json()[0]["id"]
            for q in questions
        ]

    assert top() != list(questions.values())  # the word-hash model misses some
    assert cli("reembed", "start", "--model", "nomic-embed-text").exit_code == 0
    assert cli("reembed", "run").exit_code == 0
    assert cli("reembed", "switch").exit_code == 0
    assert top({"MEMCTL_EMBED_MODEL": "nomic-embed-text"}) == list(questions.values())
