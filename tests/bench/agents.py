"""Agents under row-level security: what the agent's role costs a search, HTTP against stdio, many HTTP clients.

One database holds --episodes episodes across 20 registered agents (a0..a19), embedded by the hash
embedder (the cost measured is the database's and the transport's, not the model's), vacuumed and
analyzed. Printed side by side, from one run:

  1. the same hybrid search for agent a0 through the library, on one connection in a0's role (SET
     ROLE: row-level security applies) and on one as the owner (it does not), alternating
     --calls times: ratio role / owner (goal <= 1.15). In the role (Memory.as_agent), words are found
     through memctl_agent_matches (sql/0022, docs/agents.md): `@@` is not LEAKPROOF, so under
     row-level security the text index could not serve it (before 0022: 3.14 at 50k episodes, the
     counts of the query's rare words being sequential scans of the agent's episodes). Measured at
     100k episodes, 100 calls, 50 clients for 30 s (2026-12-06, 2 busy cores): 0.19 (role 6.4 ms,
     owner 33.2 ms: in the role the planner ranks the agent's vectors exactly by their primary key,
     the owner's plan walks HNSW with the agent as a filter), HTTP / stdio 1.05, 528 calls, 0
     errors, 0 out of scope, p50 2.9 s, p99 5.1 s;
  2. a `search` tool call for a0 over `memctl mcp --http` (the SDK's streamable HTTP client, a
     bearer token) and over `memctl mcp --agent a0` on stdio, alternating --calls times: ratio
     HTTP / stdio (goal <= 1.5);
  3. --clients HTTP clients of 10 agents calling `search` at once for --seconds: errors (goal 0),
     answers holding another agent's episode (goal 0), p50 and p99; meanwhile --slow connections from
     another address (127.0.0.2) that never finish their headers, each opened again as soon as the
     server closes it ([http] header_timeout, max_connections_per_client: memctl.mcp.bounds), counted.

With the wall of sql/0023 (docs/agents.md "Threat model"): the policies' functions answer only about their
caller and treat the groups as roles that see nothing, and writes take memctl's locks through definer
functions on tables no agent may lock. Printed besides: the same search in text mode (the policies and
memctl_agent_matches alone), and an episode written through the gate (its fold, its locks) in a0's role
and as the owner, alternating --calls times: ratio role / owner.

    python tests/bench/agents.py [--episodes 100000] [--calls 200] [--clients 50] [--seconds 60] [--slow 40]
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio

from _common import (
    WORDS,
    embedder_env,
    fresh_database,
    load_words,
    median,
    parser,
    percentile,
    server,
)

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

QUERY = "deploy failed: disk full after nginx logs rotated"
AGENTS = [f"a{i}" for i in range(20)]


def load(url: str, settings, n: int) -> None:
    load_words(url, settings, n, lambda i: AGENTS[i % len(AGENTS)])


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_client(url: str, token: str):
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def session():
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as client:
            async with streamable_http_client(url, http_client=client) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    yield s

    return session()


async def transports(
    exe: str, env: dict, url: str, token: str, calls: int
) -> tuple[list[float], list[float]]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    http, stdio = [], []
    params = StdioServerParameters(
        command=exe, args=["mcp", "--agent", "a0", "--read-only"], env=env
    )
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as local:
                await local.initialize()
                async with _http_client(url, token) as remote:
                    for _ in range(5):
                        await local.call_tool("search", {"query": QUERY, "k": 5})
                        await remote.call_tool("search", {"query": QUERY, "k": 5})
                    for _ in range(calls):
                        start = time.perf_counter()
                        await remote.call_tool("search", {"query": QUERY, "k": 5})
                        http.append(time.perf_counter() - start)
                        start = time.perf_counter()
                        await local.call_tool("search", {"query": QUERY, "k": 5})
                        stdio.append(time.perf_counter() - start)
    return http, stdio


async def slowloris(port: int, deadline: float, opened: list[int]) -> None:
    """Connections from 127.0.0.2 that never finish their headers, each opened again once the server closes it."""

    async def one() -> None:
        while time.monotonic() < deadline:
            try:
                sock = await anyio.connect_tcp("127.0.0.1", port, local_host="127.0.0.2")
            except OSError:
                await anyio.sleep(0.1)
                continue
            opened[0] += 1
            async with sock:
                await sock.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                with anyio.move_on_after(max(0.0, deadline - time.monotonic())):
                    try:
                        while await sock.receive():
                            pass
                    except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        pass

    async with anyio.create_task_group() as group:
        for _ in range(opened[1]):
            group.start_soon(one)


async def crowd(
    url: str, tokens: dict[str, str], clients: int, seconds: float, slow: int = 0
) -> tuple[list[float], int, int, int]:
    times: list[float] = []
    errors = [0]
    foreign = [0]
    deadline = time.monotonic() + seconds
    opened = [0, slow]

    async def one(i: int) -> None:
        agent = AGENTS[i % 10]
        try:
            async with _http_client(url, tokens[agent]) as s:
                while time.monotonic() < deadline:
                    start = time.perf_counter()
                    result = await s.call_tool(
                        "search", {"query": random.choice(WORDS) + " " + QUERY, "k": 5}
                    )
                    times.append(time.perf_counter() - start)
                    if result.is_error:
                        errors[0] += 1
                    elif any(r["agent"] != agent for r in result.structured_content["results"]):
                        foreign[0] += 1
        except Exception:
            errors[0] += 1

    async with anyio.create_task_group() as group:
        if slow:
            group.start_soon(slowloris, int(url.rsplit(":", 1)[1].split("/")[0]), deadline, opened)
        for i in range(clients):
            group.start_soon(one, i)
    return times, errors[0], foreign[0], opened[0]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--episodes", type=int, default=100_000)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--slow", type=int, default=40)
    args = p.parse_args()
    env = embedder_env("hash", "hash-embed")
    from memctl import config, db
    from memctl.reading import search
    from memctl.reading.query import Query
    from memctl.records import agents, episodes

    exe = shutil.which("memctl") or str(Path(sys.executable).parent / "memctl")
    settings = config.load()
    with server(args.database_url) as admin, fresh_database(admin) as url:
        env["MEMCTL_DATABASE_URL"] = url
        started = time.perf_counter()
        load(url, settings, args.episodes)
        subprocess.run([exe, "embed"], env=env, check=True, stdout=subprocess.DEVNULL)
        with db.connect(url) as conn:
            conn.execute("VACUUM ANALYZE")
            for name in AGENTS:
                if agents.show(conn, name, missing_ok=True) is None:
                    agents.add(conn, name)
            tokens = {name: agents.issue_token(conn, name) for name in AGENTS}
        print(
            f"loaded and embedded {args.episodes} episodes of {len(AGENTS)} agents in "
            f"{time.perf_counter() - started:.0f} s"
        )

        with db.connect(url, vector=True) as owner, db.connect(url, vector=True) as role:
            role.as_agent(agents.show(owner, "a0").role)

            def run(conn) -> float:
                start = time.perf_counter()
                outcome = search.search(
                    conn.use_settings(settings), Query(QUERY, k=10, agent="a0"), track=False
                )
                if outcome.warning or not outcome.hits or {h.agent for h in outcome.hits} != {"a0"}:
                    raise SystemExit(
                        f"the search degraded, came back empty or left a0: {outcome.warning}"
                    )
                return time.perf_counter() - start

            def text(conn) -> float:
                start = time.perf_counter()
                search.search(
                    conn.use_settings(settings),
                    Query(QUERY, k=10, agent="a0", mode="text"),
                    track=False,
                )
                return time.perf_counter() - start

            def write(conn, i: int) -> float:
                start = time.perf_counter()
                episodes.add(
                    conn.use_settings(settings),
                    f"{random.choice(WORDS)} write {i} {QUERY}",
                    agent="a0",
                )
                return time.perf_counter() - start

            for i in range(5):
                (
                    run(owner),
                    run(role),
                    text(owner),
                    text(role),
                    write(owner, -i),
                    write(role, -i - 10),
                )
            as_owner, as_role, text_owner, text_role, write_owner, write_role = (
                [],
                [],
                [],
                [],
                [],
                [],
            )
            for i in range(args.calls):
                as_owner.append(run(owner))
                as_role.append(run(role))
                text_owner.append(text(owner))
                text_role.append(text(role))
                write_owner.append(write(owner, 2 * i))
                write_role.append(write(role, 2 * i + 1))

        port = _port()
        log = open(os.devnull, "w")
        proc = subprocess.Popen(
            [exe, "mcp", "--http", f"127.0.0.1:{port}"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            for _ in range(600):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    time.sleep(0.1)
            endpoint = f"http://127.0.0.1:{port}/mcp"
            http, stdio = anyio.run(transports, exe, env, endpoint, tokens["a0"], args.calls)
            times, errors, foreign, slow = anyio.run(
                crowd, endpoint, tokens, args.clients, args.seconds, args.slow
            )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(
        f"search in a0's role (RLS):  median {median(as_role) * 1000:.2f} ms ({args.calls} calls)"
    )
    print(f"search as the owner:        median {median(as_owner) * 1000:.2f} ms")
    print(f"ratio role / owner (goal <= 1.15): {median(as_role) / median(as_owner):.3f}")
    print(
        f"text mode: role median {median(text_role) * 1000:.2f} ms, owner {median(text_owner) * 1000:.2f} ms; "
        f"ratio role / owner: {median(text_role) / median(text_owner):.3f}"
    )
    print(
        f"an episode written through the gate: role median {median(write_role) * 1000:.2f} ms, owner "
        f"{median(write_owner) * 1000:.2f} ms; ratio role / owner: {median(write_role) / median(write_owner):.3f}"
    )
    print(
        f"search tool call over HTTP: median {median(http) * 1000:.2f} ms; over stdio: median "
        f"{median(stdio) * 1000:.2f} ms"
    )
    print(f"ratio HTTP / stdio (goal <= 1.5): {median(http) / median(stdio):.2f}")
    print(
        f"{args.clients} HTTP clients of 10 agents for {args.seconds:.0f} s: {len(times)} calls, {errors} errors, "
        f"{foreign} answers out of scope, p50 {percentile(times, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(times, 0.99) * 1000:.1f} ms; meanwhile {slow} connection(s) without headers opened from "
        "another address"
    )


if __name__ == "__main__":
    main()
