"""Benchmark: `memctl prune --yes` against one plain DELETE of the same rows.

    python tests/bench/prune.py                      # 100k episodes, a quick run
    python tests/bench/prune.py --episodes 1000000   # the issue's figure: 500k expired out of 1M

Builds one database with N episodes, their chunks (1.25 per episode on
average) and one vector per chunk in a model table with an HNSW index, loaded
with binary COPY. Vectors have 32 dimensions: a small dim keeps the load and
the HNSW build short, and a DELETE does not touch the HNSW index (index entries
go at VACUUM), so neither the dimension nor the index's build parameters
(--hnsw) change the delete. Half the episodes expire: 'raw' episodes older than
the policy's 30 days, interleaved in time and on disk with kept 'raw',
'summary' and 'observation' rows (observation has no policy). Each round copies
that database twice (CREATE DATABASE ... TEMPLATE: identical to the byte):

- plain: one `DELETE FROM episodes WHERE kind = 'raw' AND created_at < cutoff`
  in one transaction, the foreign-key cascades removing chunks and vectors;
- prune: memctl.retention.prune.prune() with the same policy, all of what
  `memctl prune --yes` does (batches, the check that nothing still matches,
  table statistics before and after, the job log).

Autovacuum is off on the tables so it cannot run during one contender and not
the other; each copy's tables are read once before its timed run; a
CHECKPOINT precedes each run; the order alternates between rounds. Prints each
round and the median ratio plain / prune (goal >= 0.7) of wall time, and of the
server process's CPU time when the server is local (less disturbed by other
load on the machine), and prune's longest single transaction (goal < 1 s).
Nothing is asserted: a measurement, not a test.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else
an embedded server started in a temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memctl import db
from memctl.db import migrate
from memctl.embedding import models
from memctl.embedding.embedders import HashEmbedder  # noqa: E402
from memctl.retention import deletion, policy as policy_mod, prune as prune_mod  # noqa: E402

DIMS = 32
SOURCE_DB = "memctl_bench_prune_src"
POLICY = policy_mod.Policy({"raw": "30d", "summary": "365d"})
TABLES = ("episodes", "chunks", "embed_queue", "embed_failures")
COPY_EPISODES = (
    "COPY episodes (id, agent, kind, content, content_hash, source, importance, created_at) "
    "FROM STDIN (FORMAT BINARY)"
)
COPY_CHUNKS = (
    "COPY chunks (id, agent, episode_id, seq, content, content_hash) FROM STDIN (FORMAT BINARY)"
)
COPY_VECTORS = "COPY {table} (agent, chunk_id, content_hash, embedding) FROM STDIN (FORMAT BINARY)"
PLAIN_DELETE = "DELETE FROM episodes WHERE kind = 'raw' AND created_at < now() - interval '30 days'"
FAST_HNSW = (
    "CREATE INDEX {index} ON {table} USING hnsw (embedding vector_cosine_ops) "
    "WITH (m = 8, ef_construction = 16)"
)
COUNTS = (
    "SELECT (SELECT count(*) FROM episodes) AS episodes, (SELECT count(*) FROM chunks) AS chunks"
)


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


def load(conn, n: int, hnsw: str) -> dict:
    """N episodes, 1.25 chunks each, one 32-dim vector per chunk, then the HNSW index; returns the counts."""
    import numpy as np
    from pgvector import Vector

    db.register_vector(conn)
    model = models.register(
        conn, HashEmbedder("bench-hash", dims=DIMS), state="active", build_index=False
    )
    rng = np.random.default_rng(42)
    now = datetime.datetime.now(datetime.timezone.utc)
    chunk_id = 0
    chunk_rows = []
    with conn.cursor() as cur:
        with cur.copy(COPY_EPISODES) as copy:
            copy.set_types(["int8", "text", "text", "text", "bytea", "text", "int2", "timestamptz"])
            for i in range(n):
                text = f"episode {i}: the deploy of service {i % 97} went {('well', 'badly')[i % 2]} at step {i % 13}"
                copy.write_row(
                    (
                        i + 1,
                        "default",
                        kind_of(i),
                        text,
                        hashlib.sha256(text.encode()).digest(),
                        "bench",
                        5,
                        created_at(i, n, now),
                    )
                )
                for seq in range(2 if i % 4 == 0 else 1):
                    chunk_id += 1
                    piece = f"{text} [{seq}]"
                    chunk_rows.append(
                        (chunk_id, i + 1, seq, piece, hashlib.sha256(piece.encode()).digest())
                    )
        with cur.copy(COPY_CHUNKS) as copy:
            copy.set_types(["int8", "text", "int8", "int4", "text", "bytea"])
            for row in chunk_rows:
                copy.write_row((row[0], "default", *row[1:]))
        with cur.copy(sql.SQL(COPY_VECTORS).format(table=sql.Identifier(model.table_name))) as copy:
            copy.set_types(["text", "int8", "bytea", "vector"])
            vectors = rng.uniform(-1, 1, (len(chunk_rows), DIMS)).astype(np.float32)
            for (cid, *_, digest), vector in zip(chunk_rows, vectors):
                copy.write_row(("default", cid, digest, Vector(vector)))
    for table in ("episodes", "chunks"):
        conn.execute(
            sql.SQL("SELECT setval(pg_get_serial_sequence({}, 'id'), {})").format(
                sql.Literal(table), sql.Literal(n if table == "episodes" else chunk_id)
            )
        )
    conn.execute("SET maintenance_work_mem = '1GB'")
    if hnsw == "memctl":
        conn.execute(models.index_statement(model, concurrently=False))
    else:
        conn.execute(
            sql.SQL(FAST_HNSW).format(
                index=sql.Identifier(model.index_name), table=sql.Identifier(model.table_name)
            )
        )
    for table in (*TABLES, model.table_name):
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} SET (autovacuum_enabled = off, toast.autovacuum_enabled = off)"
            ).format(sql.Identifier(table))
        )
        conn.execute(sql.SQL("VACUUM (ANALYZE) {}").format(sql.Identifier(table)))
    return conn.execute(COUNTS).fetchone()


def warm(conn) -> None:
    for table in (*TABLES, *(m.table_name for m in models.all_models(conn))):
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()


def vector_count(conn) -> int:
    table = models.all_models(conn)[0].table_name
    return conn.execute(
        sql.SQL("SELECT count(*) AS n FROM {}").format(sql.Identifier(table))
    ).fetchone()["n"]


def backend_cpu(conn) -> float | None:
    """CPU seconds the server process of this connection has used (local server only), else None.

    The cascades run in that process too. Unlike wall time, it is barely moved by other
    work on the machine, so it is printed beside the wall-time ratio.
    """
    pid = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(url: str, work) -> dict:
    with db.connect(url) as conn:
        warm(conn)
        cpu = backend_cpu(conn)
        started = time.perf_counter()
        result = work(conn)
        result["seconds"] = time.perf_counter() - started
        after = backend_cpu(conn)
        result["cpu"] = after - cpu if cpu is not None and after is not None else None
        result["after"] = {**conn.execute(COUNTS).fetchone(), "vectors": vector_count(conn)}
        return result


def plain(conn) -> dict:
    return {"deleted": conn.execute(PLAIN_DELETE).rowcount}


def prune(conn, batch_size: int) -> dict:
    report = prune_mod.prune(conn, POLICY, batch_size=batch_size)
    return {
        "deleted": report.rows,
        "longest_tx": report.max_transaction_s,
        "batches": report.batches,
        "outcome": report.outcome,
        "chunks": report.chunks,
        "vectors": report.vectors,
    }


def server(args) -> tuple[str, Path | None]:
    url = args.database_url or os.environ.get("MEMCTL_TEST_DATABASE_URL")
    if url:
        return url, None
    home = Path(tempfile.mkdtemp(prefix="memctl-bench-"))
    os.environ["MEMCTL_HOME"] = str(home)
    from memctl.db import embedded

    return embedded.start().url, home


def drop(admin_conn, *names: str) -> None:
    for name in names:
        admin_conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def copy_of(admin_conn, name: str) -> None:
    admin_conn.execute("CHECKPOINT")
    admin_conn.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            sql.Identifier(name), sql.Identifier(SOURCE_DB)
        )
    )
    admin_conn.execute("CHECKPOINT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes", type=int, default=100_000, help="episodes in the database (half expire)"
    )
    parser.add_argument("--batch-size", type=int, default=deletion.DEFAULT_BATCH)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (plain, prune) on fresh copies, order alternating; the median ratio counts",
    )
    parser.add_argument(
        "--hnsw",
        choices=["fast", "memctl"],
        default="fast",
        help="fast: HNSW with m = 8, ef_construction = 16 (5x quicker to build); memctl: the "
        "index memctl builds (m = 16, ef_construction = 64). A DELETE does not touch the index.",
    )
    parser.add_argument(
        "--database-url",
        help="admin URL of a server to use (else MEMCTL_TEST_DATABASE_URL, "
        "else an embedded server in a temporary directory)",
    )
    args = parser.parse_args()
    admin, home = server(args)
    plain_db, prune_db = f"{SOURCE_DB}_plain", f"{SOURCE_DB}_prune"
    try:
        with psycopg.connect(admin, autocommit=True) as admin_conn:
            drop(admin_conn, SOURCE_DB, plain_db, prune_db)
            admin_conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SOURCE_DB)))
            started = time.perf_counter()
            with db.connect(make_conninfo(admin, dbname=SOURCE_DB)) as conn:
                migrate.apply(conn)
                before = load(conn, args.episodes, args.hnsw)
            print(
                f"built in {time.perf_counter() - started:.1f} s: {before['episodes']} episodes, "
                f"{before['chunks']} chunks, one {DIMS}-dim vector per chunk, HNSW index ({args.hnsw}); "
                f"policy raw = 30d, summary = 365d; batch size {args.batch_size}",
                flush=True,
            )
            rounds = []
            for number in range(args.rounds):
                order = ("plain", "prune") if number % 2 == 0 else ("prune", "plain")
                result = {}
                for contender in order:
                    name = plain_db if contender == "plain" else prune_db
                    copy_of(admin_conn, name)
                    url = make_conninfo(admin, dbname=name)
                    work = (
                        plain
                        if contender == "plain"
                        else (lambda conn: prune(conn, args.batch_size))
                    )
                    result[contender] = timed(url, work)
                    drop(admin_conn, name)
                rounds.append(result)
                show_round(number + 1, result)
            summary(rounds)
            drop(admin_conn, SOURCE_DB)
    finally:
        if home is not None:
            from memctl.db import embedded

            embedded.stop()
            shutil.rmtree(home, ignore_errors=True)


def ratio(result: dict, key: str) -> float | None:
    plain, pruned = result["plain"][key], result["prune"][key]
    return plain / pruned if plain is not None and pruned else None


def show_round(number: int, result: dict) -> None:
    plain, pruned = result["plain"], result["prune"]
    same = (
        "same rows left"
        if pruned["after"] == plain["after"]
        else f"DIFFERENT: {pruned['after']} vs {plain['after']}"
    )
    cpu = ratio(result, "cpu")
    print(
        f"round {number}: plain DELETE {plain['deleted']} episodes in {plain['seconds']:.2f} s; "
        f"prune {pruned['deleted']} episodes ({pruned['chunks']} chunks, {pruned['vectors']} vectors) in "
        f"{pruned['seconds']:.2f} s, {pruned['batches']} batches, longest transaction {pruned['longest_tx']:.3f} s, "
        f"outcome {pruned['outcome']}; ratio {ratio(result, 'seconds'):.2f}"
        + (f" (server CPU {plain['cpu']:.2f} s / {pruned['cpu']:.2f} s = {cpu:.2f})" if cpu else "")
        + f"; {same}",
        flush=True,
    )


def summary(rounds: list[dict]) -> None:
    ratios = [ratio(r, "seconds") for r in rounds]
    cpu = [ratio(r, "cpu") for r in rounds]
    longest = max(r["prune"]["longest_tx"] for r in rounds)
    print(
        f"ratio plain DELETE / prune, wall time: median {statistics.median(ratios):.2f} over {len(rounds)} "
        f"round(s) ({', '.join(f'{x:.2f}' for x in ratios)}) (goal >= 0.7)"
    )
    if all(cpu):
        print(
            f"ratio plain DELETE / prune, server CPU time: median {statistics.median(cpu):.2f} "
            f"({', '.join(f'{x:.2f}' for x in cpu)})"
        )
    print(f"longest prune transaction: {longest:.3f} s (goal < 1 s)")


if __name__ == "__main__":
    main()
