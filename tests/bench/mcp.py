"""`memctl mcp`: a `search` tool call through a live client session ÷ the same search run two other ways.

One database holds --episodes episodes of six agents, embedded by --embedder (default: the
local MiniLM when installed, else the deterministic hash embedder), vacuumed and analyzed as
autovacuum leaves it soon after a load. The same hybrid query
for agent a runs three ways:

  1. as a `search` tool call on a live MCP session: the SDK's stdio client talking to the
     installed `memctl mcp --agent a`, started once (its start is not timed);
  2. as a fresh `memctl episode search QUERY --agent a` process, as an agent without MCP
     would run it;
  3. in this process through the library, memctl.reading.search.search() on one connection.

Hits count as accessed in all three (the server is not --read-only). The tool call and the
library call alternate, --calls times each after warm-up; the fresh processes run --runs
times. Printed: the medians, and the ratios tool call ÷ fresh process (goal <= 0.1) and tool
call ÷ library (goal <= 1.5).

    python tests/bench/mcp.py [--episodes 5000] [--calls 200] [--runs 11] [--embedder hash|local]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio

from _common import (
    embedder_env,
    fresh_database,
    load_words,
    local_or_hash,
    median,
    parser,
    percentile,
    server,
    wall,
)

# This file is named mcp.py: the SDK's package `mcp` must not resolve to it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

QUERY = "deploy failed: disk full after nginx logs rotated"
AGENTS = [f"agent{i}" for i in range(6)]


def load(url: str, settings, n: int) -> None:
    load_words(url, settings, n, lambda i: "a" if i % 6 == 0 else AGENTS[i % 6])


async def measure(exe: str, env: dict, calls: int, library) -> tuple[list[float], list[float], int]:
    """Per-call seconds of the tool call and of the library call, alternating; and the tool's hit count."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=exe, args=["mcp", "--agent", "a"], env=env)
    tool, lib = [], []
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for _ in range(5):  # the connection, the embedder, the server's caches
                    first = await session.call_tool("search", {"query": QUERY, "k": 5})
                    library()
                if first.is_error or first.structured_content["degraded"]:
                    raise SystemExit(f"the tool call failed or degraded: {first.content[0].text}")
                for _ in range(calls):
                    start = time.perf_counter()
                    await session.call_tool("search", {"query": QUERY, "k": 5})
                    tool.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    library()
                    lib.append(time.perf_counter() - start)
    return tool, lib, len(first.structured_content["results"])


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=5000)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--embedder", choices=["hash", "local"], default=None)
    args = p.parse_args()
    embedder = local_or_hash(args.embedder)
    model = "all-minilm" if embedder == "local" else "hash-embed"
    env = embedder_env(embedder, model)
    from memctl import config, db
    from memctl.reading import search
    from memctl.reading.query import Query

    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    settings = config.load()
    with server(args.database_url) as admin, fresh_database(admin) as url:
        env["MEMCTL_DATABASE_URL"] = url
        started = time.perf_counter()
        load(url, settings, args.episodes)
        subprocess.run([exe, "embed"], env=env, check=True, stdout=subprocess.DEVNULL)
        # What autovacuum does within a minute or two of a load (tests/bench/search.py does the same): merges
        # the import's GIN pending list, which every text lookup otherwise reads whole (13-21 ms a query here
        # against 1, for the rare-word counts), and gathers the word statistics.
        with db.connect(url) as conn:  # autocommit, as VACUUM needs
            conn.execute("VACUUM ANALYZE")
        print(
            f"loaded and embedded {args.episodes} episodes ({embedder}) in {time.perf_counter() - started:.0f} s"
        )
        cli = [exe, "episode", "search", QUERY, "--agent", "a", "-k", "5", "-f", "json"]
        for _ in range(2):
            wall(cli, env)
        fresh = [wall(cli, env) for _ in range(args.runs)]
        with db.connect(url, vector=True) as conn:

            def library():
                outcome = search.search(
                    conn.use_settings(settings), Query(QUERY, k=5, agent="a"), track=True
                )
                if outcome.warning or len(outcome.hits) != 5:
                    raise SystemExit(
                        f"the library search degraded or came short: {outcome.warning}"
                    )

            tool, lib, hits = anyio.run(measure, exe, env, args.calls, library)
    print(
        f"search tool call, live MCP session: median {median(tool) * 1000:.2f} ms, p95 "
        f"{percentile(tool, 0.95) * 1000:.2f} ms ({hits} hits, {args.calls} calls)"
    )
    print(
        f"library search in process:          median {median(lib) * 1000:.2f} ms, p95 "
        f"{percentile(lib, 0.95) * 1000:.2f} ms"
    )
    print(
        f"fresh memctl episode search:        median {median(fresh) * 1000:.0f} ms ({args.runs} runs)"
    )
    print(f"ratio tool call / fresh process (goal <= 0.1): {median(tool) / median(fresh):.3f}")
    print(f"ratio tool call / library (goal <= 1.5): {median(tool) / median(lib):.2f}")


if __name__ == "__main__":
    main()
