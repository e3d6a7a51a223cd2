"""Benchmark: `memctl erasure verify` against a plain read of the same texts.

    python tests/bench/erasure_verify.py                    # 100k episodes
    python tests/bench/erasure_verify.py --episodes 1000000

Builds one database with N episodes of about 60 characters, one chunk each (INSERT ... SELECT FROM
generate_series: this bench's own fill) and a ledger of 100 entries of 10 episode digests each, then
measures, alternately (after one unmeasured round), memctl.backup.erasure.find_matches (a keyed
digest of every episode and chunk text, computed by the server) and the baseline: one pass reading
the same two columns, `sum(length(content))` over episodes and over chunks. Prints both medians and
the ratio verify / baseline. Nothing is asserted: a measurement, not a test.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else an embedded server
started in a temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench._common import fresh_database, median, parser, server  # noqa: E402

EPISODES = """
INSERT INTO episodes (agent, kind, content, content_hash, importance)
SELECT 'agent-' || (i %% 50), 'raw', 'episode ' || i || ': disk full on db' || (i %% 7) || ', logs rotated',
       sha256(('episode ' || i)::bytea), 5
FROM generate_series(1, %s) AS i
"""
CHUNKS = (
    "INSERT INTO chunks (agent, episode_id, seq, content, content_hash) "
    "SELECT agent, id, 0, content, content_hash FROM episodes"
)
BASELINE = "SELECT (SELECT sum(length(content)) FROM episodes) + (SELECT sum(length(content)) FROM chunks) AS n"


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    with server(args.database_url) as admin, fresh_database(admin) as url:
        from memctl import db
        from memctl.records import erasures
        from memctl.backup import erasure

        key = os.urandom(erasures.KEY_BYTES)
        now = datetime.datetime.now(datetime.timezone.utc)
        entries = [
            erasures.Entry(
                "episode_delete",
                now,
                erasures.key_id(key),
                items={
                    "episodes": [
                        {
                            "agent": "x",
                            "id": -1,
                            "digest": erasures.digest(key, f"gone {n}.{m}"),
                            "chunks": [],
                        }
                        for m in range(10)
                    ]
                },
            )
            for n in range(100)
        ]
        with db.connect(url) as conn:
            conn.execute(EPISODES, (args.episodes,))
            conn.execute(CHUNKS)
            conn.execute("VACUUM ANALYZE")
            ours, base = [], []
            for round_ in range(args.runs + 1):
                started = time.perf_counter()
                matches, _ = erasure.find_matches(conn, entries, key)
                middle = time.perf_counter()
                conn.execute(BASELINE).fetchone()
                if round_:
                    ours.append(middle - started)
                    base.append(time.perf_counter() - middle)
            assert matches == []
        print(f"episodes {args.episodes:,} (+ as many chunks), 1,000 ledger digests")
        print(
            f"erasure verify: {median(ours) * 1000:.0f} ms; baseline read of the same texts: "
            f"{median(base) * 1000:.0f} ms"
        )
        print(f"ratio verify / plain read: {median(ours) / median(base):.2f}")


if __name__ == "__main__":
    main()
