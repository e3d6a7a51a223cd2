"""What a query that names a period costs, by how many episodes the period holds: ranked exactly or on the indexes.

A query naming a period runs each half again inside it (memctl.reading.statement, PERIOD_EXACT): the
period's episodes are ranked exactly when they are at most PERIOD_EXACT, else each half runs on its
index with the period as a filter (an HNSW scan filtered to a small share of the table reads far
into the index before it has its rows). This loads --episodes synthetic episodes (Zipf words, as
tests/bench/search.py) spread evenly over three years for one agent, with clustered unit vectors
written straight into the active model's table, builds the HNSW index, then times batches of 40
queries (library search_batch, the vector given, warm) naming periods of several lengths, with
PERIOD_EXACT set to each value of --exact in turn (PERIOD_EXACT_SHARE off), and an undated batch as the
baseline. Each batch runs once untimed first.

    python tests/bench/period.py [--episodes 300000] [--days 1,7,11,15,20,30] [--exact 1000,5000,10000]
"""

from __future__ import annotations

import datetime
import json
import os
import random
import time

import numpy as np

from _common import fresh_database, parser, server
from search import clustered_vectors, sentence

END = datetime.datetime(2026, 11, 30, tzinfo=datetime.timezone.utc)
SPAN = datetime.timedelta(days=3 * 365)


def load(conn, settings, n: int, rng: random.Random):
    conn.use_settings(settings)
    from memctl.embedding import models
    from memctl.records import episodes

    lines = (
        json.dumps(
            {
                "content": sentence(rng, rng.randint(12, 30)),
                "agent": "ops",
                "created_at": (END - SPAN * (i / n)).isoformat(),
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
    model, centers = clustered_vectors(conn)
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(models.index_statement(model, concurrently=False))
    conn.execute("VACUUM ANALYZE")
    return centers


def per_query_ms(conn, settings, queries, vectors) -> float:
    conn.use_settings(settings)
    from memctl.reading import search

    # warm, and prepared: the whole batch once, so the run timed after it reads what the first read from disk
    # (a warm-up of five made the first of two runs over one period twice the second's time, at 1M)
    search.search_batch(conn, queries, vectors=vectors)
    started = time.perf_counter()
    search.search_batch(conn, queries, vectors=vectors)
    return 1000 * (time.perf_counter() - started) / len(queries)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=300_000)
    p.add_argument("--days", default="1,7,11,15,20,30", help="period lengths to ask about, in days")
    p.add_argument(
        "--exact", default="1000,5000,10000", help="PERIOD_EXACT values to time, in turn"
    )
    args = p.parse_args()
    rng = random.Random(3)
    with server(args.database_url) as admin, fresh_database(admin) as url:
        from memctl import config, db
        from memctl.reading import statement
        from memctl.reading.query import Query

        os.environ["MEMCTL_DATABASE_URL"] = url
        settings = config.load()
        with db.connect(url, vector=True) as conn:
            started = time.perf_counter()
            centers = load(conn, settings, args.episodes, rng)
            per_day = args.episodes / SPAN.days
            print(
                f"{args.episodes} episodes over {SPAN.days} days (about {per_day:.0f} a day), loaded and indexed "
                f"in {time.perf_counter() - started:.0f} s"
            )
            qrng = np.random.default_rng(9)
            starts = [
                END - datetime.timedelta(days=int(d)) for d in qrng.integers(40, 1000, size=40)
            ]
            words = [sentence(rng, 4) for _ in starts]
            vectors = [centers[qrng.integers(200)] for _ in starts]
            vectors = [v / np.linalg.norm(v) for v in vectors]
            undated = [Query(w, k=10, agent="ops") for w in words]
            print(f"undated: {per_query_ms(conn, settings, undated, vectors):.1f} ms a query")
            default = statement.PERIOD_EXACT, statement.PERIOD_EXACT_SHARE
            statement.PERIOD_EXACT_SHARE = (
                0  # each --exact value is the bound, not the table's share
            )
            try:
                for days in (int(d) for d in args.days.split(",")):
                    queries = [
                        Query(
                            f"{w} between {d:%Y-%m-%d} and {d + datetime.timedelta(days=days - 1):%Y-%m-%d}",
                            k=10,
                            agent="ops",
                        )
                        for w, d in zip(words, starts)
                    ]
                    times = []
                    for exact in (int(e) for e in args.exact.split(",")):
                        statement.PERIOD_EXACT = exact
                        statement._TEXTS.clear()
                        how = "exactly" if days * per_day <= exact else "indexes"
                        times.append(
                            f"PERIOD_EXACT {exact} ({how}) {per_query_ms(conn, settings, queries, vectors):.1f}"
                        )
                    print(
                        f"{days} days (about {days * per_day:.0f} episodes): "
                        + "; ".join(times)
                        + " ms a query"
                    )
            finally:
                statement.PERIOD_EXACT, statement.PERIOD_EXACT_SHARE = default
                statement._TEXTS.clear()


if __name__ == "__main__":
    main()
