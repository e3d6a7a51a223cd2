"""Hybrid search latency and filtered recall at 100k episodes.

Loads N episodes (synthetic operations text; 10 agents, so one agent is 10%
of rows) with one 384-dim vector each (clustered random unit vectors: the
query vector is given, so no embedder is involved) and an HNSW index. Then:

- search: `memctl.search.search` (hybrid, query vector given) p50 / p95 ÷ the
  raw SQL of its two halves (the same vector and text statements run directly).
  Goal: p50 ratio <= 1.5.
- filtered recall: HNSW top-10 with an agent filter selecting 10% of rows (as
  memctl runs it: iterative scan) ÷ exact top-10 (index scans off). Goal >= 0.95.
  The same without iterative scan is printed for contrast.

    python tests/bench/search.py [--episodes 100000] [--queries 50]
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np

from _common import fresh_database, parser, percentile, server

WORDS = ("deploy disk full nginx logs rotated postgres replica lag redis eviction memory pressure queue backlog "
         "consumer scaled certificate renewal backup restore latency index customer refund release freeze kernel "
         "reboot dns resolver webhook secret gateway rate limit vpn session heap mapping cron upload path pipeline "
         "tests serial parallel alert health check reload warehouse dashboard stale bastion hardware key").split()
DIMS = 384
VOCABULARY = WORDS + [f"term{i}" for i in range(5000)]
# Zipf-like word frequencies, so a query matches a realistic fraction of rows
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, WEIGHTS, k=words))


def load(conn, settings, n: int, rng: random.Random) -> tuple:
    from pgvector import Vector

    from memctl import episodes, models
    from memctl.embedding import HashEmbedder

    agents = [f"agent{i}" for i in range(10)]
    lines = (json.dumps({"content": sentence(rng, rng.randint(12, 30)),
                         "agent": agents[i % 10]}).encode() for i in range(n))
    result = episodes.ImportResult()
    episodes.import_episodes(conn, settings, episodes.parse_jsonl(settings, lines, skip_invalid=False,
                                                                  result=result), result=result)
    model = models.register(conn, HashEmbedder("bench", DIMS), state="active", build_index=False)
    conn.execute("DELETE FROM embed_queue")
    centers = np.random.default_rng(5).normal(size=(200, DIMS)).astype(np.float32)
    gen = np.random.default_rng(6)
    chunks = conn.execute("SELECT agent, id, content_hash FROM chunks").fetchall()
    from psycopg import sql

    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} (agent, chunk_id, content_hash, embedding) FROM STDIN "
                                                "(FORMAT BINARY)").format(sql.Identifier(model.table_name))) as cp:
        cp.set_types(["text", "int8", "bytea", "vector"])
        for row in chunks:
            v = centers[gen.integers(200)] + gen.normal(scale=0.6, size=DIMS).astype(np.float32)
            cp.write_row((row["agent"], row["id"], row["content_hash"], Vector(v / np.linalg.norm(v))))
    conn.execute("SET maintenance_work_mem = '1GB'")
    started = time.perf_counter()
    conn.execute(models.index_statement(model, concurrently=False))
    print(f"loaded {n} episodes; HNSW build {time.perf_counter() - started:.1f} s")
    conn.execute("VACUUM ANALYZE")
    return model, centers


def query_vector(centers, gen) -> np.ndarray:
    v = centers[gen.integers(len(centers))] + gen.normal(scale=0.6, size=DIMS).astype(np.float32)
    return v / np.linalg.norm(v)


def raw_halves(conn, model, vector, text: str, n: int, ef: int) -> None:
    """The two statements hybrid search runs, executed directly."""
    from psycopg import sql

    from memctl import search

    statement = sql.SQL(search.VECTOR_HALF).format(type=sql.SQL(model.storage), table=sql.Identifier(model.table_name),
                                                   join=sql.SQL(""), where=sql.SQL(""))
    with conn.transaction():
        conn.execute(search.SET_SCAN, (str(ef),))
        conn.execute(statement, {"q": search._literal(vector), "n": n}, prepare=False).fetchall()
    conn.execute(sql.SQL(search.TEXT_HALF).format(filters=sql.SQL("")), {"text": text, "n": n},
                 prepare=False).fetchall()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=50)
    args = p.parse_args()
    os.environ.update(MEMCTL_EMBEDDER="hash", MEMCTL_EMBED_MODEL="bench", MEMCTL_CONFIG="/nonexistent/memctl.toml")
    from memctl import config, db, search

    settings = config.load()
    rng = random.Random(11)
    gen = np.random.default_rng(12)
    with server(args.database_url) as admin, fresh_database(admin) as url, db.connect(url, vector=True) as conn:
        model, centers = load(conn, settings, args.episodes, rng)
        ef = settings.get("search", "ef_search")
        n = max(settings.get("search", "candidates"), 40)
        queries = [(query_vector(centers, gen), sentence(rng, 4))
                   for _ in range(args.queries)]
        for vector, text in queries[:5]:  # warm caches for both paths
            search.search(conn, settings, search.Query(text, k=10), vector=vector)
            raw_halves(conn, model, vector, text, n, ef)
        ours, raw = [], []
        for vector, text in queries:
            t = time.perf_counter()
            search.search(conn, settings, search.Query(text, k=10), vector=vector)
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            raw_halves(conn, model, vector, text, n, ef)
            raw.append(time.perf_counter() - t)
        recalls, recalls_plain = [], []
        from psycopg import sql

        exact_sql = sql.SQL("SELECT chunk_id FROM {} WHERE agent = %s ORDER BY embedding <=> %s::vector LIMIT 10").format(
            sql.Identifier(model.table_name))
        for vector, _ in queries:
            q = search.Query("x", k=10, agent="agent3", mode="vector")
            approx = {r["chunk_id"] for r in search.vector_half(conn, model, vector, q, 10, ef)}
            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                exact = {r["chunk_id"] for r in conn.execute(exact_sql, ("agent3", search._literal(vector)))}
            with conn.transaction():
                conn.execute("SET LOCAL hnsw.iterative_scan = off")
                conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                plain = {r["chunk_id"] for r in conn.execute(exact_sql, ("agent3", search._literal(vector)))}
            recalls.append(len(approx & exact) / len(exact))
            recalls_plain.append(len(plain & exact) / len(exact))
    p50, p95 = percentile(ours, 0.5), percentile(ours, 0.95)
    r50, r95 = percentile(raw, 0.5), percentile(raw, 0.95)
    print(f"hybrid search (memctl): p50 {p50 * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms")
    print(f"raw SQL of its halves:  p50 {r50 * 1000:.1f} ms, p95 {r95 * 1000:.1f} ms")
    print(f"search ratio p50 (goal <= 1.5): {p50 / r50:.2f}; p95: {p95 / r95:.2f}")
    print(f"filtered recall@10, agent = 10% of rows, iterative scan (goal >= 0.95): {np.mean(recalls):.3f}")
    print(f"  the same without iterative scan: {np.mean(recalls_plain):.3f}")


if __name__ == "__main__":
    main()
