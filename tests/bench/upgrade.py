"""Benchmark: `memctl db migrate` of a large memory from the oldest fixture's schema to today's, while a writer writes.

    python tests/bench/upgrade.py                       # 100k episodes, a quick run
    python tests/bench/upgrade.py --episodes 1000000    # the issue's figure
    python tests/bench/upgrade.py --episodes 1000000 --from 3ef5ae8   # from main's schema before 0.2.0

The oldest fixture (tests/data/upgrade/c7e1950.dump: 0001 and 0002 as first written; --from another fixture's
commit) is restored, then N episodes
of 8-30 words (seeded), each with its one chunk, and N/100 facts with two versions each are added server-side
(c7e1950 could not embed: no vector table). Then, timed:

- the verified backup `memctl db migrate` takes first (memctl.upgrade.migrating.take_verified: pg_dump of one
  snapshot, restored into a scratch database and compared): it blocks no writer;
- the migrations (memctl.db.migrate.apply): the fix-up of 0002 and 0003 through today's last, each in its
  transaction, timed by its record's applied_at.

Beside the migrations a writer inserts an episode and a fact's history row every 50 ms, each statement timed
(a session declaring today's schema, so 0025's guard admits it). Printed: the migration's total time, each
migration's time, and the longest time any write waited, against the writer's p99 before the migration started
(the baseline measured in the same run; goal: no write waits more than 5 s). Nothing is asserted: a measurement.

Server: MEMCTL_TEST_DATABASE_URL or --database-url (a role with CREATEDB), else an embedded server started in a
temporary MEMCTL_HOME and removed afterwards.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from pathlib import Path

import _common  # noqa: E402  (tests/bench on sys.path: run as a script)
import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from memctl import db
from memctl.db import migrate

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "upgrade"
WORDS = "ARRAY[" + ", ".join(f"'{w}'" for w in _common.WORDS) + "]"
EPISODES = f"""
INSERT INTO episodes (agent, kind, content, content_hash, source, importance, created_at)
SELECT 'agent-' || (i %% 20), (ARRAY['observation', 'incident', 'conversation'])[1 + i %% 3], t.content,
       sha256(convert_to(t.content, 'UTF8')), 'bench', i %% 11, now() - (i %% 400) * interval '1 day'
FROM generate_series(1, %(n)s) AS i,
     LATERAL (SELECT string_agg(({WORDS})[1 + floor(random() * {len(_common.WORDS)})::int], ' ') || ' (' || i || ')'
              AS content FROM generate_series(1, 8 + i %% 23) WHERE i > 0) AS t
"""
CHUNKS = "INSERT INTO chunks (agent, episode_id, seq, content, content_hash) SELECT agent, id, 0, content, content_hash FROM episodes"
FACTS = """
INSERT INTO facts (namespace, key, value, source, version) SELECT 'default', 'key.' || i, 'v2-' || i, 'bench', 2
FROM generate_series(1, %(n)s) AS i
"""
HISTORY = """
INSERT INTO fact_history (namespace, key, version, op, old_value, new_value, source)
SELECT 'default', 'key.' || i, v, 'set', CASE v WHEN 2 THEN 'v1-' || i END, 'v' || v || '-' || i, 'bench'
FROM generate_series(1, %(n)s) AS i, generate_series(1, 2) AS v
"""
WRITE_EPISODE = (
    "INSERT INTO episodes (agent, kind, content, content_hash, source, importance) "
    "VALUES ('writer', 'observation', %s, sha256(convert_to(%s, 'UTF8')), 'writer', 5)"
)
WRITE_HISTORY = (
    "INSERT INTO fact_history (namespace, key, version, op, new_value, source) "
    "VALUES ('default', 'writer.key', %s, 'set', 'x', 'writer')"
)


class Writer(threading.Thread):
    """Writes every 50 ms on its own connection; each statement's wall time, with when it started."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.timed = url, threading.Event(), []

    def run(self) -> None:
        with db.connect(self.url) as conn:
            n = 0
            while not self.stop.is_set():
                n += 1
                text = f"written during the upgrade {n}"
                for statement, params in ((WRITE_EPISODE, (text, text)), (WRITE_HISTORY, (n,))):
                    began = time.monotonic()
                    conn.execute(statement, params)
                    self.timed.append((began, time.monotonic() - began))
                self.stop.wait(0.05)

    def between(self, start: float, end: float) -> list[float]:
        return [
            took
            for began, took in self.timed
            if start <= began < end or start <= began + took < end
        ]


def restore_fixture(url: str, dump: Path) -> None:
    from memctl.backup import pgtools

    with psycopg.connect(url, autocommit=True) as conn:
        major = conn.info.server_version // 10000
    tools = pgtools.for_restore(major, 18)
    work = Path(f"/tmp/memctl-bench-upgrade-{uuid.uuid4().hex[:8]}.list")
    try:
        listing = pgtools.listing(tools, dump, work)
        with pgtools.connection_env(url) as env:
            pgtools.restore_script(
                tools,
                dump,
                listing,
                env,
                server_major=major,
                before="CREATE EXTENSION IF NOT EXISTS vector;",
                after="SELECT 1;",
            )
    finally:
        work.unlink(missing_ok=True)


def main() -> None:
    p = _common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--no-backup", action="store_true", help="time the migrations only")
    p.add_argument(
        "--from",
        dest="start",
        default="c7e1950",
        help="the fixture (commit) whose schema to start from",
    )
    args = p.parse_args()
    with _common.server(args.database_url) as admin:
        name = f"memctl_bench_upgrade_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = make_conninfo(admin, dbname=name)
        try:
            run(url, args)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def run(url: str, args) -> None:
    import tempfile

    from memctl.upgrade import migrating

    restore_fixture(url, FIXTURES / f"{args.start}.dump")
    began = time.monotonic()
    with db.connect(url) as conn:
        conn.execute(EPISODES, {"n": args.episodes})
        conn.execute(CHUNKS)
        conn.execute(FACTS, {"n": max(1, args.episodes // 100)})
        conn.execute(HISTORY, {"n": max(1, args.episodes // 100)})
        conn.execute("VACUUM ANALYZE")
        print(
            f"loaded {args.episodes:,} episodes and chunks, {max(1, args.episodes // 100):,} facts in "
            f"{time.monotonic() - began:.0f} s ({args.start}'s schema)",
            flush=True,
        )
    writer = Writer(url)
    writer.start()
    time.sleep(3)  # the baseline: the writer alone
    baseline = sorted(t for _, t in writer.timed)
    with (
        db.connect(url) as conn,
        tempfile.TemporaryDirectory(prefix="memctl-bench-backup-") as backups,
    ):
        if not args.no_backup:
            start = time.monotonic()
            migrating.take_verified(conn, url, Path(backups), lambda line: None)
            backup_s = time.monotonic() - start
            print(f"backup and its verification: {backup_s:.1f} s (writes go on)", flush=True)
        start = time.monotonic()
        steps: list[tuple[str, float]] = []  # (line, when it was said)
        applied = migrate.apply(
            conn,
            report=lambda line: print(f"  {line}", flush=True),
            progress=lambda line: steps.append((line, time.monotonic())),
        )
        total = time.monotonic() - start
    time.sleep(1)
    writer.stop.set()
    writer.join()
    during = writer.between(start, start + total)
    p99 = baseline[min(len(baseline) - 1, int(len(baseline) * 0.99))]
    print(f"migrations ({len(applied)}), each with the longest write wait while it ran:")
    previous = start
    for line, when in steps:
        waits = writer.between(previous, when)
        print(f"  {line}; longest write wait {max(waits, default=0.0):.2f} s")
        previous = when
    longest = max(during) if during else 0.0
    print(
        f"migrated {args.episodes:,} episodes from {args.start}'s schema to {migrate.newest()} in {total:.1f} s; "
        f"longest write wait {longest:.2f} s over {len(during)} writes (baseline p99 {p99 * 1000:.1f} ms, "
        f"median {statistics.median(baseline) * 1000:.1f} ms; ratio {longest / p99:.0f}x; goal: under 5 s)"
    )


if __name__ == "__main__":
    main()
