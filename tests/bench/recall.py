"""Recall end to end: `memctl recall Q` ÷ `memctl episode search Q`, both with the local embedder.

Loads N episodes (synthetic operations sentences, 10 agents) with one chunk and
one all-minilm vector each: the first --real of them embedded by the local
model, the rest random unit vectors (both commands run the same search over the
same rows, so the bulk only has to be there; the query is embedded by the real
model in both), an HNSW index, 300 facts, and the shipped runbooks as the
runbook repository. Then runs both commands as fresh processes, alternating,
--runs times each (each pays process start and the model load), and prints the
medians and their ratio. Goal: <= 1.3.

    python tests/bench/recall.py [--episodes 100000] [--real 2000] [--runs 11]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import alternate, fresh_database, median, parser, server

SERVICES = "nginx postgres redis kafka api gateway billing auth search worker scheduler cdn dns vpn".split()
EVENTS = (
    "deploy failed",
    "restarted",
    "ran out of disk",
    "lagged behind",
    "hit the rate limit",
    "leaked memory",
    "lost its certificate",
    "timed out",
    "was scaled up",
    "rolled back",
    "paged the on-call",
    "was patched",
)
CAUSES = (
    "the disk was full",
    "a bad config push",
    "an expired certificate",
    "a kernel upgrade",
    "a noisy neighbour",
    "a slow query",
    "a dns outage",
    "a memory leak in the worker",
    "a missing index",
    "a stuck cron job",
)
FIXES = (
    "rotating logs fixed it",
    "a rollback fixed it",
    "we added an index",
    "restarting the pod helped",
    "renewing the certificate fixed it",
    "nobody fixed it yet",
    "scaling out helped",
    "we paused the job",
)
QUERY = "nginx deploy failed on web-3 and the disk is almost full, what should I do?"
RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"


def sentence(rng: random.Random, i: int) -> str:
    return (
        f"{rng.choice(SERVICES)} on web-{rng.randint(1, 40)} {rng.choice(EVENTS)} because "
        f"{rng.choice(CAUSES)}; {rng.choice(FIXES)} (ticket {i})"
    )


def load(conn, settings, n: int, real: int) -> None:
    conn.use_settings(settings)
    from pgvector import Vector
    from psycopg import sql

    from memctl.embedding import models
    from memctl.embedding.local import LocalEmbedder
    from memctl.records import episodes, facts

    rng = random.Random(3)
    started = time.perf_counter()
    lines = (
        json.dumps(
            {
                "content": sentence(rng, i),
                "agent": f"agent{i % 10}",
                "source": f"ticket:{i}",
                "created_at": f"2026-{1 + i % 11:02d}-{1 + i % 28:02d}T12:00:00Z",
            }
        ).encode()
        for i in range(n)
    )
    result = episodes.ImportResult()
    episodes.import_episodes(
        conn,
        episodes.parse_jsonl(settings, lines, skip_invalid=False, result=result),
        result=result,
    )
    embedder = LocalEmbedder()
    model = models.register(conn, embedder, state="active", build_index=False)
    conn.execute("DELETE FROM embed_queue")
    chunks = conn.execute(
        "SELECT agent, id, content, content_hash FROM chunks ORDER BY id"
    ).fetchall()
    vectors = embedder.embed([c["content"] for c in chunks[:real]]).vectors
    gen = np.random.default_rng(4)
    with (
        conn.cursor() as cur,
        cur.copy(
            sql.SQL(
                "COPY {} (agent, chunk_id, content_hash, embedding) FROM STDIN (FORMAT BINARY)"
            ).format(sql.Identifier(model.table_name))
        ) as cp,
    ):
        cp.set_types(["text", "int8", "bytea", "vector"])
        for i, row in enumerate(chunks):
            if i < real:
                v = np.asarray(vectors[i], dtype=np.float32)
            else:
                v = gen.normal(size=384).astype(np.float32)
                v /= np.linalg.norm(v)
            cp.write_row((row["agent"], row["id"], row["content_hash"], Vector(v)))
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(models.index_statement(model, concurrently=False))
    for i in range(300):
        service = SERVICES[i % len(SERVICES)]
        facts.set_fact(
            conn, f"{service}.node{i}.host", f"10.{i // 250}.{i % 250}.4", source="inventory"
        )
    conn.execute("VACUUM ANALYZE")
    print(
        f"loaded {n} episodes ({real} embedded by all-minilm), 300 facts in {time.perf_counter() - started:.0f} s"
    )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--real", type=int, default=2000, help="episodes embedded by the real model")
    p.add_argument("--runs", type=int, default=11)
    args = p.parse_args()
    env = {
        **os.environ,
        "MEMCTL_EMBEDDER": "local",
        "MEMCTL_EMBED_MODEL": "all-minilm",
        "MEMCTL_CONFIG": "/dev/null",
        "MEMCTL_RUNBOOKS": str(RUNBOOKS),
    }
    os.environ.update(
        {k: env[k] for k in ("MEMCTL_EMBEDDER", "MEMCTL_EMBED_MODEL", "MEMCTL_CONFIG")}
    )
    from memctl import config, db

    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    with server(args.database_url) as admin, fresh_database(admin) as url:
        with db.connect(url, vector=True) as conn:
            load(conn, config.load(), args.episodes, min(args.real, args.episodes))
        env["MEMCTL_DATABASE_URL"] = url
        recall_cmd, search_cmd = [exe, "recall", QUERY], [exe, "episode", "search", QUERY]
        shown = json.loads(
            subprocess.run(
                [*recall_cmd, "-f", "json"], env=env, check=True, capture_output=True, text=True
            ).stdout
        )
        kinds = [item["kind"] for item in shown["items"]]
        print(
            f"recall: {len(kinds)} items ({', '.join(f'{kinds.count(k)} {k}' for k in dict.fromkeys(kinds))}), "
            f"{shown['tokens']} tokens, counter: {shown['token_counter']}, mode {shown['mode']}"
        )
        ours, base = alternate(recall_cmd, search_cmd, env, args.runs)
    print(f"memctl episode search: median {median(base) * 1000:.0f} ms")
    print(f"memctl recall:         median {median(ours) * 1000:.0f} ms")
    print(f"ratio (goal <= 1.3): {median(ours) / median(base):.2f}")


if __name__ == "__main__":
    main()
