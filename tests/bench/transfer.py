"""Export and import: `memctl export` / `memctl import` rows/s ÷ COPY of the same tables.

N episodes (tests/bench/import_.py's generator, a tenth of them carrying a commit id, a
twentieth a secret) and N/50 facts with two versions each are loaded into a fresh database.
Then, side by side in one run:

  export   `memctl export --out F` (a subprocess: one snapshot, server-side cursors, one
           JSON object per record) ÷ `COPY (SELECT ... ORDER BY id) TO STDOUT` of the same
           columns of episodes, facts, fact_history and blocked_sources, read by psycopg.
  import   `memctl import F` into a second fresh database (a subprocess: parsing, checking,
           redaction, dedup lookup, chunking, COPY of episodes and chunks) ÷ binary COPY of
           the already-parsed episode rows into an identical table (LIKE episodes INCLUDING
           ALL: the generated tsvector, its GIN index, same gin_pending_list_limit).
  redact   the import again with [redaction] mode = "off", to show what redaction costs.

With --vectors the source is embedded first (hash embedder) and the export carries vectors;
the import then writes vectors instead of queue rows.

    python tests/bench/transfer.py [--rows 100000] [--vectors] [--database-url URL]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import fresh_database, parser, server, timed
from import_ import baseline_copy, rows as episode_rows

SECRET = "ghp_aBcD1234EfGh5678IjKl9012MnOp3456QrSt"
COMMIT = "3f2c1a9e8b7d6c5f4e3a2b1c0d9e8f7a6b5c4d3e"


WRAPPER = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[2:]).returncode
open(sys.argv[1], "w").write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
sys.exit(code)
"""


def dataset(n: int) -> list[dict]:
    data = episode_rows(n)
    for i, row in enumerate(data):
        if i % 10 == 0:
            row["content"] += f" fixed in {COMMIT}"
        if i % 20 == 5:
            row["content"] += f" token {SECRET}"
    return data


def copy_out(url: str) -> tuple[float, int]:
    import psycopg

    queries = [
        "COPY (SELECT id, agent, kind, source, importance, created_at, meta, content FROM episodes ORDER BY id) "
        "TO STDOUT",
        "COPY (SELECT namespace, key, value, source, version, updated_at FROM facts ORDER BY namespace, key) TO STDOUT",
        "COPY (SELECT namespace, key, version, op, old_value, new_value, source, changed_at FROM fact_history "
        "ORDER BY namespace, key, version) TO STDOUT",
        "COPY (SELECT source, reason, blocked_at FROM blocked_sources) TO STDOUT",
    ]

    def run() -> int:
        size = 0
        with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
            for query in queries:
                with cur.copy(query) as copy:
                    for block in copy:
                        size += len(block)
        return size

    return timed(run)


def copy_in(url: str, data: list[dict]) -> float:
    """Raw binary COPY of the same episodes into a copy of the table: import_.py's baseline."""
    return baseline_copy(url, data)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--vectors", action="store_true")
    args = p.parse_args()
    data = dataset(args.rows)
    workdir = Path(tempfile.mkdtemp(prefix="memctl-bench-transfer-"))
    episodes_file, facts_file = workdir / "episodes.jsonl", workdir / "facts.jsonl"
    episodes_file.write_text("".join(json.dumps(r) + "\n" for r in data))
    nfacts = max(1, args.rows // 50)
    facts_file.write_text(
        "".join(
            json.dumps({"key": f"svc{i}.host", "value": f"10.8.{v}.{i % 250}"}) + "\n"
            for v in range(2)
            for i in range(nfacts)
        )
    )
    export_file = workdir / "export.jsonl"
    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    off = workdir / "off.toml"
    off.write_text('[redaction]\nmode = "off"\n')
    base_env = {  # over os.environ as it is at each run: server() gives the run its own MEMCTL_HOME
        "MEMCTL_CONFIG": "/dev/null",
        "MEMCTL_EMBEDDER": "hash",
        "MEMCTL_EMBED_MODEL": "hash-embed",
    }

    def memctl(url, *argv, config=None):
        """Run memctl; returns (stdout, peak RSS in MiB of that process alone).

        Through a small Python wrapper: a child forked straight from this process would start its
        high-water mark at this process's size (the data set), which Linux keeps across exec.
        """
        env = {
            **os.environ,
            **base_env,
            "MEMCTL_DATABASE_URL": url,
            **({"MEMCTL_CONFIG": str(config)} if config else {}),
        }
        rss = workdir / "rss"
        proc = subprocess.run(
            [sys.executable, "-c", WRAPPER, str(rss), exe, *argv],
            env=env,
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise SystemExit(f"memctl {argv[0]} failed ({proc.returncode}): {proc.stderr[-500:]}")
        return proc.stdout, int(rss.read_text()) / 1024

    with server(args.database_url) as admin:
        with fresh_database(admin) as source:
            memctl(
                source, "episode", "import", str(episodes_file), config=off
            )  # the secrets stay, for import
            memctl(source, "fact", "import", str(facts_file))
            memctl(source, "source", "block", "src7", "--reason", "bench")
            if args.vectors:
                memctl(source, "embed", "--batch-size", "256")
            extra = ["--vectors"] if args.vectors else []
            exported, (_, export_rss) = timed(
                memctl, source, "export", "--out", str(export_file), *extra
            )
            base_out, size = copy_out(source)
        records = sum(1 for _ in export_file.open()) - 1
        with fresh_database(admin) as target:
            imported, (stdout, import_rss) = timed(
                memctl, target, "import", str(export_file), "-f", "json"
            )
            summary = json.loads(stdout)[0]
            base_in = copy_in(target, data)
        with fresh_database(admin) as target:
            unredacted, _ = timed(
                memctl, target, "import", str(export_file), "-f", "json", config=off
            )
    mib = export_file.stat().st_size / 2**20
    shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"episodes: {args.rows}, facts: {nfacts} x 2 versions, records exported: {records} ({mib:.1f} MiB"
        f"{', with vectors' if args.vectors else ''}; COPY text {size / 2**20:.1f} MiB)"
    )
    print(
        f"import wrote: {summary['episodes']} episodes, {summary['chunks']} chunks, {summary['vectors']} vectors, "
        f"{summary['queued']} queued, {summary['redacted']} secrets redacted"
    )
    print(
        f"memctl export:   {exported:.2f} s  ({records / exported:,.0f} records/s, process start included)"
    )
    print(f"COPY TO STDOUT:  {base_out:.2f} s  ({records / base_out:,.0f} rows/s)")
    print(f"export ratio: {base_out / exported:.2f}")
    print(f"peak RSS: export {export_rss:.0f} MiB, import {import_rss:.0f} MiB")
    print(f"memctl import:   {imported:.2f} s  ({records / imported:,.0f} records/s, redaction on)")
    print(f"  redaction off: {unredacted:.2f} s  ({records / unredacted:,.0f} records/s)")
    print(f"binary COPY in (episodes only): {base_in:.2f} s  ({args.rows / base_in:,.0f} rows/s)")
    print(
        f"import ratio: {(records / imported) / (args.rows / base_in):.2f} "
        f"(redaction off: {(records / unredacted) / (args.rows / base_in):.2f})"
    )


if __name__ == "__main__":
    main()
