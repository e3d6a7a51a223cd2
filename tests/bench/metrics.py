"""Benchmark: `memctl metrics` against `memctl status` on a large database.

    python tests/bench/metrics.py                      # 100k episodes, a quick run
    python tests/bench/metrics.py --episodes 1000000   # the issue's figure

Builds one database with N episodes (4 kinds, 50 agents, spread over 90 days), one chunk each, one
32-dim vector for 98% of the chunks in the active model's table and the other 2% queued, and a job
log of 10,000 runs, all with INSERT ... SELECT FROM generate_series (this bench's own fill: the
library's write path is not what is measured). No HNSW index: neither command reads one, and
sizing an index is a catalogue lookup whatever its size. VACUUM ANALYZE, then both commands run
alternately as fresh processes of the installed memctl (after two unmeasured rounds) against the
same database. Prints each command's median wall time, the ratio metrics / status, and where
metrics spends its time in-process (the status figures, the size figures, the per-kind sample).
Nothing is asserted: a measurement, not a test.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else an embedded
server started in a temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from psycopg import sql  # noqa: E402

from tests.bench._common import alternate, fresh_database, median, parser, server, timed  # noqa: E402

DIMS = 32
EPISODES = """
INSERT INTO episodes (agent, kind, content, content_hash, importance, created_at)
SELECT 'agent-' || (i %% 50), (ARRAY['raw', 'observation', 'decision', 'summary'])[1 + i %% 4],
       'episode ' || i || ': disk full on db' || (i %% 7) || ', logs rotated',
       sha256(('episode ' || i)::bytea), 1 + i %% 10, now() - (i %% 90) * interval '1 day' - i * interval '1 ms'
FROM generate_series(1, %s) AS i
"""
CHUNKS = """
INSERT INTO chunks (agent, episode_id, seq, content, content_hash)
SELECT agent, id, 0, content, content_hash FROM episodes
"""
VECTORS = """
INSERT INTO {table} (agent, chunk_id, content_hash, embedding)
SELECT agent, id, content_hash, array_fill(0.1::real, ARRAY[{dims}])::vector FROM chunks WHERE id % 50 <> 0
"""
QUEUE = "INSERT INTO embed_queue (model_id, agent, chunk_id) SELECT %s, agent, id FROM chunks WHERE id %% 50 = 0"
JOBS = """
INSERT INTO jobs (job, started_at, finished_at, outcome, rows)
SELECT CASE WHEN i % 100 = 0 THEN 'prune' ELSE 'embed' END,
       now() - i * interval '5 minutes', now() - i * interval '5 minutes' + interval '3 seconds',
       CASE WHEN i % 37 = 0 THEN 'unavailable' ELSE 'ok' END, 64
FROM generate_series(1, 10000) AS i
"""


def fill(url: str, episodes: int) -> None:
    from memctl import db
    from memctl.embedding import models
    from memctl.embedding.embedders import HashEmbedder

    with db.connect(url) as conn:
        model = models.register(conn, HashEmbedder(dims=DIMS), state="active", build_index=False)
        steps = [
            ("episodes", EPISODES, (episodes,)),
            ("chunks", CHUNKS, None),
            (
                "vectors",
                sql.SQL(VECTORS).format(
                    table=sql.Identifier(model.table_name), dims=sql.Literal(DIMS)
                ),
                None,
            ),
            ("queue", QUEUE, (model.id,)),
            ("jobs", JOBS, None),
        ]
        for name, statement, params in steps:
            seconds, _ = timed(conn.execute, statement, params)
            print(f"  fill {name}: {seconds:.1f}s", file=sys.stderr)
        conn.execute("VACUUM ANALYZE")


def inside(url: str) -> dict[str, float]:
    """Where `memctl metrics` spends its time, measured in this process (the second of two passes)."""
    from memctl import config, db
    from memctl.observe import metrics, status

    with db.connect(url, settings=config.load()) as conn:
        for _ in range(2):
            seconds, report = timed(status.collect, conn)
            parts = {
                "status.collect (what memctl status runs)": seconds,
                "metrics.size_figures (memctl size's relations, growth)": timed(
                    metrics.size_figures, conn
                )[0],
                "metrics.groups (per kind and agent)": timed(
                    metrics.groups, conn, report["episodes"]
                )[0],
                "metrics.collect (all of it)": timed(metrics.collect, conn)[0],
            }
    return parts


def measure(url: str, label: str, runs: int) -> None:
    exe = shutil.which("memctl", path=str(Path(sys.executable).parent)) or shutil.which("memctl")
    env = {**os.environ, "MEMCTL_DATABASE_URL": url}
    mine, theirs = alternate([exe, "metrics"], [exe, "status", "-f", "json"], env, runs)
    for name, seconds in inside(url).items():
        print(f"in-process {name}: {seconds:.3f}s")
    print(f"{label}, {runs} alternated runs of each (fresh processes):")
    print(
        f"  memctl status -f json  median {median(theirs):.3f}s  (all: "
        + ", ".join(f"{t:.2f}" for t in theirs)
        + ")"
    )
    print(
        f"  memctl metrics         median {median(mine):.3f}s  (all: "
        + ", ".join(f"{t:.2f}" for t in mine)
        + ")"
    )
    print(f"  ratio metrics / status: {median(mine) / median(theirs):.2f}")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument(
        "--url",
        help="measure this database, already filled by fill() (the fill takes minutes at 1M)",
    )
    args = p.parse_args()
    os.environ["MEMCTL_CONFIG"] = "/dev/null"
    if args.url:
        measure(args.url, args.url.split("dbname=")[-1].split()[0], args.runs)
        return
    with server(args.database_url) as admin, fresh_database(admin) as url:
        started = time.perf_counter()
        fill(url, args.episodes)
        print(
            f"filled {args.episodes:,} episodes in {time.perf_counter() - started:.0f}s",
            file=sys.stderr,
        )
        measure(url, f"episodes {args.episodes:,}", args.runs)


if __name__ == "__main__":
    main()
