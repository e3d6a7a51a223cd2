"""Benchmark: `memctl prune --yes` against one plain DELETE of the same rows.

    python tests/bench/prune.py                      # 100k episodes, a quick run
    python tests/bench/prune.py --episodes 1000000   # the issue's figure: 500k expired out of 1M

Builds one database with N episodes, their chunks (1.25 per episode) and one
vector per chunk in a model table with its HNSW index, loaded with binary
COPY; vectors have 32 dimensions (a small dim keeps the load and the HNSW build
short; a DELETE does not touch the HNSW index, so the dimension barely matters
to the delete itself). Half the episodes are expired: 'raw' episodes older
than the policy's 30 days, interleaved in time and on disk with kept 'raw',
'summary' and 'observation' rows. The database is then copied (CREATE DATABASE
... TEMPLATE, so every copy is identical to the byte) once per contender:

- plain: one `DELETE FROM episodes WHERE kind = 'raw' AND created_at < cutoff`,
  the foreign-key cascades removing chunks, queue rows and vectors;
- prune: memctl.retention.prune() with the same policy, as `memctl prune --yes`
  runs it (batches, verification, table statistics before and after).

Autovacuum is off on the tables so it cannot run during one contender and not
the other; each copy's tables are read once before its timed run and a
CHECKPOINT separates the runs. Prints seconds, the ratio plain / prune (goal
>= 0.7) and prune's longest single transaction (goal < 1 s). Nothing is
asserted: this is a measurement, not a test.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else
an embedded server started in a temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memctl import db, migrate, models, retention  # noqa: E402
from memctl.embedding import HashEmbedder  # noqa: E402

DIMS = 32
SOURCE_DB = "memctl_bench_prune_src"
POLICY = retention.Policy({"raw": "30d", "summary": "365d"})
TABLES = ("episodes", "chunks", "embed_queue", "embed_failures")
COPY_EPISODES = ("COPY episodes (id, agent, kind, content, content_hash, source, importance, created_at) "
                 "FROM STDIN (FORMAT BINARY)")
COPY_CHUNKS = "COPY chunks (id, agent, episode_id, seq, content, content_hash) FROM STDIN (FORMAT BINARY)"
COPY_VECTORS = "COPY {table} (agent, chunk_id, embedding) FROM STDIN (FORMAT BINARY)"
PLAIN_DELETE = "DELETE FROM episodes WHERE kind = 'raw' AND created_at < now() - interval '30 days'"
COUNTS = "SELECT (SELECT count(*) FROM episodes) AS episodes, (SELECT count(*) FROM chunks) AS chunks"


def kind_of(i: int) -> str:
    return ("raw", "raw", "raw", "raw", "raw", "raw", "summary", "observation")[i % 8]


def created_at(i: int, n: int, now: datetime.datetime) -> datetime.datetime:
    """Oldest first: the first 2/3 of the ids are 31-120 days old, the rest 0-29 days (none near the cutoff)."""
    old = 2 * n // 3
    if i < old:
        days = 120 - 89 * i / max(old, 1)
    else:
        days = 29 - 29 * (i - old) / max(n - old, 1)
    return now - datetime.timedelta(days=days)


def load(conn, n: int) -> None:
    """N episodes, 1.25 chunks each, one 32-dim vector per chunk, then the HNSW index."""
    from pgvector import Vector

    db.register_vector(conn)
    model = models.register(conn, HashEmbedder("bench-hash", dims=DIMS), state="active", build_index=False)
    rng = random.Random(42)
    now = datetime.datetime.now(datetime.timezone.utc)
    chunk_id = 0
    chunk_rows = []
    with conn.cursor() as cur:
        with cur.copy(COPY_EPISODES) as copy:
            copy.set_types(["int8", "text", "text", "text", "bytea", "text", "int2", "timestamptz"])
            for i in range(n):
                text = f"episode {i}: the deploy of service {i % 97} went {('well', 'badly')[i % 2]} at step {i % 13}"
                copy.write_row((i + 1, "default", kind_of(i), text, hashlib.sha256(text.encode()).digest(),
                                "bench", 5, created_at(i, n, now)))
                for seq in range(2 if i % 4 == 0 else 1):
                    chunk_id += 1
                    chunk_rows.append((chunk_id, i + 1, seq, f"{text} [{seq}]"))
        with cur.copy(COPY_CHUNKS) as copy:
            copy.set_types(["int8", "text", "int8", "int4", "text", "bytea"])
            for cid, episode_id, seq, text in chunk_rows:
                copy.write_row((cid, "default", episode_id, seq, text, hashlib.sha256(text.encode()).digest()))
        with cur.copy(sql.SQL(COPY_VECTORS).format(table=sql.Identifier(model.table_name))) as copy:
            copy.set_types(["text", "int8", "vector"])
            for cid, *_ in chunk_rows:
                copy.write_row(("default", cid, Vector([rng.uniform(-1, 1) for _ in range(DIMS)])))
    for table in ("episodes", "chunks"):
        conn.execute(sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'id'), {})").format(
            sql.Literal(table), sql.Literal(n if table == "episodes" else chunk_id)))
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(models.index_statement(model, concurrently=False))
    for table in (*TABLES, model.table_name):
        conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = off, toast.autovacuum_enabled = off)").format(
            sql.Identifier(table)))
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))


def warm(conn) -> None:
    for table in (*TABLES, *(m.table_name for m in models.all_models(conn))):
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()


def vector_count(conn) -> int:
    table = models.all_models(conn)[0].table_name
    return conn.execute(sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))).fetchone()["n"]


def run_plain(url: str) -> dict:
    with db.connect(url) as conn:
        warm(conn)
        before = conn.execute(COUNTS).fetchone()
        started = time.perf_counter()
        deleted = conn.execute(PLAIN_DELETE).rowcount
        elapsed = time.perf_counter() - started
        return {"seconds": elapsed, "deleted": deleted, "longest_tx": elapsed, "before": before,
                "after": {**conn.execute(COUNTS).fetchone(), "vectors": vector_count(conn)}}


def run_prune(url: str, batch_size: int) -> dict:
    with db.connect(url) as conn:
        warm(conn)
        started = time.perf_counter()
        report = retention.prune(conn, POLICY, batch_size=batch_size)
        elapsed = time.perf_counter() - started
        return {"seconds": elapsed, "deleted": report.rows, "longest_tx": report.max_transaction_s,
                "batches": report.batches, "outcome": report.outcome,
                "after": {**conn.execute(COUNTS).fetchone(), "vectors": vector_count(conn)}}


def server(args) -> tuple[str, Path | None]:
    url = args.database_url or os.environ.get("MEMCTL_TEST_DATABASE_URL")
    if url:
        return url, None
    home = Path(tempfile.mkdtemp(prefix="memctl-bench-"))
    os.environ["MEMCTL_HOME"] = str(home)
    from memctl import embedded

    return embedded.start().url, home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=100_000, help="episodes in the database (half expire)")
    parser.add_argument("--batch-size", type=int, default=retention.DEFAULT_BATCH)
    parser.add_argument("--strategy", choices=[*retention.STRATEGIES, "both"], default="explicit",
                        help="how prune deletes a batch; 'both' times each on its own copy")
    parser.add_argument("--database-url", help="admin URL of a server to use (else MEMCTL_TEST_DATABASE_URL, "
                        "else an embedded server in a temporary directory)")
    args = parser.parse_args()
    admin, home = server(args)
    strategies = list(retention.STRATEGIES) if args.strategy == "both" else [args.strategy]
    names = {"plain": f"{SOURCE_DB}_plain", **{s: f"{SOURCE_DB}_{s}" for s in strategies}}
    try:
        with psycopg.connect(admin, autocommit=True) as admin_conn:
            for name in (SOURCE_DB, *names.values()):
                admin_conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin_conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SOURCE_DB)))
            started = time.perf_counter()
            with db.connect(make_conninfo(admin, dbname=SOURCE_DB)) as conn:
                migrate.apply(conn)
                load(conn, args.episodes)
            print(f"built {args.episodes} episodes, chunks, {DIMS}-dim vectors and HNSW index in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
            admin_conn.execute("CHECKPOINT")
            for name in names.values():
                admin_conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(SOURCE_DB)))
            results = {}
            for contender, name in names.items():
                admin_conn.execute("CHECKPOINT")
                url = make_conninfo(admin, dbname=name)
                if contender == "plain":
                    results[contender] = run_plain(url)
                else:
                    results[contender] = run_prune(url, args.batch_size, contender)
            report(args, results)
            for name in (SOURCE_DB, *names.values()):
                admin_conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    finally:
        if home is not None:
            from memctl import embedded

            embedded.stop()
            shutil.rmtree(home, ignore_errors=True)


def report(args, results: dict) -> None:
    plain = results["plain"]
    before = plain["before"]
    print(f"database: {before['episodes']} episodes, {before['chunks']} chunks, one {DIMS}-dim vector per chunk "
          f"(HNSW index); policy raw = 30d, summary = 365d; batch size {args.batch_size}")
    print(f"plain DELETE: {plain['deleted']} episodes in {plain['seconds']:.2f} s (one transaction); "
          f"left {plain['after']}")
    for name, result in results.items():
        if name == "plain":
            continue
        same = "same rows left as plain" if result["after"] == plain["after"] else f"DIFFERENT: {result['after']}"
        print(f"prune ({name}): {result['deleted']} episodes in {result['seconds']:.2f} s, {result['batches']} "
              f"batches, outcome {result['outcome']}; {same}")
        print(f"  ratio plain / prune ({name}) = {plain['seconds'] / result['seconds']:.2f} (goal >= 0.7); "
              f"longest transaction {result['longest_tx']:.3f} s (goal < 1 s)")


if __name__ == "__main__":
    main()
