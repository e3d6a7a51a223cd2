"""Bulk import: `memctl episode import` rows/s ÷ raw psycopg binary COPY rows/s.

The same N JSONL rows are loaded by the memctl command (a subprocess: JSON
parsing, validation, chunking, COPY of episodes and chunks, queueing) and, as
the baseline, by one binary COPY of the already-parsed rows into an identical
table (`CREATE TABLE ... (LIKE episodes INCLUDING ALL)`: same columns, the
generated tsvector, defaults and indexes, and the same gin_pending_list_limit).
Goal: ratio >= 0.6. 2026-12-06, defaults with --against main, load average 5-7: 0.48 (main 0.47), below
the goal (docs/benchmarks.md).

The two are alternated over --rounds rounds (memctl, COPY, memctl, COPY, ...), each in a fresh
database, so a machine that is busier for a while slows both; the ratio printed is the median of
the rounds' ratios, each round's shown too. --against DIR (a checkout of another revision, e.g.
`git worktree add DIR REV`) adds that checkout's memctl to every round (PYTHONPATH=DIR), so two
revisions are compared in one run on the same machine minute.

    python tests/bench/import_.py [--rows 100000] [--rounds 3] [--against DIR] [--ledger N] [--database-url URL]

Each import runs as an installation that has erased something: an erasure key in its MEMCTL_HOME and a
ledger of --ledger erased texts (default 1,000; 0: no key, no ledger), which every batch is looked up in
(memctl.write.erased): the cost of leaving out what was erased is in the figure.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import fresh_database, parser, server, timed

WORDS = (
    "deploy disk full nginx logs rotated postgres replica lag redis eviction memory pressure queue backlog "
    "consumer scaled certificate renewal backup restore latency index customer refund release freeze "
    "kernel reboot dns resolver webhook secret gateway rate limit vpn session heap mapping"
).split()


def rows(n: int) -> list[dict]:
    rng = random.Random(7)
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
        out.append(
            {
                "content": f"{i}: {text}",
                "kind": rng.choice(["raw", "conversation", "summary"]),
                "source": f"src{i % 50}",
                "agent": f"agent{i % 10}",
                "importance": rng.randint(1, 10),
                "created_at": (start + datetime.timedelta(seconds=i * 30)).isoformat(),
            }
        )
    return out


def baseline_copy(url: str, data: list[dict]) -> float:
    import psycopg
    from psycopg.types.json import Jsonb

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS episodes_baseline")
        conn.execute("CREATE TABLE episodes_baseline (LIKE episodes INCLUDING ALL)")
        tuples = [
            (
                r["agent"],
                r["kind"],
                r["content"],
                hashlib.sha256(r["content"].encode()).digest(),
                r["source"],
                r["importance"],
                datetime.datetime.fromisoformat(r["created_at"]),
                Jsonb({}),
            )
            for r in data
        ]

        def copy():
            with conn.transaction(), conn.cursor() as cur:
                # the same GIN pending-list setting memctl's import uses, so the ratio measures memctl
                cur.execute("SET LOCAL gin_pending_list_limit = '64MB'")
                with cur.copy(
                    "COPY episodes_baseline (agent, kind, content, content_hash, source, importance, "
                    "created_at, meta) FROM STDIN (FORMAT BINARY)"
                ) as cp:
                    cp.set_types(
                        ["text", "text", "text", "bytea", "text", "int2", "timestamptz", "jsonb"]
                    )
                    for t in tuples:
                        cp.write_row(t)

        seconds, _ = timed(copy)
        return seconds


def ledger(url: str, key: bytes, n: int) -> None:
    """One ledger entry of N erased texts' digests (none of them in the file), as an erasure writes it."""
    from memctl import db, places

    with db.connect(
        url
    ) as conn:  # it declares the schema, which sql/0025 requires of a session that writes
        conn.execute(
            "INSERT INTO erasures (id, erased_at, op, key_id) VALUES ('bench', now(), 'episode_delete', %s)",
            (places.key_id(key),),
        )
        conn.execute(
            "INSERT INTO erasure_digests (digest, kind, erasure) SELECT %s || i, 'episode', 'bench' "
            "FROM generate_series(1, %s) AS i",
            (places.digest(key, "erased"), n),
        )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds of both (default 3)")
    p.add_argument(
        "--against", type=Path, help="a checkout of another revision whose memctl joins every round"
    )
    p.add_argument(
        "--ledger",
        type=int,
        default=1000,
        help="erased texts in the ledger each import looks up in",
    )
    args = p.parse_args()
    data = rows(args.rows)
    workdir = Path(tempfile.mkdtemp(prefix="memctl-bench-import-"))
    path = workdir / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    ratios, theirs = [], []

    home = workdir / "home"
    if args.ledger:
        from memctl import places

        key = places.load_key(places.key_file(home))

    def memctl_import(admin: str, extra: dict) -> tuple[float, dict]:
        with fresh_database(admin) as url:
            if args.ledger:
                ledger(url, key, args.ledger)
                extra = {"MEMCTL_HOME": str(home), **extra}
            env = {**os.environ, "MEMCTL_DATABASE_URL": url, "MEMCTL_CONFIG": "/dev/null", **extra}
            seconds, proc = timed(
                subprocess.run,
                [exe, "episode", "import", str(path), "-f", "json"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            return seconds, json.loads(proc.stdout)[0]

    with server(args.database_url) as admin:
        for round_ in range(1, args.rounds + 1):
            ours, summary = memctl_import(admin, {})
            with fresh_database(admin) as url:
                base = baseline_copy(url, data)
            ratios.append(base / ours)
            print(
                f"round {round_}: memctl episode import {ours:.2f} s ({args.rows / ours:,.0f} rows/s, process start "
                f"included, {summary['chunks']} chunks); raw binary COPY {base:.2f} s "
                f"({args.rows / base:,.0f} rows/s); ratio {base / ours:.2f}"
            )
            if args.against is not None:
                other, _ = memctl_import(admin, {"PYTHONPATH": str(args.against)})
                theirs.append(base / other)
                print(
                    f"         that memctl ({args.against}) {other:.2f} s; ratio {base / other:.2f}"
                )
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"rows: {args.rows}, rounds: {args.rounds}")
    print(f"ratio (goal >= 0.6), median of the rounds: {statistics.median(ratios):.2f}")
    if theirs:
        print(f"that memctl's ratio, median of the same rounds: {statistics.median(theirs):.2f}")


if __name__ == "__main__":
    main()
