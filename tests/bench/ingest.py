"""memctl ingest: lines/s through `ingest` ÷ `episode import` of the same file, and how soon a line written
to a live `ingest` is found by `episode search` by its words.

Throughput: the same N JSONL rows are loaded by `memctl episode import FILE` and by `memctl ingest FILE
--format jsonl --flush 1` (one second batches, each its own transaction), each in a fresh database, in
alternated rounds; the ratio is import's time ÷ ingest's (goal >= 0.5). Latency: a live `memctl ingest
--format lines --flush 1` reads a pipe; a line with a word of its own is written every --interval
seconds, and `memctl episode search WORD --mode text` (a fresh process each time, as an operator's shell
runs it) is run until it finds it; the time from the write to the first answer that holds it, p50 and
p95 (goal p95 <= 2 s; a search process's start is part of it). 2026-12-06, defaults, load average 6-7: ratio
0.85, p50 0.79 s, p95 0.95 s (docs/benchmarks.md).

    python tests/bench/ingest.py [--rows 20000] [--rounds 2] [--lines 20] [--interval 0.3] [--database-url URL]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import fresh_database, parser, server, timed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_ import rows  # noqa: E402  (the same rows as the import bench)


def run(exe: str, url: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "MEMCTL_DATABASE_URL": url, "MEMCTL_CONFIG": "/dev/null"}
    return subprocess.run(
        [exe, *args], env=env, check=True, capture_output=True, text=True, **kwargs
    )


def latency(exe: str, url: str, lines: int, interval: float) -> list[float]:
    env = {**os.environ, "MEMCTL_DATABASE_URL": url, "MEMCTL_CONFIG": "/dev/null"}
    proc = subprocess.Popen(
        [exe, "ingest", "--format", "lines", "--source", "bench", "--flush", "1"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    found = []
    try:
        for i in range(lines):
            word = f"zq{i:05d}marker"
            written = time.monotonic()
            proc.stdin.write(f"request {i} failed with {word} upstream\n".encode())
            proc.stdin.flush()
            while True:
                out = subprocess.run(
                    [exe, "episode", "search", word, "--mode", "text", "-f", "jsonl"],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                if word in out:
                    found.append(time.monotonic() - written)
                    break
                if time.monotonic() - written > 60:
                    raise SystemExit(f"line {i} not found after 60 s")
            time.sleep(interval)
    finally:
        proc.stdin.close()
        proc.wait(60)
    return found


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--lines", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.3)
    args = p.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="memctl-bench-ingest-"))
    path = workdir / "episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(args.rows)))
    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    ratios = []
    with server(args.database_url) as admin:
        for round_ in range(1, args.rounds + 1):
            with fresh_database(admin) as url:
                imported, _ = timed(run, exe, url, "episode", "import", str(path))
            with fresh_database(admin) as url:
                ingested, done = timed(
                    run, exe, url, "ingest", str(path), "--format", "jsonl", "--flush", "1"
                )
            ratios.append(imported / ingested)
            print(
                f"round {round_}: episode import {imported:.2f} s ({args.rows / imported:,.0f} rows/s); ingest "
                f"{ingested:.2f} s ({args.rows / ingested:,.0f} rows/s; {done.stderr.strip().splitlines()[-1]}); "
                f"ratio {imported / ingested:.2f}"
            )
        with fresh_database(admin) as url:
            run(exe, url, "db", "migrate")
            found = sorted(latency(exe, url, args.lines, args.interval))
    shutil.rmtree(workdir, ignore_errors=True)
    p95 = found[min(len(found) - 1, int(round(0.95 * (len(found) - 1))))]
    print(f"rows: {args.rows}, rounds: {args.rounds}, lines: {len(found)}")
    print(
        f"written -> found by episode search: p50 {statistics.median(found):.2f} s, p95 {p95:.2f} s "
        "(goal p95 <= 2 s)"
    )
    print(
        f"ratio ingest / episode import rows/s (goal >= 0.5), median of the rounds: {statistics.median(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
