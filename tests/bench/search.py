"""Hybrid search speed against a bare pgvector HNSW query, and filtered recall, at 100k episodes.

Loads N episodes (words drawn with Zipf frequencies from a 5,000-word
vocabulary, 12-30 words each; 10 agents, so one agent is 10% of rows) with one
384-dim vector each (clustered random unit vectors) and an HNSW index, then
VACUUM ANALYZE. Query texts are 4 words drawn the same way; the query vectors
are the hash embedder's vectors of those texts (the model registered is the
hash embedder's, so `memctl episode search` embeds them itself, offline).

- processes (the goal): a fresh `memctl episode search --batch` of Q hybrid
  queries (k 10) ÷ a fresh Python process that connects with psycopg and runs
  Q bare HNSW top-50 queries on memctl's vector table, with the same query
  vectors, `hnsw.ef_search` as memctl's setting. The baseline's SQL is its own
  text (BARE_TOP_50), not memctl's constants; both send the query vector as a
  binary parameter. Runs alternate, --runs times. Goal: median ratio <= 3 (issue 24; the first goal was 5).
- per query, in one process, alternating: memctl.reading.search.search (hybrid,
  vector given) vs the bare query (at memctl's ef_search): p50 and p95
  ratios. Goal <= 5 each. The old text half (OR of all words ranked by
  ts_rank_cd, OLD_TEXT_HALF here) is timed afterwards on 20 queries, for contrast.
- --against DIR (a checkout of another revision, e.g. `git worktree add DIR REV`): its memctl
  (PYTHONPATH=DIR) runs in the same alternation as this one and the bare process, on the same
  data, so a change's effect is measured apart from the machine's drift.
- filtered recall: HNSW top-10 with an agent filter selecting 10% of rows, as
  memctl runs it (iterative scan) ÷ exact top-10 (index scans off), for query
  vectors near the data's clusters. Goal >= 0.95.

    python tests/bench/search.py [--episodes 100000] [--queries 200] [--runs 5] [--against DIR]
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import alternate, fresh_database, median, parser, percentile, server, wall

WORDS = (
    "deploy disk full nginx logs rotated postgres replica lag redis eviction memory pressure queue backlog "
    "consumer scaled certificate renewal backup restore latency index customer refund release freeze kernel "
    "reboot dns resolver webhook secret gateway rate limit vpn session heap mapping cron upload path pipeline "
    "tests serial parallel alert health check reload warehouse dashboard stale bastion hardware key"
).split()
DIMS = 384
VOCABULARY = WORDS + [f"term{i}" for i in range(5000)]
# Zipf-like word frequencies, so a query matches a realistic fraction of rows
WEIGHTS = [1 / (rank + 1) for rank in range(len(VOCABULARY))]

# The baseline, written here and not taken from memctl: one HNSW top-50 query.
BARE_TOP_50 = "SELECT chunk_id FROM {table} ORDER BY embedding <=> %b LIMIT 50"
# The text half as it was: every row matching any query word, ranked by ts_rank_cd.
OLD_TEXT_HALF = """SELECT e.id, ts_rank_cd(e.tsv, q.query) AS rank FROM episodes e,
  (SELECT replace(websearch_to_tsquery('english', %s)::text, ' & ', ' | ')::tsquery AS query) q
WHERE e.tsv @@ q.query ORDER BY rank DESC, e.id DESC LIMIT 50"""
BASELINE_PROCESS = """
import sys, numpy as np, psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector
url, table, ef, path = sys.argv[1:5]
with psycopg.connect(url, autocommit=True) as conn:
    register_vector(conn)
    conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (ef,))
    statement = {statement!r}.format(table=table)
    for v in np.load(path):
        conn.execute(statement, (Vector(v),)).fetchall()
"""


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(VOCABULARY, WEIGHTS, k=words))


def load(conn, settings, n: int, rng: random.Random) -> tuple:
    conn.use_settings(settings)
    from memctl.embedding import models
    from memctl.records import episodes

    agents = [f"agent{i}" for i in range(10)]
    lines = (
        json.dumps(
            {"content": sentence(rng, rng.randint(12, 30)), "agent": agents[i % 10]}
        ).encode()
        for i in range(n)
    )
    result = episodes.ImportResult()
    started = time.perf_counter()
    episodes.import_episodes(
        conn,
        episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
        result=result,
    )
    model, centers = clustered_vectors(conn)
    loaded = time.perf_counter() - started
    # the graph of 1M vectors needs about 2 GB to be built in memory
    conn.execute(
        "SET maintenance_work_mem = '1GB'" if n <= 300_000 else "SET maintenance_work_mem = '4GB'"
    )
    started = time.perf_counter()
    conn.execute(models.index_statement(model, concurrently=False))
    print(
        f"loaded {n} episodes in {loaded:.0f} s; HNSW build {time.perf_counter() - started:.1f} s"
    )
    conn.execute("VACUUM ANALYZE")
    return model, centers


def clustered_vectors(conn):
    """An active hash model whose table holds, for every chunk, a unit vector near one of 200 centers
    (written straight in: no embedder runs); the queue emptied. Returns (model, centers)."""
    from pgvector import Vector
    from psycopg import sql

    from memctl.embedding import models
    from memctl.embedding.embedders import HashEmbedder

    model = models.register(conn, HashEmbedder("bench", DIMS), state="active", build_index=False)
    conn.execute("DELETE FROM embed_queue")
    centers = np.random.default_rng(5).normal(size=(200, DIMS)).astype(np.float32)
    gen = np.random.default_rng(6)
    chunks = conn.execute("SELECT agent, id, content_hash FROM chunks").fetchall()
    with (
        conn.cursor() as cur,
        cur.copy(
            sql.SQL(
                "COPY {} (agent, chunk_id, content_hash, embedding) FROM STDIN (FORMAT BINARY)"
            ).format(sql.Identifier(model.table_name))
        ) as cp,
    ):
        cp.set_types(["text", "int8", "bytea", "vector"])
        for row in chunks:
            v = centers[gen.integers(200)] + gen.normal(scale=0.6, size=DIMS).astype(np.float32)
            cp.write_row(
                (row["agent"], row["id"], row["content_hash"], Vector(v / np.linalg.norm(v)))
            )
    return model, centers


def query_vector(centers, gen) -> np.ndarray:
    v = centers[gen.integers(len(centers))] + gen.normal(scale=0.6, size=DIMS).astype(np.float32)
    return v / np.linalg.norm(v)


def bare(conn, model, vector) -> None:
    from pgvector import Vector
    from psycopg import sql

    conn.execute(
        sql.SQL(BARE_TOP_50).format(table=sql.Identifier(model.table_name)),
        (Vector(vector),),
        prepare=False,
    ).fetchall()


def processes(
    url: str,
    model,
    texts: list[str],
    vectors: np.ndarray,
    ef: int,
    runs: int,
    scratch: Path,
    against: Path | None = None,
) -> None:
    batch, npy = scratch / "queries.jsonl", scratch / "vectors.npy"
    batch.write_text("".join(json.dumps({"query": t, "k": 10}) + "\n" for t in texts))
    np.save(npy, vectors.astype(np.float32))
    script = scratch / "baseline.py"
    script.write_text(BASELINE_PROCESS.format(statement=BARE_TOP_50))
    memctl = str(Path(sys.executable).with_name("memctl"))
    env = {**os.environ, "MEMCTL_DATABASE_URL": url}
    ours = [memctl, "episode", "search", "--batch", str(batch), "--format", "jsonl", "--no-track"]
    check = subprocess.run(ours, env=env, capture_output=True, text=True, check=True)
    answers = [json.loads(line) for line in check.stdout.splitlines()]
    vector_ran = sum(1 for a in answers if any(h["vector_rank"] for h in a["results"]))
    text_ran = sum(1 for a in answers if any(h["text_rank"] for h in a["results"]))
    mine, theirs = alternate(
        ours, [sys.executable, str(script), url, model.table_name, str(ef), str(npy)], env, runs
    )
    print(
        f"processes, {len(texts)} queries each (median of {runs}): memctl episode search --batch "
        f"{median(mine):.2f} s, bare HNSW top-50 {median(theirs):.2f} s; ratio (goal <= 3, issue 24) "
        f"{median(mine) / median(theirs):.2f}  [queries with vector hits {vector_ran}, with text hits {text_ran}]"
    )
    if check.stderr.strip():
        print(f"  stderr: {check.stderr.strip()[:200]}")
    if against is not None:
        compare(
            ours,
            [sys.executable, str(script), url, model.table_name, str(ef), str(npy)],
            env,
            runs,
            against,
        )


def compare(ours: list[str], base: list[str], env: dict, runs: int, against: Path) -> None:
    """This memctl, the one of the checkout `against` and the bare process, alternated."""
    other = {**env, "PYTHONPATH": str(against)}
    for _ in range(2):  # warm
        wall(base, env), wall(ours, env), wall(ours, other)
    mine, theirs, bare = [], [], []
    for _ in range(runs):
        bare.append(wall(base, env))
        mine.append(wall(ours, env))
        theirs.append(wall(ours, other))
    print(
        f"against {against} (alternated, median of {runs}): this memctl {median(mine):.2f} s, that memctl "
        f"{median(theirs):.2f} s, bare {median(bare):.2f} s; ratios {median(mine) / median(bare):.2f} (this) and "
        f"{median(theirs) / median(bare):.2f} (that)"
    )


def per_query(conn, settings, model, texts, vectors) -> None:
    conn.use_settings(settings)
    from memctl.reading import search
    from memctl.reading.query import Query

    # the bare query's ef_search as memctl's (a top-50 needs ef_search >= 50; pgvector's default is 40)
    conn.execute(
        "SELECT set_config('hnsw.ef_search', %s, false)", (str(settings.search.ef_search),)
    )
    for text, vector in list(zip(texts, vectors))[:5]:  # warm caches for every path
        search.search(conn, Query(text, k=10), vector=vector)
        bare(conn, model, vector)
    ours, base, old = [], [], []
    for text, vector in zip(texts, vectors):
        t = time.perf_counter()
        search.search(conn, Query(text, k=10), vector=vector)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        bare(conn, model, vector)
        base.append(time.perf_counter() - t)
    for text in texts[
        :20
    ]:  # after, not interleaved (its reads of every matching row would evict the others'
        # pages), and 20 of them: at 1M episodes each takes seconds
        t = time.perf_counter()
        conn.execute(OLD_TEXT_HALF, (text,), prepare=False).fetchall()
        old.append(time.perf_counter() - t)
    for name, values in (
        ("hybrid search (memctl)", ours),
        ("bare HNSW top-50", base),
        ("old text half alone (ts_rank_cd)", old),
    ):
        print(
            f"{name}: p50 {percentile(values, 0.5) * 1000:.1f} ms, p95 {percentile(values, 0.95) * 1000:.1f} ms"
        )
    print(
        f"per-query ratio hybrid ÷ bare (goal <= 5): p50 {percentile(ours, 0.5) / percentile(base, 0.5):.2f}, "
        f"p95 {percentile(ours, 0.95) / percentile(base, 0.95):.2f}"
    )


def filtered_recall(conn, model, centers, ef: int, candidates: int) -> None:
    from pgvector import Vector
    from psycopg import sql

    from memctl.reading.query import Query
    from memctl.reading.scan import vector_half

    def exact_sql(where: str):
        return sql.SQL(
            "SELECT chunk_id FROM {} " + where + " ORDER BY embedding <=> %b LIMIT 10"
        ).format(sql.Identifier(model.table_name))

    recalls, searched, plain_recalls, unfiltered = [], [], [], []
    gen = np.random.default_rng(12)
    for vector in (query_vector(centers, gen) for _ in range(50)):
        q = Query("x", k=10, agent="agent3", mode="vector")
        approx = {r["chunk_id"] for r in vector_half(conn, model, vector, q, 10)}
        # as search runs it: the vector half's `candidates` nearest, of which the best 10
        deeper = [r["chunk_id"] for r in vector_half(conn, model, vector, q, candidates)][:10]
        with conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            exact = {
                r["chunk_id"]
                for r in conn.execute(exact_sql("WHERE agent = %s"), ("agent3", Vector(vector)))
            }
            exact_all = {r["chunk_id"] for r in conn.execute(exact_sql(""), (Vector(vector),))}
        with conn.transaction():
            conn.execute("SET LOCAL hnsw.iterative_scan = off")
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
            plain = {
                r["chunk_id"]
                for r in conn.execute(exact_sql("WHERE agent = %s"), ("agent3", Vector(vector)))
            }
            hnsw_all = {r["chunk_id"] for r in conn.execute(exact_sql(""), (Vector(vector),))}
        recalls.append(len(approx & exact) / len(exact))
        searched.append(len(set(deeper) & exact) / len(exact))
        plain_recalls.append(len(plain & exact) / len(exact))
        unfiltered.append(len(hnsw_all & exact_all) / len(exact_all))
    print(
        f"filtered recall@10, agent = 10% of rows, iterative scan, LIMIT 10: {np.mean(recalls):.3f}"
    )
    print(
        f"  as search runs it (best 10 of the vector half's {candidates}; goal >= 0.95): {np.mean(searched):.3f}"
    )
    print(
        f"  without iterative scan: {np.mean(plain_recalls):.3f}; "
        f"unfiltered HNSW recall@10 at ef_search {ef}, for reference: {np.mean(unfiltered):.3f}"
    )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument(
        "--against", type=Path, help="a checkout of another revision to alternate with this one"
    )
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="memctl-search-bench-"))
    (scratch / "memctl.toml").write_text("")
    os.environ.update(
        MEMCTL_EMBEDDER="hash",
        MEMCTL_EMBED_MODEL="bench",
        MEMCTL_CONFIG=str(scratch / "memctl.toml"),
    )
    from memctl import config, db
    from memctl.embedding.embedders import HashEmbedder

    settings = config.load()
    rng = random.Random(11)
    with (
        server(args.database_url) as admin,
        fresh_database(admin) as url,
        db.connect(url, vector=True) as conn,
    ):
        model, centers = load(conn, settings, args.episodes, rng)
        ef = settings.search.ef_search
        texts = [sentence(rng, 4) for _ in range(args.queries)]
        vectors = np.asarray(HashEmbedder("bench", DIMS).embed(texts).vectors, dtype=np.float32)
        processes(url, model, texts, vectors, ef, args.runs, scratch, args.against)
        per_query(conn, settings, model, texts, vectors)
        filtered_recall(conn, model, centers, ef, settings.search.candidates)


if __name__ == "__main__":
    main()
